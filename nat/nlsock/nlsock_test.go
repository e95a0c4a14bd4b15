package nlsock

import (
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
)

// getGen encodes an nf_tables GETGEN request (read-only, but the kernel
// still wants CAP_NET_ADMIN) with sequence number seq.
func getGen(seq uint32) []byte {
	b := binary.NativeEndian.AppendUint32(nil, unix.SizeofNlMsghdr+4)
	b = binary.NativeEndian.AppendUint16(b, unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN)
	b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_REQUEST)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0)
}

func TestExchange(t *testing.T) {
	if reason := netlab.Unavailable(); reason != "" {
		t.Skipf("netlab: %s (the kernel answers nf_tables requests of unprivileged users with EPERM)", reason)
	}
	s, err := Dial(nil, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Send(ctx, getGen(42)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	n, err := s.Recv(ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	var bad error
	found := false
	for h, m := range Messages(buf[:n], &bad) {
		if h.Seq != 42 || h.Type != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN || len(m) < 4 {
			t.Errorf("answer %+v (%d bytes), want NEWGEN with seq 42", h, len(m))
		}
		found = true
	}
	if bad != nil || !found {
		t.Fatalf("answer of %d bytes: %v, found %v", n, bad, found)
	}
	if _, ok, err := s.TryRecv(buf); ok || err != nil {
		t.Errorf("TryRecv on an empty socket: ok %v, err %v; want nothing queued", ok, err)
	}
}

// TestWaitEnds: a receive with nothing coming ends at the context's
// deadline or cancellation, promptly.
func TestWaitEnds(t *testing.T) {
	s, err := Dial(nil, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	buf := make([]byte, 4096)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 30*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(30*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := s.Recv(ctx, buf)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Recv: %v, want %v", err, tc.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("Recv returned after %v, want about 30 ms", took)
			}
		})
	}
}

func TestMessages(t *testing.T) {
	two := append(getGen(1), getGen(2)...)
	for _, tc := range []struct {
		name string
		b    []byte
		seqs []uint32
		bad  string
	}{
		{"two", two, []uint32{1, 2}, ""},
		{"empty", nil, nil, ""},
		{"length past the end", append(getGen(1), binary.NativeEndian.AppendUint32(make([]byte, 0, 16), 999)[:4]...), []uint32{1}, ""},
		{"bad length", func() []byte { b := getGen(1); binary.NativeEndian.PutUint32(b, 4); return b }(), nil, "bad message length 4"},
		{"length beyond the datagram", func() []byte { b := getGen(1); binary.NativeEndian.PutUint32(b, 100); return b }(), nil, "bad message length 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bad error
			var seqs []uint32
			for h := range Messages(tc.b, &bad) {
				seqs = append(seqs, h.Seq)
			}
			if len(seqs) != len(tc.seqs) || (len(seqs) > 0 && seqs[len(seqs)-1] != tc.seqs[len(tc.seqs)-1]) {
				t.Errorf("seqs %v, want %v", seqs, tc.seqs)
			}
			if (bad == nil) != (tc.bad == "") || (bad != nil && !strings.Contains(bad.Error(), tc.bad)) {
				t.Errorf("bad %v, want %q", bad, tc.bad)
			}
		})
	}
}

func TestErrno(t *testing.T) {
	p := binary.NativeEndian.AppendUint32(nil, uint32(0xffffffff-uint32(unix.EEXIST)+1)) // -EEXIST
	p = append(p, getGen(7)[:unix.SizeofNlMsghdr]...)
	code, seq, ok := Errno(p)
	if !ok || code != unix.EEXIST || seq != 7 {
		t.Errorf("Errno: %v %d %v, want EEXIST 7 true", code, seq, ok)
	}
	if _, _, ok := Errno(p[:10]); ok {
		t.Error("Errno of a short payload: ok")
	}
}
