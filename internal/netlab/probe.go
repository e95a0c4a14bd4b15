package netlab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/natgw/natgw/nat/netns"
)

// Timeouts for probes.
const (
	// DialTimeout bounds a probe that is expected to connect.
	DialTimeout = 5 * time.Second
	// FailTimeout bounds a probe that is expected not to connect.
	FailTimeout = 400 * time.Millisecond
	// ioTimeout bounds a server's exchange with one client.
	ioTimeout = 5 * time.Second
)

// Reply is what a probe server answered: the client address it saw and its
// own identity (namespace and listening address).
type Reply struct {
	Client netip.AddrPort
	Server string
}

// replyPrefix starts every probe reply line.
const replyPrefix = "natgw-probe "

func formatReply(client net.Addr, server string) string {
	return fmt.Sprintf("%sclient=%s server=%s\n", replyPrefix, client, server)
}

func parseReply(line string) (Reply, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), replyPrefix)
	if !ok {
		return Reply{}, fmt.Errorf("not a probe reply: %q", line)
	}
	var r Reply
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "client":
			ap, err := netip.ParseAddrPort(v)
			if err != nil {
				return Reply{}, fmt.Errorf("probe reply %q: %w", line, err)
			}
			r.Client = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
		case "server":
			r.Server = v
		}
	}
	if !r.Client.IsValid() {
		return Reply{}, fmt.Errorf("probe reply without client: %q", line)
	}
	return r, nil
}

// Server is a probe server listening inside a namespace. Each TCP client
// gets one reply line naming the address it came from, then its input is
// echoed until EOF; each UDP datagram is answered with a reply line.
type Server struct {
	// Name identifies the server in replies: "<ns>/<addr>".
	Name string
	// Addr is the address the server listens on.
	Addr netip.AddrPort

	ln     net.Listener
	pc     net.PacketConn
	wg     sync.WaitGroup
	once   sync.Once
	mu     sync.Mutex
	seen   []netip.AddrPort
	conns  map[net.Conn]struct{}
	closed bool
}

// track registers an accepted connection so that Close can end it; false
// when the server is closing.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.conns == nil {
		s.conns = map[net.Conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) untrack(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Seen returns the client addresses the server has answered, in order.
func (s *Server) Seen() []netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]netip.AddrPort(nil), s.seen...)
}

func (s *Server) saw(a net.Addr) {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return
	}
	s.mu.Lock()
	s.seen = append(s.seen, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	s.mu.Unlock()
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	var err error
	s.once.Do(func() {
		if s.ln != nil {
			err = s.ln.Close()
		}
		if s.pc != nil {
			err = s.pc.Close()
		}
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return err
}

// inNS runs fn inside namespace ns ("" is the caller's own).
func inNS(ns string, fn func() error) error {
	if ns == "" {
		return fn()
	}
	return netns.Do(ns, fn)
}

// ServeTCP starts a TCP probe server on addr ("ip:port") inside ns. The
// server stops when ctx ends or Close is called.
func ServeTCP(ctx context.Context, ns, addr string) (*Server, error) {
	ln, err := listenIn(ns, "tcp", addr, func() (net.Listener, error) {
		return (&net.ListenConfig{}).Listen(ctx, family("tcp", addr), addr)
	})
	if err != nil {
		return nil, err
	}
	s := newServer(ns, ln.Addr())
	s.ln = ln
	return s.run(ctx, func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !s.track(c) {
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer s.untrack(c)
				s.saw(c.RemoteAddr())
				serveConn(c, s.Name)
			}()
		}
	}), nil
}

// serveConn runs the TCP probe protocol on one connection: the reply line,
// then by the client's first line: "sink" (the server counts the bytes up
// to EOF and answers "received N"), "source N" (the server sends N bytes
// and closes), anything else is echoed with the rest of the stream. Every
// read and write is bounded by ioTimeout.
func serveConn(c net.Conn, name string) {
	tick := func() { _ = c.SetDeadline(time.Now().Add(ioTimeout)) }
	tick()
	if _, err := c.Write([]byte(formatReply(c.RemoteAddr(), name))); err != nil {
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	first, err := br.ReadString('\n')
	if err != nil {
		return
	}
	switch cmd := strings.Fields(first); {
	case len(cmd) == 1 && cmd[0] == "sink":
		var n int64
		buf := make([]byte, 64<<10)
		for {
			tick()
			k, err := br.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		tick()
		fmt.Fprintf(c, "received %d\n", n)
	case len(cmd) == 2 && cmd[0] == "source":
		n, err := strconv.ParseInt(cmd[1], 10, 64)
		if err != nil || n < 0 {
			return
		}
		buf := make([]byte, 64<<10)
		for n > 0 {
			k := int64(len(buf))
			if n < k {
				k = n
			}
			tick()
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	default:
		if _, err := c.Write([]byte(first)); err != nil {
			return
		}
		buf := make([]byte, 4096)
		for {
			tick()
			k, err := br.Read(buf)
			if k > 0 {
				if _, werr := c.Write(buf[:k]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

// Upload connects from ns to the TCP probe server at addr, sends n bytes
// and returns the server's reply and how long the transfer took (from the
// first byte sent to the server's count of them). timeout bounds it all.
func Upload(ctx context.Context, ns, addr string, n int64, timeout time.Duration) (Reply, time.Duration, error) {
	return transfer(ctx, ns, addr, timeout, func(c net.Conn) error {
		if _, err := io.WriteString(c, "sink\n"); err != nil {
			return err
		}
		if _, err := io.CopyN(c, zeros{}, n); err != nil {
			return err
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		var got int64
		if _, err := fmt.Sscanf(line, "received %d", &got); err != nil || got != n {
			return fmt.Errorf("server answered %q", strings.TrimSpace(line))
		}
		return nil
	}, "upload %d bytes to %s from %s", n, addr, ns)
}

// Download connects from ns to the TCP probe server at addr, has it send n
// bytes and returns the server's reply and how long the transfer took.
func Download(ctx context.Context, ns, addr string, n int64, timeout time.Duration) (Reply, time.Duration, error) {
	return transfer(ctx, ns, addr, timeout, func(c net.Conn) error {
		if _, err := fmt.Fprintf(c, "source %d\n", n); err != nil {
			return err
		}
		got, err := io.Copy(io.Discard, c)
		if err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("received %d bytes", got)
		}
		return nil
	}, "download %d bytes from %s to %s", n, addr, ns)
}

// transfer connects from ns to the TCP probe server at addr and runs xfer
// on the connection under one deadline (timeout, which bounds it all); it
// returns the server's reply and how long xfer took. A failure of xfer is
// wrapped with the description format, args.
func transfer(ctx context.Context, ns, addr string, timeout time.Duration, xfer func(net.Conn) error, format string, args ...any) (Reply, time.Duration, error) {
	c, r, err := Connect(ctx, ns, addr, timeout)
	if err != nil {
		return Reply{}, 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	start := time.Now()
	if err := xfer(c); err != nil {
		return Reply{}, 0, fmt.Errorf("netlab: %s: %w", fmt.Sprintf(format, args...), err)
	}
	return r, time.Since(start), nil
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// ServeUDP starts a UDP probe server on addr ("ip:port") inside ns.
func ServeUDP(ctx context.Context, ns, addr string) (*Server, error) {
	pc, err := listenIn(ns, "udp", addr, func() (net.PacketConn, error) {
		return (&net.ListenConfig{}).ListenPacket(ctx, family("udp", addr), addr)
	})
	if err != nil {
		return nil, err
	}
	s := newServer(ns, pc.LocalAddr())
	s.pc = pc
	return s.run(ctx, func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			s.saw(from)
			_ = pc.SetWriteDeadline(time.Now().Add(ioTimeout))
			_, _ = pc.WriteTo([]byte(formatReply(from, s.Name)), from)
		}
	}), nil
}

// run runs loop (the server's accept or read loop) in a goroutine Close
// waits for, and closes s when ctx ends.
func (s *Server) run(ctx context.Context, loop func()) *Server {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		loop()
	}()
	if ctx.Done() != nil {
		go func() {
			<-ctx.Done()
			s.Close()
		}()
	}
	return s
}

// ServeTCP starts a TCP probe server in ns that the Lab stops on Close.
func (l *Lab) ServeTCP(ctx context.Context, ns, addr string) (*Server, error) {
	return l.track(ServeTCP(ctx, ns, addr))
}

// ServeUDP starts a UDP probe server in ns that the Lab stops on Close.
func (l *Lab) ServeUDP(ctx context.Context, ns, addr string) (*Server, error) {
	return l.track(ServeUDP(ctx, ns, addr))
}

// track has the Lab stop a server it started on Close.
func (l *Lab) track(s *Server, err error) (*Server, error) {
	if err != nil {
		return nil, err
	}
	l.addCloser(s)
	return s, nil
}

// listenIn runs listen inside ns.
func listenIn[L any](ns, network, addr string, listen func() (L, error)) (L, error) {
	var l L
	err := inNS(ns, func() error {
		var err error
		l, err = listen()
		return err
	})
	if err != nil {
		return l, fmt.Errorf("netlab: serve %s %s in %s: %w", network, addr, ns, err)
	}
	return l, nil
}

// newServer names a server in ns after the address it listens on.
func newServer(ns string, a net.Addr) *Server {
	ap, _ := netip.ParseAddrPort(a.String())
	return &Server{Name: ns + "/" + a.String(), Addr: ap}
}

// Dial connects from inside ns to a TCP probe server at addr ("ip:port")
// and returns its reply. The whole exchange is bounded by timeout (and ctx).
func Dial(ctx context.Context, ns, addr string, timeout time.Duration) (Reply, error) {
	c, r, err := Connect(ctx, ns, addr, timeout)
	if err != nil {
		return Reply{}, err
	}
	c.Close()
	return r, nil
}

// Connect is Dial that keeps the connection open (e.g. to hold a conntrack
// entry); the caller closes it. Reads and writes on it are bounded by
// ioTimeout from now.
func Connect(ctx context.Context, ns, addr string, timeout time.Duration) (net.Conn, Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := dialIn(ctx, ns, "tcp", addr)
	if err != nil {
		return nil, Reply{}, err
	}
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, Reply{}, fmt.Errorf("netlab: read tcp probe reply from %s in %s: %w", addr, ns, err)
	}
	r, err := parseReply(line)
	if err != nil {
		c.Close()
		return nil, Reply{}, fmt.Errorf("netlab: tcp %s from %s: %w", addr, ns, err)
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	return c, r, nil
}

// dialIn dials network ("tcp" or "udp", of addr's family) to addr from
// inside ns.
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(ns, func() error {
		var err error
		// The socket is created on this thread, inside ns; it stays
		// there when the thread switches back.
		c, err = (&net.Dialer{}).DialContext(ctx, family(network, addr), addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: dial %s %s from %s: %w", network, addr, ns, err)
	}
	return c, nil
}

// DialUDP sends a probe datagram from inside ns to a UDP probe server at
// addr and returns its reply. The datagram is resent every 200 ms until a
// reply comes or timeout (or ctx) ends.
func DialUDP(ctx context.Context, ns, addr string, timeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := dialIn(ctx, ns, "udp", addr)
	if err != nil {
		return Reply{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 2048)
	for {
		if _, err := c.Write([]byte("probe\n")); err != nil && ctx.Err() == nil {
			// ICMP errors (e.g. port unreachable) surface here; retry
			// until the deadline like a lost datagram.
			time.Sleep(50 * time.Millisecond)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("netlab: udp %s from %s: no reply: %w", addr, ns, ctx.Err())
		}
		n, err := c.Read(buf)
		if err == nil {
			r, perr := parseReply(string(buf[:n]))
			if perr != nil {
				return Reply{}, fmt.Errorf("netlab: udp %s from %s: %w", addr, ns, perr)
			}
			return r, nil
		}
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("netlab: udp %s from %s: no reply: %w", addr, ns, ctx.Err())
		}
	}
}

// family is network ("tcp", "udp") of addr's family: "tcp6" for an IPv6
// "[ip]:port", else "tcp4" (the probes never use dual-stack sockets, so a
// server on 0.0.0.0 and one on an IPv6 address share a port).
func family(network, addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Is6() {
		return network + "6"
	}
	return network + "4"
}
