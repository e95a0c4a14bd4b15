package ctsync

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// Frame types of the replication stream. A frame is a 4-byte big-endian
// length (of what follows), a type byte, an 8-byte sequence number and,
// for entry frames, whole entries (of either family, each of its family's
// size).
const (
	frameEvents  = 1 // entries from ctnetlink events
	frameDump    = 2 // entries of a full dump
	frameDumpEnd = 3 // the dump is complete: entries not in it are stale
	frameAck     = 4 // standby → active: frames up to seq are applied
)

const (
	frameHeader = 9
	// maxFrameEntries bounds one frame (and one kernel write batch).
	maxFrameEntries = 1024
	maxFrame        = frameHeader + maxFrameEntries*entrySize6
)

func writeFrame(w io.Writer, buf []byte, typ byte, seq uint64, entries []Entry) ([]byte, error) {
	buf = binary.BigEndian.AppendUint32(buf[:0], 0)
	buf = append(buf, typ)
	buf = binary.BigEndian.AppendUint64(buf, seq)
	for _, e := range entries {
		buf = e.append(buf)
	}
	binary.BigEndian.PutUint32(buf, uint32(len(buf)-4))
	_, err := w.Write(buf)
	return buf, err
}

// readFrame reads one frame into buf and returns its type, sequence and
// entries.
func readFrame(r io.Reader, buf []byte, entries []Entry) (byte, uint64, []Entry, error) {
	if _, err := io.ReadFull(r, buf[:4]); err != nil {
		return 0, 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(buf))
	if n < frameHeader || n > maxFrame {
		return 0, 0, nil, fmt.Errorf("ctsync: frame length %d: want %d to %d", n, frameHeader, maxFrame)
	}
	b := buf[:n]
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, 0, nil, err
	}
	typ, seq := b[0], binary.BigEndian.Uint64(b[1:9])
	entries = entries[:0]
	for b = b[frameHeader:]; len(b) > 0; {
		e, size, err := decodeEntry(b)
		if err != nil {
			return 0, 0, nil, err
		}
		entries = append(entries, e)
		b = b[size:]
	}
	return typ, seq, entries, nil
}

// SenderStats are counters of a Sender.
type SenderStats struct {
	Connects int64 // connections to the standby made
	Sent     int64 // entries sent (events and dumps)
	DumpSent int64 // of which from full dumps
	Overruns int64 // event socket overruns (each forces a full dump)
	// LastLag is the lag of the last acknowledged frame (0 before the
	// first acknowledgement).
	LastLag    time.Duration
	LagSamples []time.Duration
}

// Sender is the active's side: it follows the kernel's conntrack events
// in its namespace and streams the NATed entries to the standby.
type Sender struct {
	// Peer is the standby's replication address ("ip:port").
	Peer string
	// NS is the namespace to read and to connect from (nil: the
	// caller's).
	NS *netns.NS
	// Batch is how long events are gathered before a frame is sent
	// (default 2 ms).
	Batch time.Duration
	// Refresh is the period of full dumps on a live connection, which
	// refresh the standby's timeouts (events do not carry timeout
	// refreshes) and remove what it missed (default 30 s).
	Refresh time.Duration
	// Retry is the pause between connection attempts (default 200 ms).
	Retry time.Duration
	// Keepalive is the period of empty frames on an idle connection
	// (default 200 ms); a standby that acknowledges nothing for
	// AckTimeout (default 2 s) is dropped and dialed again. Without them
	// a connection to a standby that vanished (its pod gone without a
	// FIN) would hang until the next event, and a restarted standby
	// would wait for its first dump.
	Keepalive, AckTimeout time.Duration
	Log                   logr.Logger

	mu    sync.Mutex
	stats SenderStats
}

// Stats returns a copy of the counters and the lag samples so far (time
// from the kernel's event to the standby's acknowledgement of its write).
func (s *Sender) Stats() SenderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.LagSamples = slices.Clone(s.stats.LagSamples)
	return st
}

// Counters returns the counters and LastLag without the lag samples (no
// copy: cheap enough for every metrics scrape).
func (s *Sender) Counters() SenderStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.LagSamples = nil
	return st
}

func (s *Sender) count(f func(*SenderStats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

type stamped struct {
	e  Entry
	at time.Time
}

// Run streams until ctx ends. It subscribes to events first, so that
// nothing between the dump and the stream is lost.
func (s *Sender) Run(ctx context.Context) error {
	cfg := &netlink.Config{}
	if s.NS != nil {
		cfg.NetNS = s.NS.Fd()
	}
	ev, err := newEventReader(s.NS)
	if err != nil {
		return err
	}
	defer ev.Close()
	dumper, err := ct.Dial(cfg)
	if err != nil {
		return fmt.Errorf("ctsync: dial ctnetlink: %w", err)
	}
	defer dumper.Close()
	_ = dumper.SetReadBuffer(16 << 20)

	events := make(chan stamped, 65536)
	overrun := make(chan struct{}, 1)
	signal := func() {
		select {
		case overrun <- struct{}{}:
		default:
		}
	}
	go func() {
		var batch []Entry
		for ctx.Err() == nil {
			var err error
			batch, err = ev.read(ctx, batch[:0])
			now := time.Now()
			for _, e := range batch {
				select {
				case events <- stamped{e, now}:
				default: // the stream is behind: a full dump will repair
					signal()
				}
			}
			if err != nil && ctx.Err() == nil {
				// ENOBUFS: the kernel dropped events; the socket
				// stays usable, a full dump repairs.
				s.Log.V(1).Info("conntrack events lost; full dump follows", "err", err)
				signal()
				if !errors.Is(err, unix.ENOBUFS) {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}()
	retry := cmp(s.Retry, 200*time.Millisecond)
	for ctx.Err() == nil {
		err := s.session(ctx, dumper, events, overrun)
		if ctx.Err() != nil {
			break
		}
		s.Log.V(1).Info("replication session ended", "peer", s.Peer, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
	return nil
}

func cmp(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// session is one connection: a full dump, then events, with a full dump
// again every Refresh or after an overrun.
func (s *Sender) session(ctx context.Context, dumper *ct.Conn, events chan stamped, overrun chan struct{}) error {
	d := net.Dialer{Timeout: time.Second}
	var conn net.Conn
	dial := func() error {
		var err error
		conn, err = d.DialContext(ctx, "tcp4", s.Peer)
		return err
	}
	var err error
	if s.NS != nil {
		// The socket is made on a thread inside the namespace.
		err = s.NS.Do(dial)
	} else {
		err = dial()
	}
	if err != nil {
		// Nobody to send to: what piles up is covered by the next dump.
		drain(events)
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	s.count(func(st *SenderStats) { st.Connects++ })
	bw := bufio.NewWriterSize(conn, 256<<10)

	var mu sync.Mutex
	pending := map[uint64]time.Time{} // frame seq → oldest event in it
	var lastAck atomic.Int64
	lastAck.Store(time.Now().UnixNano())
	ackErr := make(chan error, 1)
	go func() {
		buf := make([]byte, maxFrame)
		for {
			typ, seq, _, err := readFrame(conn, buf, nil)
			if err != nil {
				ackErr <- err
				return
			}
			if typ != frameAck {
				continue
			}
			now := time.Now()
			lastAck.Store(now.UnixNano())
			mu.Lock()
			for k, at := range pending {
				if k <= seq {
					delete(pending, k)
					s.count(func(st *SenderStats) {
						st.LastLag = now.Sub(at)
						if len(st.LagSamples) < 1<<20 {
							st.LagSamples = append(st.LagSamples, now.Sub(at))
						}
					})
				}
			}
			mu.Unlock()
		}
	}()

	var seq uint64
	var buf []byte
	send := func(typ byte, entries []Entry, oldest time.Time) error {
		seq++
		if !oldest.IsZero() {
			mu.Lock()
			pending[seq] = oldest
			mu.Unlock()
		}
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		var err error
		buf, err = writeFrame(bw, buf, typ, seq, entries)
		if err != nil {
			return fmt.Errorf("ctsync: send to %s: %w", s.Peer, err)
		}
		return nil
	}
	dump := func() error {
		drain(overrun)
		var flows []ct.Flow
		for _, fam := range []netfilter.ProtoFamily{netfilter.ProtoIPv4, netfilter.ProtoIPv6} {
			f, err := dumper.DumpFilter(ct.NewFilter().Family(fam), nil)
			if err != nil {
				return fmt.Errorf("ctsync: dump (family %d): %w", fam, err)
			}
			flows = append(flows, f...)
		}
		batch := make([]Entry, 0, maxFrameEntries)
		n := 0
		for i := range flows {
			if !Replicated(&flows[i]) {
				continue
			}
			batch = append(batch, FromFlow(OpUpsert, &flows[i]))
			if len(batch) == maxFrameEntries {
				if err := send(frameDump, batch, time.Time{}); err != nil {
					return err
				}
				n += len(batch)
				batch = batch[:0]
			}
		}
		n += len(batch)
		if err := send(frameDump, batch, time.Time{}); err != nil {
			return err
		}
		if err := send(frameDumpEnd, nil, time.Time{}); err != nil {
			return err
		}
		s.count(func(st *SenderStats) { st.Sent += int64(n); st.DumpSent += int64(n) })
		return bw.Flush()
	}
	if err := dump(); err != nil {
		return err
	}
	refresh := time.NewTicker(cmp(s.Refresh, 30*time.Second))
	defer refresh.Stop()
	window := cmp(s.Batch, 2*time.Millisecond)
	ackTimeout := cmp(s.AckTimeout, 2*time.Second)
	keepalive := time.NewTicker(cmp(s.Keepalive, 200*time.Millisecond))
	defer keepalive.Stop()
	batch := make([]Entry, 0, maxFrameEntries)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keepalive.C:
			if since := time.Since(time.Unix(0, lastAck.Load())); since > ackTimeout {
				return fmt.Errorf("ctsync: no acknowledgement from %s for %s", s.Peer, since.Round(time.Millisecond))
			}
			if err := send(frameEvents, nil, time.Time{}); err != nil {
				return err
			}
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("ctsync: send to %s: %w", s.Peer, err)
			}
		case err := <-ackErr:
			return fmt.Errorf("ctsync: read acks from %s: %w", s.Peer, err)
		case <-overrun:
			s.count(func(st *SenderStats) { st.Overruns++ })
			drain(events)
			if err := dump(); err != nil {
				return err
			}
		case <-refresh.C:
			if err := dump(); err != nil {
				return err
			}
		case first := <-events:
			batch = append(batch[:0], first.e)
			deadline := time.NewTimer(window)
		gather:
			for len(batch) < maxFrameEntries {
				select {
				case ev := <-events:
					batch = append(batch, ev.e)
				case <-deadline.C:
					break gather
				}
			}
			deadline.Stop()
			if err := send(frameEvents, batch, first.at); err != nil {
				return err
			}
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("ctsync: send to %s: %w", s.Peer, err)
			}
			s.count(func(st *SenderStats) { st.Sent += int64(len(batch)) })
		}
	}
}

func drain[T any](c chan T) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// ReceiverStats are counters of a Receiver.
type ReceiverStats struct {
	Sessions int64 // connections accepted
	Applied  int64 // entries written
	Failed   int64 // entries the kernel refused
	Stale    int64 // entries deleted because a full dump lacked them
	Dumps    int64 // full dumps completed
}

// Receiver is the standby's side: it accepts the active's stream and
// writes the entries into its namespace. One connection at a time: a new
// one replaces the old.
type Receiver struct {
	w   *Writer
	log logr.Logger

	mu      sync.Mutex
	stats   ReceiverStats
	synced  atomic.Bool
	paused  atomic.Bool
	conn    net.Conn
	created map[Key]Entry // entries written from the stream, for stale removal
}

// NewReceiver returns a Receiver writing into ns (nil: the caller's).
func NewReceiver(ns *netns.NS, log logr.Logger) (*Receiver, error) {
	w, err := NewWriter(ns)
	if err != nil {
		return nil, err
	}
	return &Receiver{w: w, log: log, created: map[Key]Entry{}}, nil
}

// Stats returns the counters.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Synced reports whether a full dump of the current connection has been
// written.
func (r *Receiver) Synced() bool { return r.synced.Load() }

// Pause stops (true) or resumes (false) writing: the active replica does
// not take entries from its peer. Pausing closes the current connection.
func (r *Receiver) Pause(p bool) {
	r.paused.Store(p)
	if p {
		r.mu.Lock()
		if r.conn != nil {
			r.conn.Close()
		}
		r.mu.Unlock()
		r.synced.Store(false)
	}
}

// Serve accepts connections on ln until ctx ends, then closes ln and the
// writer.
func (r *Receiver) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer r.w.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex // one session writes at a time
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ctsync: accept: %w", err)
		}
		if r.paused.Load() {
			conn.Close()
			continue
		}
		r.mu.Lock()
		if r.conn != nil {
			r.conn.Close()
		}
		r.conn = conn
		r.stats.Sessions++
		r.mu.Unlock()
		r.synced.Store(false)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			defer stop()
			mu.Lock()
			defer mu.Unlock()
			err := r.session(ctx, conn)
			r.log.V(1).Info("replication session ended", "peer", conn.RemoteAddr().String(), "err", err)
		}()
	}
}

func (r *Receiver) session(ctx context.Context, conn net.Conn) error {
	br := bufio.NewReaderSize(conn, 256<<10)
	buf := make([]byte, maxFrame)
	ack := make([]byte, 0, frameHeader+4)
	var entries []Entry
	inDump := map[Key]bool{}
	for {
		typ, seq, es, err := readFrame(br, buf, entries)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		entries = es
		if r.paused.Load() {
			return errors.New("ctsync: paused")
		}
		switch typ {
		case frameEvents, frameDump:
			failed, err := r.w.Apply(ctx, entries)
			r.mu.Lock()
			r.stats.Applied += int64(len(entries) - failed)
			r.stats.Failed += int64(failed)
			for _, e := range entries {
				if e.Op == OpDelete {
					delete(r.created, e.Key())
				} else {
					r.created[e.Key()] = e
				}
				if typ == frameDump {
					inDump[e.Key()] = true
				}
			}
			r.mu.Unlock()
			if err != nil {
				r.log.Info("replicated entries refused", "failed", failed, "err", err)
			}
		case frameDumpEnd:
			var stale []Entry
			r.mu.Lock()
			for k, e := range r.created {
				if !inDump[k] {
					e.Op = OpDelete
					stale = append(stale, e)
					delete(r.created, k)
				}
			}
			r.stats.Dumps++
			r.stats.Stale += int64(len(stale))
			r.mu.Unlock()
			if _, err := r.w.Apply(ctx, stale); err != nil {
				r.log.Info("stale entries not deleted", "err", err)
			}
			clear(inDump)
			r.synced.Store(true)
		default:
			return fmt.Errorf("ctsync: frame type %d from %s", typ, conn.RemoteAddr())
		}
		_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if ack, err = writeFrame(conn, ack, frameAck, seq, nil); err != nil {
			return fmt.Errorf("ctsync: ack to %s: %w", conn.RemoteAddr(), err)
		}
	}
}
