package nftconn

import (
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// natgw encodes its batches itself, in the bytes google/nftables' Conn
// sends for the same calls. What follows compares the two, for the tests
// of every encoder (nftconn's Tx.Encode, nat/nftables' transaction).

// Messages decodes b's messages so far (the batch begin and end are not
// among them).
func (b *Batch) Messages() ([]netlink.Message, error) {
	out := make([]netlink.Message, len(b.start))
	for i, start := range b.start {
		l := int(binary.NativeEndian.Uint32(b.buf[start:]))
		if err := out[i].UnmarshalBinary(b.buf[start : start+l]); err != nil {
			return nil, fmt.Errorf("batch message %d (%s): %w", i, b.what[i], err)
		}
	}
	return out, nil
}

// LibraryMessages returns the messages google/nftables sends (one Flush)
// for the calls calls makes on a Conn that dials nothing, the batch begin
// and end left out.
func LibraryMessages(calls func(*nft.Conn) error) ([]netlink.Message, error) {
	var out []netlink.Message
	c, err := nft.New(nft.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		for _, m := range req {
			if typ := uint16(m.Header.Type); typ != unix.NFNL_MSG_BATCH_BEGIN && typ != unix.NFNL_MSG_BATCH_END {
				out = append(out, m)
			}
		}
		return []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4)}}, nil
	}))
	if err != nil {
		return nil, fmt.Errorf("google/nftables test conn: %w", err)
	}
	if err := calls(c); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("google/nftables test flush: %w", err)
	}
	return out, nil
}

// DiffLibrary compares b's messages with theirs (LibraryMessages) in
// order: the count, each one's type and flags (but LibraryOnlyFlags), and
// its data as data renders it (ours true for b's; data hides what may
// differ, such as set IDs). It returns one line per difference, none when
// they match.
func (b *Batch) DiffLibrary(theirs []netlink.Message, data func(m netlink.Message, ours bool) string) ([]string, error) {
	got, err := b.Messages()
	if err != nil {
		return nil, err
	}
	if len(got) != len(theirs) {
		return []string{fmt.Sprintf("%d messages, the library sent %d", len(got), len(theirs))}, nil
	}
	var diffs []string
	for i, m := range got {
		want := theirs[i]
		if m.Header.Type != want.Header.Type || m.Header.Flags != want.Header.Flags&^LibraryOnlyFlags(want) {
			diffs = append(diffs, fmt.Sprintf("message %d (%s): type/flags %#x/%#x, library %#x/%#x", i, b.What(i), uint16(m.Header.Type), uint16(m.Header.Flags), uint16(want.Header.Type), uint16(want.Header.Flags)))
		}
		if g, w := data(m, true), data(want, false); g != w {
			diffs = append(diffs, fmt.Sprintf("message %d (%s):\n ours    %s\n library %s", i, b.What(i), g, w))
		}
	}
	return diffs, nil
}

// LibraryOnlyFlags returns the header flags google/nftables sets on m that
// natgw's encoders leave off on purpose: NLM_F_ECHO on a rule add (the
// kernel then sends each rule back; natgw reads no echo, and at thousands
// of rules in one batch the echoes overran the receive buffer).
func LibraryOnlyFlags(m netlink.Message) netlink.HeaderFlags {
	if uint16(m.Header.Type)&0xff == unix.NFT_MSG_NEWRULE {
		return netlink.HeaderFlags(unix.NLM_F_ECHO)
	}
	return 0
}

// WithoutSetID is a message's data in hex with a NEWSET's set ID zeroed
// (each encoder numbers its sets its own way), for DiffLibrary.
func WithoutSetID(m netlink.Message) string {
	data := m.Data
	if uint16(m.Header.Type)&0xff == unix.NFT_MSG_NEWSET && len(data) > 4 {
		attrs, err := netlink.UnmarshalAttributes(data[4:])
		if err != nil {
			return fmt.Sprintf("%x (undecodable: %v)", data, err)
		}
		for i := range attrs {
			if attrs[i].Type == unix.NFTA_SET_ID {
				attrs[i].Data = make([]byte, 4)
			}
		}
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			return fmt.Sprintf("%x (unencodable: %v)", data, err)
		}
		data = append(data[:4:4], b...)
	}
	return fmt.Sprintf("%x", data)
}
