package framework

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/natgw/natgw/internal/netlab"
)

// Proto is a probe's transport protocol.
type Proto string

// Probe protocols.
const (
	TCP Proto = "tcp"
	UDP Proto = "udp"
)

// Result is one probe: which namespace answered and the client address it
// saw, or why nothing answered.
type Result struct {
	// ServerNS is the namespace of the server that answered.
	ServerNS string
	// Client is the source address the server saw.
	Client netip.Addr
	// ClientPort is the source port the server saw.
	ClientPort uint16
	Err        error
	At         time.Time
	Took       time.Duration
}

func (r Result) String() string {
	if r.Err != nil {
		return "no answer: " + r.Err.Error()
	}
	return fmt.Sprintf("answered by %s, client seen %s", r.ServerNS, r.Client)
}

// Probe opens one new connection (TCP) or exchange (UDP) from namespace
// from to to:port and waits for the server's reply, at most timeout.
func Probe(ctx context.Context, proto Proto, from string, to netip.Addr, port int, timeout time.Duration) Result {
	addr := netip.AddrPortFrom(to, uint16(port)).String()
	start := time.Now()
	var rep netlab.Reply
	var err error
	switch proto {
	case TCP:
		rep, err = netlab.Dial(ctx, from, addr, timeout)
	case UDP:
		rep, err = netlab.DialUDP(ctx, from, addr, timeout)
	default:
		err = fmt.Errorf("unknown protocol %q", proto)
	}
	r := Result{Err: err, At: start, Took: time.Since(start)}
	if err == nil {
		r.ServerNS, _, _ = strings.Cut(rep.Server, "/")
		r.Client = rep.Client.Addr()
		r.ClientPort = rep.Client.Port()
	}
	return r
}

// Path is a probe with its expected outcome.
type Path struct {
	Proto Proto
	From  string
	To    netip.Addr
	Port  int
	// WantServer is the namespace that must answer ("" for none).
	WantServer string
	// WantClient is the source address the server must see (unchecked
	// when invalid).
	WantClient netip.Addr
}

func (p Path) String() string {
	want := "no answer"
	if p.WantServer != "" {
		want = p.WantServer
		if p.WantClient.IsValid() {
			want += " seeing client " + p.WantClient.String()
		}
	}
	return fmt.Sprintf("%s %s → %s:%d (want %s)", p.Proto, p.From, p.To, p.Port, want)
}

// Check runs the probe once and compares the outcome.
func (p Path) Check(ctx context.Context) error {
	timeout := netlab.DialTimeout
	if p.WantServer == "" {
		timeout = netlab.FailTimeout
	}
	r := Probe(ctx, p.Proto, p.From, p.To, p.Port, timeout)
	switch {
	case p.WantServer == "" && r.Err == nil:
		return fmt.Errorf("%s: %s", p, r)
	case p.WantServer == "":
		return nil
	case r.Err != nil:
		return fmt.Errorf("%s: %s", p, r)
	case r.ServerNS != p.WantServer:
		return fmt.Errorf("%s: %s", p, r)
	case p.WantClient.IsValid() && r.Client != p.WantClient:
		return fmt.Errorf("%s: %s", p, r)
	}
	return nil
}

// CheckPaths waits until every path behaves as expected (a path may need
// a moment after its rule became Ready elsewhere, e.g. ARP), at most
// timeout in all, and returns how long it took.
func (s *Stack) CheckPaths(timeout time.Duration, paths ...Path) time.Duration {
	s.T.Helper()
	start := time.Now()
	for _, p := range paths {
		var first error
		d := Eventually(s.T, s.Ctx, timeout-time.Since(start), p.String(), func() error {
			err := p.Check(s.Ctx)
			if first == nil {
				first = err
			}
			return err
		})
		if d > time.Second {
			s.T.Logf("%s: ok after %v (first failure: %v)", p, d.Round(time.Millisecond), first)
		}
	}
	return time.Since(start)
}

// ExtTo returns the probe from gateway g's external host to addr:port,
// expected to be answered by VPC host vm (-1: no answer) seeing the
// external host's address.
func (g *Topology) ExtTo(proto Proto, addr netip.Addr, port, vm int) Path {
	p := Path{Proto: proto, From: g.Ext.NS, To: addr, Port: port}
	if vm >= 0 {
		p.WantServer, p.WantClient = g.VMs[vm].NS, netlab.ExtAddr
		if addr.Is6() {
			p.WantClient = netlab.ExtAddr6
		}
	}
	return p
}

// VMOut returns the probe from VPC host vm to the external host, expected
// to be answered with the external host seeing source src (invalid: no
// answer expected), in src's family (IPv4 when src is invalid).
func (g *Topology) VMOut(proto Proto, vm int, src netip.Addr) Path {
	f := IPv4
	if src.Is6() {
		f = IPv6
	}
	return g.VMOutIn(f, proto, vm, src)
}

// VMOutIn is VMOut to the external host's address of family f.
func (g *Topology) VMOutIn(f Family, proto Proto, vm int, src netip.Addr) Path {
	p := Path{Proto: proto, From: g.VMs[vm].NS, To: f.ExtAddr(), Port: ExtPort}
	if src.IsValid() {
		p.WantServer, p.WantClient = g.Ext.NS, src
	}
	return p
}
