package nattest

import (
	"bufio"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// ShareConnsEnv names the environment variable that sets how many new TCP
// connections the share DNAT spread test makes per backend count (default
// DefaultShareConns).
const ShareConnsEnv = "NATGW_SHARE_CONNS"

// DefaultShareConns is the figure: 10,000 new connections per
// backend count.
const DefaultShareConns = 10_000

// shareBackendCounts are the backend counts of the spread test.
var shareBackendCounts = []int{1, 2, 8, 64}

// shareConns returns the connection count of the spread test.
func shareConns(t *testing.T) int {
	v := os.Getenv(ShareConnsEnv)
	if v == "" {
		return DefaultShareConns
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 100 {
		t.Fatalf("%s=%q: want a number of at least 100", ShareConnsEnv, v)
	}
	return n
}

// shareTolerance is how far one backend's count of conns new connections
// over n backends may be from even (conns/n): 10% of even (the issue's
// bound), or 5 standard deviations of the binomial count when that is
// wider. A fair random spread over 64 backends cannot keep all of them
// within 10% at 10,000 connections (156 each, σ≈12.4: 10% is 1.3σ, and
// 64 such draws all within it has probability ~1e-6), so the test holds
// every backend to what a fair spread keeps with near certainty, and still
// fails a skewed one (a backend with none, or twice its share).
func shareTolerance(conns, n int) float64 {
	even := float64(conns) / float64(n)
	p := 1 / float64(n)
	return math.Max(0.10*even, 5*math.Sqrt(float64(conns)*p*(1-p)))
}

// shareBackend is backend i of a share identity of family f in the test
// topology: VPC host i%len(VMs) (its address of f), port 10000+i.
func (e *env) shareBackend(f family, i int) netip.AddrPort {
	vm := f.host(e.gw.VMs[i%len(e.gw.VMs)])
	return netip.AddrPortFrom(vm.Addr, uint16(10000+i))
}

// serveShareBackends starts a TCP probe server for backends 0..n-1 of
// family f (IPv4: on the wildcard; IPv6: on the host's IPv6 address).
func (e *env) serveShareBackends(f family, n int) {
	e.t.Helper()
	for i := range n {
		b := e.shareBackend(f, i)
		listen := b
		if !f.v6 {
			listen = netip.AddrPortFrom(netip.IPv4Unspecified(), b.Port())
		}
		if _, err := e.lab.ServeTCP(e.ctx, e.gw.VMs[i%len(e.gw.VMs)].NS, listen.String()); err != nil {
			e.t.Fatal(err)
		}
	}
}

// backendOf returns the backend a probe reply came from: the server's
// namespace and listening port, as "ns:port" (the server is named
// "ns/address:port", the address of either family).
func backendOf(r netlab.Reply) string {
	ns, addr, _ := strings.Cut(r.Server, "/")
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return fmt.Sprintf("%s:%d", ns, ap.Port())
	}
	return r.Server // not a probe server's name: matches no backend
}

func (e *env) backendName(i int) string {
	return fmt.Sprintf("%s:%d", e.gw.VMs[i%len(e.gw.VMs)].NS, 10000+i)
}

// dialMany makes conns new TCP connections from ext to dst, at most 8 at
// once, and counts them per backend (see backendOf). It fails the test on
// the first connection that fails.
func (e *env) dialMany(dst netip.AddrPort, conns int) map[string]int {
	e.t.Helper()
	const workers = 8
	var (
		mu     sync.Mutex
		counts = map[string]int{}
		errs   []error
		wg     sync.WaitGroup
		next   = make(chan struct{})
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				r, err := netlab.Dial(e.ctx, e.gw.Ext.NS, dst.String(), netlab.DialTimeout)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					counts[backendOf(r)]++
				}
				mu.Unlock()
			}
		}()
	}
	for range conns {
		mu.Lock()
		failed := len(errs) > 0
		mu.Unlock()
		if failed {
			break
		}
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("%d of %d connections to %s failed, first: %v", len(errs), conns, dst, errs[0])
	}
	return counts
}

// testShare: share DNAT, several backends on one EIP, protocol and port,
// in IPv4 and under IPv6 with the same bodies in IPv6 (a backend of
// Options.NoIPv6 refuses an IPv6 share DNAT instead: testIPv6Refused).
func (s *suite) testShare(t *testing.T) {
	cases := []familyCase{
		{"Spread", s.testShareSpread},
		{"Pinned", s.testSharePinned},
	}
	run := func(t *testing.T, f family) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { c.run(t, f) })
		}
	}
	run(t, ipv4)
	if !s.opts.NoIPv6 {
		t.Run("IPv6", func(t *testing.T) { run(t, ipv6) })
	}
}

// testShareSpread: with 1, 2, 8 and 64 backends (each set applied in one
// call), new TCP connections from outside to an EIP of family f reach
// every backend, spread evenly within shareTolerance, and none fails.
func (s *suite) testShareSpread(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	eip := f.eip(0)
	e.applyEIPs(f.eipObject(UID(nat.KindEIP, 0), eip))
	e.serveShareBackends(f, slices.Max(shareBackendCounts))
	conns := shareConns(t)
	uid := 0
	for _, n := range shareBackendCounts {
		port := uint16(3000 + n) // one identity per count
		var objs []nat.Object
		for i := range n {
			b := e.shareBackend(f, i)
			objs = append(objs, ShareDNAT(UID(nat.KindDNAT, uid), eip, nat.TCP, port, b.Addr(), b.Port()))
			uid++
		}
		e.apply(objs...)
		counts := e.dialMany(netip.AddrPortFrom(eip, port), conns)
		tol := shareTolerance(conns, n)
		even := float64(conns) / float64(n)
		lo, hi := conns, 0
		for i := range n {
			c := counts[e.backendName(i)]
			delete(counts, e.backendName(i))
			lo, hi = min(lo, c), max(hi, c)
			if math.Abs(float64(c)-even) > tol {
				t.Errorf("%d backends: backend %d (%s) got %d of %d new connections, want %.0f ± %.0f", n, i, e.backendName(i), c, conns, even, tol)
			}
		}
		if len(counts) > 0 {
			t.Errorf("%d backends: connections answered by servers that are not backends of %s:%d: %v", n, eip, port, counts)
		}
		within := math.Abs(float64(lo)-even) <= 0.1*even && math.Abs(float64(hi)-even) <= 0.1*even
		t.Logf("SHARE-SPREAD %s %s backends=%d conns=%d even=%.1f min=%d max=%d tolerance=±%.1f within-10%%=%v", e.name, f, n, conns, even, lo, hi, tol, within)
		e.del(nat.UIDs(objs)...)
	}
}

// heldConn is an open connection through a share identity and the backend
// that answered it.
type heldConn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string
}

// echo sends a line on the connection and checks that the same backend's
// server echoes it (the probe server echoes every line after the first
// exchange).
func (h heldConn) echo(msg string) error {
	if _, err := fmt.Fprintf(h.c, "%s\n", msg); err != nil {
		return fmt.Errorf("connection to %s: write: %w", h.backend, err)
	}
	line, err := h.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("connection to %s: read: %w", h.backend, err)
	}
	if strings.TrimSpace(line) != msg {
		return fmt.Errorf("connection to %s: echo %q, want %q", h.backend, line, msg)
	}
	return nil
}

// testSharePinned: established connections (to an EIP of family f) stay
// on their backend when another backend is added or removed (the echo of a
// line after the change comes back on the same connection); removing a
// backend deletes its conntrack entries only; a removed backend gets no
// new connections.
func (s *suite) testSharePinned(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	eip := f.eip(0)
	const port = 4000
	eipObj := f.eipObject(UID(nat.KindEIP, 0), eip)
	e.applyEIPs(eipObj)
	e.serveShareBackends(f, 3) // backends 0, 1, 2: one per VPC host
	dst := netip.AddrPortFrom(eip, port)
	backend := func(i int) nat.Object {
		b := e.shareBackend(f, i)
		return ShareDNAT(UID(nat.KindDNAT, i), eip, nat.TCP, port, b.Addr(), b.Port())
	}
	e.apply(backend(0), backend(1))

	// Hold connections until both backends have some.
	var held []heldConn
	on := map[string]int{}
	for len(held) < 200 && (on[e.backendName(0)] < 3 || on[e.backendName(1)] < 3) {
		c, r, err := netlab.Connect(e.ctx, e.gw.Ext.NS, dst.String(), netlab.DialTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		// Connect read the reply line through its own reader; the
		// echo starts after it, so a fresh reader is enough.
		held = append(held, heldConn{c: c, r: bufio.NewReader(c), backend: backendOf(r)})
		on[backendOf(r)]++
	}
	if on[e.backendName(0)] < 3 || on[e.backendName(1)] < 3 {
		t.Fatalf("200 connections over two backends: %v", on)
	}
	echoAll := func(what string, skip string) {
		t.Helper()
		for i, h := range held {
			if h.backend == skip {
				continue
			}
			if err := h.echo(fmt.Sprintf("%s %d", strings.ReplaceAll(what, " ", "-"), i)); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	}
	echoAll("before any change", "")

	// A third backend: established connections keep theirs.
	e.apply(backend(2))
	echoAll("after adding a backend", "")
	counts := e.dialMany(dst, 300)
	for i := range 3 {
		if counts[e.backendName(i)] == 0 {
			t.Errorf("after adding backend 2, 300 new connections: none to backend %d (%v)", i, counts)
		}
	}

	// Remove backend 0: its flows go, the others' stay and keep flowing.
	e.wantFlows("before removing backend 0", e.shareBackend(f, 0).Addr())
	e.del(backend(0).UID)
	e.wantNoFlows("after removing backend 0", e.shareBackend(f, 0).Addr())
	e.wantFlows("after removing backend 0, backend 1's connections", e.shareBackend(f, 1).Addr())
	echoAll("after removing backend 0", e.backendName(0))
	counts = e.dialMany(dst, 300)
	if n := counts[e.backendName(0)]; n > 0 {
		t.Errorf("removed backend 0 got %d of 300 new connections", n)
	}
	for _, i := range []int{1, 2} {
		if counts[e.backendName(i)] == 0 {
			t.Errorf("after removing backend 0, 300 new connections: none to backend %d (%v)", i, counts)
		}
	}
	e.wantList("share backends 1 and 2", eipObj, backend(1), backend(2))
	// Last: an exclusive DNAT on the EIP beside the share identity.
	e.wantShareMark(f, dst)
}

// wantShareMark checks that the conntrack entries of the connections to
// the share identity dst carry the ct mark a connection through an
// exclusive DNAT on the same EIP gets (one is made on port dst+1, and
// deleted at the end, which forgets its own flows only): a backend that
// uses the ct mark to pick a slot must not leave its scratch value there
// (the nftables data plane: the EIP in IPv4, none in IPv6).
func (e *env) wantShareMark(f family, dst netip.AddrPort) {
	e.t.Helper()
	excl := netip.AddrPortFrom(dst.Addr(), dst.Port()+1)
	vm := f.host(e.gw.VMs[0])
	o := DNAT(UID(nat.KindDNAT, 999), dst.Addr(), nat.TCP, excl.Port(), vm.Addr, vmTCP)
	e.apply(o)
	defer e.del(o.UID)
	if _, err := netlab.Dial(e.ctx, e.gw.Ext.NS, excl.String(), netlab.DialTimeout); err != nil {
		e.t.Fatalf("through the exclusive DNAT %s: %v", excl, err)
	}
	flows, err := netlab.ConntrackEntries(e.ctx, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	var want []uint32
	shared := 0
	for _, fl := range flows {
		switch fl.OrigDst {
		case excl:
			want = append(want, fl.Mark)
		case dst:
			shared++
		}
	}
	if len(want) != 1 || shared == 0 {
		e.t.Fatalf("conntrack: %d entries through the exclusive DNAT %s, %d through the share identity %s; want 1 and some (%v)", len(want), excl, shared, dst, flows)
	}
	for _, fl := range flows {
		if fl.OrigDst == dst && fl.Mark != want[0] {
			e.t.Errorf("%s connection %s -> %s: ct mark %#x, want %#x (the mark of a connection through an exclusive DNAT of the EIP)", f, fl.OrigSrc, dst, fl.Mark, want[0])
		}
	}
	e.t.Logf("%s share identity %s: %d connections, ct mark %#x", f, dst, shared, want[0])
}
