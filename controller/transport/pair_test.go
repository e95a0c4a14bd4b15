package transport

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
)

// fakeAgent is a Session for the Pair's own logic: it records calls and
// fails them with err when set.
type fakeAgent struct {
	mu    sync.Mutex
	calls []string
	err   error
	boot  string
	done  chan struct{}
	// gate, when set, holds every change until it is closed.
	gate chan struct{}
}

func newFakeAgent(boot string) *fakeAgent { return &fakeAgent{boot: boot, done: make(chan struct{})} }

func (f *fakeAgent) rec(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op)
	return f.err
}
func (f *fakeAgent) change(op string) error {
	if f.gate != nil {
		<-f.gate
	}
	return f.rec(op)
}
func (f *fakeAgent) Apply(_ context.Context, objs ...nat.Object) error {
	op := "apply"
	for _, o := range objs {
		op += " " + o.UID
	}
	return f.change(op)
}
func (f *fakeAgent) Delete(_ context.Context, uids ...string) error {
	return f.change("delete " + strings.Join(uids, " "))
}
func (f *fakeAgent) Sync(_ context.Context, d []nat.Object) error { return f.change("sync") }
func (f *fakeAgent) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}
func (f *fakeAgent) List(_ context.Context, fresh bool) ([]nat.Object, error) {
	return nil, f.rec("list")
}
func (f *fakeAgent) Info(context.Context) (*agentapi.Info, error) {
	return &agentapi.Info{BootID: f.boot, Dataplane: "nftables"}, f.rec("info")
}
func (f *fakeAgent) Done() <-chan struct{} { return f.done }
func (f *fakeAgent) Err() error            { return nil }
func (f *fakeAgent) Close() error          { return nil }
func (f *fakeAgent) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// TestPairChange: the Pair's result rules, table-driven: with an active
// known, its result is the call's and a standby's failure marks the
// standby behind and ends the Pair (the caller reconnects and catches it
// up); with none known, every replica must succeed; an active that is not
// a member fails the call naming it. Reads go to the primary; the boot id
// joins both replicas'.
func TestPairChange(t *testing.T) {
	boom := errors.New("boom")
	for _, tc := range []struct {
		name       string
		active     string
		failA      bool // vpc-nat-gw-g-0
		failB      bool // vpc-nat-gw-g-1
		wantErr    string
		wantEnded  bool
		wantBehind bool
	}{
		{name: "both succeed, a active", active: "vpc-nat-gw-g-0"},
		{name: "both succeed, none active"},
		{name: "standby fails", active: "vpc-nat-gw-g-0", failB: true, wantEnded: true, wantBehind: true},
		{name: "active fails", active: "vpc-nat-gw-g-0", failA: true, wantErr: "replica vpc-nat-gw-g-0: boom"},
		{name: "active b fails, standby a fine", active: "vpc-nat-gw-g-1", failB: true, wantErr: "replica vpc-nat-gw-g-1: boom"},
		{name: "none active, one fails", failB: true, wantErr: "replica vpc-nat-gw-g-1: boom"},
		{name: "active not reached", active: "vpc-nat-gw-g-7", wantErr: "the active replica vpc-nat-gw-g-7 is not reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeAgent("ba"), newFakeAgent("bb")
			if tc.failA {
				a.fail(boom)
			}
			if tc.failB {
				b.fail(boom)
			}
			// Given out of order: the Pair sorts by pod name.
			p, err := NewPair(Endpoint{Name: "g"}, []Member{{Pod: "vpc-nat-gw-g-1", Session: b}, {Pod: "vpc-nat-gw-g-0", Session: a}}, tc.active, testlog.New(t, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			err = p.Apply(context.Background(), nat.Object{UID: "x"})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("apply: %v, want success", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("apply: %v, want an error holding %q", err, tc.wantErr)
			}
			// The standby's call may come after Apply returned.
			_ = p.Flush(context.Background())
			for name, f := range map[string]*fakeAgent{"a": a, "b": b} {
				if calls := f.recorded(); len(calls) != 1 || calls[0] != "apply x" {
					t.Errorf("replica %s calls %v, want one apply", name, calls)
				}
			}
			select {
			case <-p.Done():
				if !tc.wantEnded {
					t.Errorf("pair ended: %v", p.Err())
				} else if !strings.Contains(p.Err().Error(), "standby replica vpc-nat-gw-g-1") {
					t.Errorf("pair ended with %v, want the standby named", p.Err())
				}
			default:
				if tc.wantEnded {
					t.Error("pair not ended after a standby missed a change")
				}
			}
			if behind := p.StandbyLag() > 0; behind != tc.wantBehind {
				time.Sleep(time.Millisecond)
				if behind = p.StandbyLag() > 0; behind != tc.wantBehind {
					t.Errorf("standby lag %s, want behind=%t", p.StandbyLag(), tc.wantBehind)
				}
			}
		})
	}
	t.Run("reads and boot id", func(t *testing.T) {
		a, b := newFakeAgent("ba"), newFakeAgent("bb")
		p, err := NewPair(Endpoint{Name: "g"}, []Member{{Pod: "vpc-nat-gw-g-0", Session: a}, {Pod: "vpc-nat-gw-g-1", Session: b}}, "vpc-nat-gw-g-1", testlog.New(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		info, err := p.Info(context.Background())
		if err != nil || info.BootID != "vpc-nat-gw-g-0=ba,vpc-nat-gw-g-1=bb" {
			t.Fatalf("info %+v, %v; want both boot ids joined", info, err)
		}
		if _, err := p.List(context.Background(), true); err != nil {
			t.Fatal(err)
		}
		if len(a.calls) != 1 || len(b.calls) != 2 || b.calls[1] != "list" {
			t.Errorf("calls a %v b %v, want the list on the active b only", a.calls, b.calls)
		}
		// A replica's session that ends ends the Pair.
		close(a.done)
		select {
		case <-p.Done():
			if !strings.Contains(p.Err().Error(), "replica vpc-nat-gw-g-0") {
				t.Errorf("ended with %v, want the replica named", p.Err())
			}
		case <-time.After(5 * time.Second):
			t.Fatal("pair not ended after a replica's session ended")
		}
	})
}

// TestPairStandbyAfterActive: with an active known, a change returns
// when the active carried it out, not waiting for a standby held up
// (Ready is the active's, as for one replica); the standby gets the
// changes afterwards in the order they were made, counts as behind only
// once a change waited StandbyBehindAfter, and Flush waits for it. With
// none active, a call waits for every replica.
func TestPairStandbyAfterActive(t *testing.T) {
	ctx := context.Background()
	p, a, b := heldPair(t, "vpc-nat-gw-g-0")
	defer p.Close()
	steps := []func() error{
		func() error { return p.Apply(ctx, nat.Object{UID: "x"}) },
		func() error { return p.Delete(ctx, "x") },
		func() error { return p.Apply(ctx, nat.Object{UID: "x"}, nat.Object{UID: "y"}) },
		func() error { return p.Sync(ctx, nil) },
	}
	want := []string{"apply x", "delete x", "apply x y", "sync"}
	for i, step := range steps {
		done := make(chan error, 1)
		go func() { done <- step() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("step %d (%s) waited for the held standby", i, want[i])
		}
	}
	if got := a.recorded(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("active calls %q, want %q", got, want)
	}
	if got := b.recorded(); len(got) != 0 {
		t.Fatalf("held standby carried out %q", got)
	}
	if lag := p.StandbyLag(); lag != 0 {
		t.Errorf("standby lag %s with changes queued under %s, want 0", lag, StandbyBehindAfter)
	}
	fctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := p.Flush(fctx); err == nil || !strings.Contains(err.Error(), "4 changes still to reach the standbys") {
		t.Errorf("flush with the standby held: %v, want 4 changes pending", err)
	}
	cancel()
	time.Sleep(StandbyBehindAfter + 50*time.Millisecond)
	if lag := p.StandbyLag(); lag < StandbyBehindAfter {
		t.Errorf("standby lag %s with a change queued for over %s, want behind", lag, StandbyBehindAfter)
	}
	close(b.gate)
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := b.recorded(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("standby calls %q, want %q in the order they were made", got, want)
	}
	if lag := p.StandbyLag(); lag != 0 {
		t.Errorf("standby lag %s after it caught up, want 0", lag)
	}
	select {
	case <-p.Done():
		t.Fatalf("pair ended: %v", p.Err())
	default:
	}

	// None active: the call waits for every replica.
	q, _, d := heldPair(t, "")
	defer q.Close()
	done := make(chan error, 1)
	go func() { done <- q.Apply(ctx, nat.Object{UID: "z"}) }()
	select {
	case err := <-done:
		t.Fatalf("apply returned (%v) before a replica carried it out with none active", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(d.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPairCatchUp: with a replica holding the Lease, the standby is synced
// from the active's fresh list; with none holding it, nothing is read or
// synced (both pods may be new: a sync from pod -0's empty table would
// give the standby its sync mark for nothing); a single replica needs no
// catch-up; an active that is not a member fails naming it.
func TestPairCatchUp(t *testing.T) {
	for _, tc := range []struct {
		name         string
		active       string
		single       bool
		wantA, wantB string // the calls of vpc-nat-gw-g-0 and -1
		wantErr      string
	}{
		{name: "-0 active", active: "vpc-nat-gw-g-0", wantA: "list", wantB: "sync"},
		{name: "-1 active", active: "vpc-nat-gw-g-1", wantA: "sync", wantB: "list"},
		{name: "no Lease holder", active: ""},
		{name: "single replica", active: "vpc-nat-gw-g-0", single: true},
		{name: "active not reached", active: "vpc-nat-gw-g-7", wantErr: "the active replica vpc-nat-gw-g-7 is not reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeAgent("ba"), newFakeAgent("bb")
			ms := []Member{{Pod: "vpc-nat-gw-g-1", Session: b}, {Pod: "vpc-nat-gw-g-0", Session: a}}
			if tc.single {
				ms = ms[1:]
			}
			p, err := NewPair(Endpoint{Name: "g"}, ms, tc.active, testlog.New(t, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			err = p.CatchUp(context.Background())
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("catch-up: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("catch-up: %v, want an error holding %q", err, tc.wantErr)
			}
			if got := strings.Join(a.calls, " "); got != tc.wantA {
				t.Errorf("vpc-nat-gw-g-0 calls %q, want %q", got, tc.wantA)
			}
			if got := strings.Join(b.calls, " "); got != tc.wantB {
				t.Errorf("vpc-nat-gw-g-1 calls %q, want %q", got, tc.wantB)
			}
		})
	}
}

// TestExecPair drives two real agents, one per "pod" (a network
// namespace each, behind the pod-exec stand-in), through the exec
// transport's two-replica path: pods carrying ReplicasAnnotation "2" get
// `serve --rules-only`; a FIP applied through the Pair is in both
// namespaces' tables; a replica that lost its state (a new pod) is
// brought in step with the active by the next Open before it returns; the
// Lease holder is the active; a change of the running pods ends the Pair.
func TestExecPair(t *testing.T) {
	lab := netlab.ForTest(t)
	bin := buildNatgw(t)
	var nss []string
	for _, n := range []string{"pa", "pb"} {
		gw, err := lab.Gateway(netlab.GatewayOptions{Name: n, VMs: 1})
		if err != nil {
			t.Fatal(err)
		}
		nss = append(nss, gw.GW)
	}
	pods := []string{"vpc-nat-gw-gw1-0", "vpc-nat-gw-gw1-1"}
	kubelet := &podExecServer{t: t, bin: bin, nsOf: map[string]string{pods[0]: nss[0], pods[1]: nss[1]}, done: make(chan error, 16)}
	srv := httptest.NewServer(kubelet)
	defer srv.Close()
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: types.UID(uid),
				Labels:      map[string]string{"app": GatewayAppPrefix + "gw1", GatewayPodLabel: "true"},
				Annotations: map[string]string{ReplicasAnnotation: "2"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: GatewayContainer, Ready: true}}},
		}
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-gw1", Namespace: "kube-system"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(pods[0])}}
	cs := fake.NewClientset(pod(pods[0], "u0"), pod(pods[1], "u1"), lease)
	tr := &Exec{Config: &rest.Config{Host: srv.URL}, Client: cs, Namespace: "kube-system", Log: testlog.New(t, 0)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	target := Endpoint{Name: "gw1", Dataplane: nat.DataplaneNftables}

	s, err := tr.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := s.(*Pair)
	if !ok || strings.Join(p.Members(), " ") != strings.Join(pods, " ") || p.Active() != pods[0] {
		t.Fatalf("Open gave %T (members %v, active %q), want a Pair of both pods, %s active", s, p.Members(), p.Active(), pods[0])
	}
	kubelet.mu.Lock()
	reqs := append([]string(nil), kubelet.reqs...)
	kubelet.mu.Unlock()
	for _, r := range reqs {
		if !strings.HasSuffix(r, "vpc-nat-gw natgw serve --dataplane nftables --rules-only --synced-file "+agentapi.RulesSyncedFile) {
			t.Errorf("exec request %q, want serve --rules-only --synced-file in the gateway container", r)
		}
	}
	// Open caught the standby up with a sync: it left its mark for its
	// natgw-ha (the active's comes with the controller's first sync).
	if _, err := os.Stat(kubelet.podFile(pods[1], agentapi.RulesSyncedFile)); err != nil {
		t.Errorf("standby %s: no sync mark after Open: %v", pods[1], err)
	}
	_, fip := infoAndFIP(ctx, t, s, nat.DataplaneNftables, netlab.VMAddr(0))
	inTable := func(i int) bool {
		rs, err := netlab.NftRuleset(ctx, nss[i])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(rs, netlab.EIP(0).String())
	}
	for i := range pods {
		if !inTable(i) {
			t.Fatalf("pod %s's table lacks the FIP's EIP after an apply through the Pair", pods[i])
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// The standby loses its state (as a new pod would): the next Open
	// syncs it from the active before returning.
	lone, err := tr.openPod(ctx, target, pod(pods[1], "u1"), true)
	if err != nil {
		t.Fatal(err)
	}
	if err := lone.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	_ = lone.Close()
	if inTable(1) {
		t.Fatal("the standby still holds the FIP after an empty sync")
	}
	s, err = tr.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !inTable(1) {
		t.Fatal("Open returned before the standby was brought in step with the active")
	}
	if objs, err := s.List(ctx, true); err != nil || len(objs) != 1 || !objs[0].Equal(fip) {
		t.Fatalf("list = %v, %v; want the FIP", objs, err)
	}

	// The Lease changes holder: the Pair follows; a pod recreated under
	// its name (another UID) ends the Pair.
	lease.Spec.HolderIdentity = ptr.To(pods[1])
	if _, err := cs.CoordinationV1().Leases("kube-system").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.(*Pair).Active() != pods[1] {
		if time.Now().After(deadline) {
			t.Fatalf("active %q 10 s after the Lease moved, want %s", s.(*Pair).Active(), pods[1])
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cs.CoreV1().Pods("kube-system").Delete(ctx, pods[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("kube-system").Create(ctx, pod(pods[0], "u2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
		if !strings.Contains(s.Err().Error(), "running pods changed") {
			t.Errorf("pair ended with %v, want the pod change named", s.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pair not ended 10 s after a pod was recreated")
	}
}

// TestPairFlushWaits: concurrent Flushes while changes are queued for a
// held standby block (none returns before the standby got every change
// made before it), all return once the queue drained, a Flush with
// nothing queued returns at once, and a Flush waiting when the Pair ends
// returns its error. Run with -race.
func TestPairFlushWaits(t *testing.T) {
	ctx := context.Background()
	p, _, b := heldPair(t, "vpc-nat-gw-g-0")
	defer p.Close()
	if err := p.Flush(ctx); err != nil {
		t.Fatalf("flush with nothing queued: %v", err)
	}
	const changes, flushers = 20, 8
	for i := range changes {
		if err := p.Apply(ctx, nat.Object{UID: fmt.Sprint("u", i)}); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan int, flushers) // the standby's calls when a Flush returned
	errs := make(chan error, flushers)
	for range flushers {
		go func() {
			err := p.Flush(ctx)
			got <- len(b.recorded())
			errs <- err
		}()
	}
	select {
	case n := <-got:
		t.Fatalf("a flush returned (%v) with the standby held, %d calls carried out", <-errs, n)
	case <-time.After(100 * time.Millisecond):
	}
	close(b.gate)
	for range flushers {
		select {
		case n := <-got:
			if err := <-errs; err != nil || n != changes {
				t.Errorf("flush returned %v with %d of %d changes on the standby", err, n, changes)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a flush did not return after the standby caught up")
		}
	}

	// A Flush waiting when the Pair ends returns the end's error.
	q, c, d := heldPair(t, "vpc-nat-gw-g-0")
	defer close(d.gate)
	if err := q.Apply(ctx, nat.Object{UID: "x"}); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { ended <- q.Flush(ctx) }()
	time.Sleep(20 * time.Millisecond)
	close(c.done) // a replica's session ends: the Pair ends
	select {
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "replica vpc-nat-gw-g-0") {
			t.Errorf("flush after the end: %v, want the replica named", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("flush did not return after the Pair ended")
	}
	q.Close()
}

// heldPair returns a Pair of two fake replicas, vpc-nat-gw-g-0 (a) and
// vpc-nat-gw-g-1 (b, its changes held until b.gate is closed), with active
// holding the Lease ("" none).
func heldPair(t *testing.T, active string) (p *Pair, a, b *fakeAgent) {
	t.Helper()
	a, b = newFakeAgent("ba"), newFakeAgent("bb")
	b.gate = make(chan struct{})
	p, err := NewPair(Endpoint{Name: "g"}, []Member{{Pod: "vpc-nat-gw-g-0", Session: a}, {Pod: "vpc-nat-gw-g-1", Session: b}}, active, testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	return p, a, b
}

// TestColdStartSync: a Pair asks for a sync at a cold start, a session
// that does not answer ColdStartSyncer (one agent) does not.
func TestColdStartSync(t *testing.T) {
	p, err := NewPair(Endpoint{Name: "g"}, []Member{{Pod: "vpc-nat-gw-g-0", Session: newFakeAgent("ba")}}, "", testlog.New(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !ColdStartSync(p) {
		t.Error("ColdStartSync(Pair) = false, want true")
	}
	if ColdStartSync(newFakeAgent("boot")) {
		t.Error("ColdStartSync(one agent's session) = true, want false")
	}
}
