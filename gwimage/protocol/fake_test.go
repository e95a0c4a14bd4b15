package protocol

import (
	"context"
	"fmt"
	"sync"

	"github.com/natgw/natgw/nat"
)

// fakeDP is the in-memory test double for the protocol's unit tests: it plans
// every call on a nat.State (so validation and conflicts are the real ones)
// and holds no kernel state. Tests with the real backends live in
// gwimage/cmd/natgw.
type fakeDP struct {
	mu      sync.Mutex
	st      *nat.State
	boot    string
	reloads int
	fail    error // returned by the next mutating call, then cleared
	calls   []string
	block   chan struct{} // when set, mutating calls wait for it
}

func newFakeDP() *fakeDP { return &fakeDP{st: nat.NewState(), boot: "boot-1"} }

func (f *fakeDP) Name() string { return "fake" }

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
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.st.PlanApply(objs)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	c.Commit()
	return nil
}

func (f *fakeDP) Delete(ctx context.Context, uids ...string) error {
	if err := f.take("delete"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.PlanDelete(uids).Commit()
	return nil
}

func (f *fakeDP) List(ctx context.Context) ([]nat.Object, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st.Objects(), nil
}

func (f *fakeDP) Sync(ctx context.Context, desired []nat.Object) error {
	if err := f.take("sync"); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.st.PlanSync(desired)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	c.Commit()
	return nil
}

func (f *fakeDP) Reload(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloads++
	return nil
}

func (f *fakeDP) BootID() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.boot
}

func (f *fakeDP) Close() error { return nil }

var _ nat.Dataplane = (*fakeDP)(nil)
