package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/nat"
)

// TestFence: one holder at a time; renewal by the holder; takeover only
// after expiry; release frees it at once; bad holders are refused. For the
// file fence and the socket arbiter alike; a corrupt lease file and an
// arbiter that is gone are errors, not ErrHeld.
func TestFence(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "lease")
	sock := filepath.Join(t.TempDir(), "arbiter.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = (&Arbiter{}).Serve(actx, ln) }()
	for _, f := range []Fence{FileFence{Path: path}, SocketFence{Path: sock}} {
		t.Run(fmt.Sprintf("%T", f), func(t *testing.T) { fenceSteps(t, f) })
	}
	stop()
	<-done
	if err := (SocketFence{Path: sock}).Acquire(ctx, "a", time.Second); err == nil || errors.Is(err, ErrHeld) {
		t.Fatalf("arbiter gone: %v, want an error that is not ErrHeld", err)
	}
	if err := os.WriteFile(path, []byte("garbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (FileFence{Path: path}).Acquire(ctx, "a", time.Second); err == nil || !strings.Contains(err.Error(), "garbage") {
		t.Fatalf("corrupt lease: %v, want an error naming the content", err)
	}
}

func fenceSteps(t *testing.T, f Fence) {
	ctx := context.Background()
	const ttl = 500 * time.Millisecond // steps take far less, even on a busy machine
	steps := []struct {
		what    string
		do      func() error
		wantErr error // nil: success; errAny: any error
	}{
		{"a acquires", func() error { return f.Acquire(ctx, "a", ttl) }, nil},
		{"b is refused", func() error { return f.Acquire(ctx, "b", ttl) }, ErrHeld},
		{"a renews", func() error { return f.Acquire(ctx, "a", ttl) }, nil},
		{"b release is a no-op", func() error { return f.Release(ctx, "b") }, nil},
		{"b still refused", func() error { return f.Acquire(ctx, "b", ttl) }, ErrHeld},
		{"after expiry b acquires", func() error { time.Sleep(ttl + 20*time.Millisecond); return f.Acquire(ctx, "b", ttl) }, nil},
		{"a is refused", func() error { return f.Acquire(ctx, "a", ttl) }, ErrHeld},
		{"b releases", func() error { return f.Release(ctx, "b") }, nil},
		{"a acquires at once", func() error { return f.Acquire(ctx, "a", ttl) }, nil},
		{"holder with a blank", func() error { return f.Acquire(ctx, "a b", ttl) }, errAny},
		{"empty holder", func() error { return f.Acquire(ctx, "", ttl) }, errAny},
	}
	for _, s := range steps {
		err := s.do()
		switch {
		case s.wantErr == nil && err != nil:
			t.Fatalf("%s: %v", s.what, err)
		case s.wantErr == errAny && err == nil:
			t.Fatalf("%s: no error", s.what)
		case s.wantErr != nil && s.wantErr != errAny && !errors.Is(err, s.wantErr):
			t.Fatalf("%s: %v, want %v", s.what, err, s.wantErr)
		}
	}
	// A refusal says until when the lease runs (a *HeldError), so that
	// a standby asks again exactly then: a's lease from the last step.
	before := time.Now()
	err := f.Acquire(ctx, "b", ttl)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder != "a" || !held.Until.After(before) || held.Until.After(before.Add(ttl)) {
		t.Fatalf("refusal %v: want a HeldError of a until within %s of %s", err, ttl, before.Format(time.RFC3339Nano))
	}
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("refusal %v is not ErrHeld", err)
	}
}

var errAny = errors.New("any error")

// TestBeat round-trips heartbeats and refuses what is not one.
func TestBeat(t *testing.T) {
	for _, b := range []beat{{Role: RoleActive, Healthy: true, Synced: true, Seq: 1}, {Role: RoleStandby, Seq: 1<<63 + 5}} {
		got, err := parseBeat(b.marshal())
		if err != nil || got != b {
			t.Fatalf("round trip of %+v: %+v, %v", b, got, err)
		}
	}
	good := beat{Role: RoleActive, Seq: 1}.marshal()
	for _, c := range []struct {
		what string
		p    []byte
		want string
	}{
		{"short", good[:10], "not a heartbeat"},
		{"magic", append([]byte("XXXX"), good[4:]...), "not a heartbeat"},
		{"version", func() []byte { p := append([]byte{}, good...); p[4] = 9; return p }(), "version 9"},
		{"role", func() []byte { p := append([]byte{}, good...); p[5] = 7; return p }(), "role 7"},
	} {
		if _, err := parseBeat(c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.what, err, c.want)
		}
	}
}

// TestConfig refuses bad configurations naming the field and the value.
func TestConfig(t *testing.T) {
	ok := func() Config {
		return Config{ID: "a", Local: netip.MustParseAddrPort("10.0.0.2:7400"), Peer: netip.MustParseAddrPort("10.0.0.3:7400"), Fence: FileFence{Path: "/nonexistent"}}
	}
	c := ok()
	if err := c.defaults(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	if c.Interval != 50*time.Millisecond || c.Misses != 3 || c.LeaseTTL != 175*time.Millisecond {
		t.Fatalf("defaults: interval %s misses %d lease %s", c.Interval, c.Misses, c.LeaseTTL)
	}
	// The default lease is the detection interval (never under three
	// intervals) plus the half-interval step-down margin.
	for _, tc := range []struct {
		interval time.Duration
		misses   int
		want     time.Duration
	}{
		{50 * time.Millisecond, 3, 175 * time.Millisecond},
		{100 * time.Millisecond, 5, 550 * time.Millisecond},
		{50 * time.Millisecond, 1, 175 * time.Millisecond},
		{50 * time.Millisecond, 2, 175 * time.Millisecond},
	} {
		c := ok()
		c.Interval, c.Misses = tc.interval, tc.misses
		if err := c.defaults(); err != nil || c.LeaseTTL != tc.want {
			t.Errorf("interval %s misses %d: lease %s (%v), want %s", tc.interval, tc.misses, c.LeaseTTL, err, tc.want)
		}
	}
	c = ok()
	c.EIPs = []netip.Prefix{netip.MustParsePrefix("192.0.2.10/24"), netip.MustParsePrefix("2001:db8:2::10/64")}
	c.LanIPs = []netip.Prefix{netip.MustParsePrefix("198.51.100.1/24"), netip.MustParsePrefix("2001:db8:100::1/64")}
	if err := c.defaults(); err != nil {
		t.Fatalf("dual-stack floating addresses: %v", err)
	}
	c = ok()
	c.Peer = netip.AddrPort{} // not known yet (SetPeer)
	if err := c.defaults(); err != nil {
		t.Fatalf("config without a peer: %v", err)
	}
	for _, tc := range []struct {
		what string
		mod  func(*Config)
		want string
	}{
		{"no id", func(c *Config) { c.ID = "" }, "id"},
		{"no local", func(c *Config) { c.Local = netip.AddrPort{} }, "local"},
		{"peer without port", func(c *Config) { c.Peer = netip.MustParseAddrPort("10.0.0.3:0") }, `peer "10.0.0.3:0"`},
		{"interval", func(c *Config) { c.Interval = 2 * time.Second }, "interval 2s"},
		{"misses", func(c *Config) { c.Misses = -1 }, "misses -1"},
		{"lease", func(c *Config) { c.Interval = 100 * time.Millisecond; c.LeaseTTL = 50 * time.Millisecond }, "leaseTTL 50ms"},
		{"lease of 2.9 intervals", func(c *Config) { c.LeaseTTL = 145 * time.Millisecond }, "leaseTTL 145ms: want at least 3 × the interval 50ms (150ms)"},
		{"fence", func(c *Config) { c.Fence = nil }, "fence"},
		{"v4-mapped eip", func(c *Config) { c.EIPs = []netip.Prefix{netip.MustParsePrefix("::ffff:192.0.2.1/120")} }, "::ffff:192.0.2.1/120"},
		{"zero lanIp", func(c *Config) { c.LanIPs = []netip.Prefix{{}} }, "floating address"},
		{"loopback eip", func(c *Config) { c.EIPs = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")} }, `"127.0.0.1/8": invalid address "127.0.0.1": not a unicast address`},
		{"link-local lanIp", func(c *Config) { c.LanIPs = []netip.Prefix{netip.MustParsePrefix("fe80::1/64")} }, `"fe80::1/64": invalid address "fe80::1": a link-local IPv6 address`},
	} {
		c := ok()
		tc.mod(&c)
		if err := c.defaults(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.what, err, tc.want)
		}
	}
}

// TestRulesSyncedFile: not ready (naming the path) until the mark exists,
// ready once it does, and still ready after the mark is gone: once seen
// it is not looked at again (it never goes away within a pod's life, and
// RulesReady runs every heartbeat). A second gate on the same path has
// its own memory.
func TestRulesSyncedFile(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "rules-synced")
	ready := RulesSyncedFile(mark)
	for _, step := range []struct {
		what    string
		do      func() error
		wantErr string // "" ready
	}{
		{"no mark yet", nil, "no sync yet: " + mark},
		{"still none", nil, "does not exist"},
		{"mark written", func() error { return os.WriteFile(mark, []byte("synced\n"), 0o644) }, ""},
		{"mark removed: not looked at again", func() error { return os.Remove(mark) }, ""},
	} {
		if step.do != nil {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
		}
		err := ready()
		switch {
		case step.wantErr == "" && err != nil:
			t.Errorf("%s: %v, want ready", step.what, err)
		case step.wantErr != "" && (err == nil || !strings.Contains(err.Error(), step.wantErr)):
			t.Errorf("%s: %v, want an error holding %q", step.what, err, step.wantErr)
		}
	}
	if err := RulesSyncedFile(mark)(); err == nil {
		t.Error("a new gate on the removed mark is ready, want not ready")
	}
}

// TestKeptByPeer: an active whose lease is about to run out keeps
// answering only while its peer's last beat said standby and came late
// enough (keepUntil: this replica's last beat before it + the detection
// interval, less the next turn's call and a spare) and its own beats went
// out without a stall; not after a stall of its own (SIGSTOP: buffered
// beats read late look fresh), not when the peer says active or was never
// heard, not with fewer than 3 misses. Own beats every 50 ms, the last
// lastBeatAgo before now.
func TestKeptByPeer(t *testing.T) {
	const iv = 50 * time.Millisecond
	now := time.Unix(1000, 0)
	standby := beat{Role: RoleStandby, Seq: 7}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name        string
		misses      int
		heardAgo    time.Duration
		pb          beat
		lastBeatAgo time.Duration
		stalledAgo  time.Duration // 0: never
		want        bool
	}{
		{"peer standby, heard fresh", 3, ms(50), standby, ms(25), 0, true},
		{"heard 100 ms ago: own beat before it 125 ms ago, until +2.5 ms", 3, ms(100), standby, ms(25), 0, true},
		{"heard 130 ms ago: own beat before it 175 ms ago", 3, ms(130), standby, ms(25), 0, false},
		{"peer says active", 3, ms(10), beat{Role: RoleActive, Seq: 7}, ms(25), 0, false},
		{"peer never heard", 3, ms(10), beat{}, ms(25), 0, false},
		{"own beat overdue past the stall gap", 3, ms(10), standby, ms(110), 0, false},
		{"own beats stalled within the detection interval", 3, ms(10), standby, ms(25), ms(100), false},
		{"own beats stalled before it", 3, ms(10), standby, ms(25), ms(200), true},
		{"2 misses: off", 2, ms(10), standby, ms(25), 0, false},
		{"5 misses: heard 200 ms ago", 5, ms(200), standby, ms(25), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Replica{cfg: Config{Interval: iv, Misses: tc.misses}}
			for k := 15; k >= 0; k-- {
				r.recordBeat(now.Add(-tc.lastBeatAgo - time.Duration(k)*iv))
			}
			if tc.stalledAgo != 0 {
				r.irregularAt.Store(now.Add(-tc.stalledAgo).UnixNano())
			}
			seen := now.Add(-tc.heardAgo)
			if got := r.keptByPeer(now, seen, tc.pb); got != tc.want {
				t.Fatalf("keptByPeer = %t, want %t (keepUntil now%+v)", got, tc.want, r.keepUntil(seen).Sub(now))
			}
		})
	}
}

// TestFloatingNatRule: a floating address is refused exactly when nat
// refuses it as an address a gateway programs (nat.CheckUnicast), with
// nat's error.
func TestFloatingNatRule(t *testing.T) {
	for _, s := range []string{"192.0.2.10/24", "2001:db8::10/64", "127.0.0.1/8", "0.0.0.0/0", "224.0.0.1/4", "255.255.255.255/32", "::1/128", "fe80::1/64", "ff02::1/16", "::ffff:192.0.2.1/120"} {
		p := netip.MustParsePrefix(s)
		err, want := checkFloating(p), nat.CheckUnicast("address", p.Addr())
		var fe, wantFE *nat.FieldError
		if (err == nil) != (want == nil) || want != nil && (!errors.As(err, &fe) || !errors.As(want, &wantFE) || *fe != *wantFE) {
			t.Errorf("%s: %v, want nat's %v", s, err, want)
		}
	}
}
