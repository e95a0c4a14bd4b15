package agentapi

import (
	"context"
	"sync"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/natfake"
)

// fakeDP is the protocol tests' data plane: natfake's in-memory Dataplane
// (the engine's real validation and conflicts, no kernel) plus what these
// tests watch: the calls the server made, reloads, an error for the next
// mutating call, and a gate that holds mutating calls. Tests with the real
// backends live in gwimage/cmd/natgw.
type fakeDP struct {
	*natfake.Dataplane

	mu      sync.Mutex
	reloads int
	fail    error // returned by the next mutating call, then cleared
	calls   []string
	block   chan struct{} // when set, mutating calls wait for it
}

func newFakeDP() *fakeDP {
	d, err := natfake.Over(natfake.NewBackend("fake", "boot-1"))
	if err != nil {
		panic(err) // an in-memory Backend with a boot id cannot fail to load
	}
	return &fakeDP{Dataplane: d}
}

func (f *fakeDP) take(op string) error {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op)
	err := f.fail
	f.fail = nil
	return err
}

func (f *fakeDP) Apply(ctx context.Context, objs ...nat.Object) error {
	if err := f.take("apply"); err != nil {
		return err
	}
	return f.Dataplane.Apply(ctx, objs...)
}

func (f *fakeDP) Delete(ctx context.Context, uids ...string) error {
	if err := f.take("delete"); err != nil {
		return err
	}
	return f.Dataplane.Delete(ctx, uids...)
}

func (f *fakeDP) Sync(ctx context.Context, desired []nat.Object) error {
	if err := f.take("sync"); err != nil {
		return err
	}
	return f.Dataplane.Sync(ctx, desired)
}

func (f *fakeDP) Reload(ctx context.Context) error {
	f.mu.Lock()
	f.reloads++
	f.mu.Unlock()
	return f.Dataplane.Reload(ctx)
}

var _ nat.Dataplane = (*fakeDP)(nil)
