package nftconn

import (
	"context"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Dump dumps objects of a kind with few of them (tables, chains, rules,
// sets, limit objects, the elements of a small map): it sends request typ
// (NLM_F_DUMP) for family with the request's attributes on s, reads the
// answers into s's answer buffer (Buffer) and calls msg with the family
// and the attributes of each answer message of type reply (DecodeReply),
// in the calling goroutine; the attributes are valid only during the
// call. The kernel's error answer (ENOENT for a missing table or set)
// ends it as an error wrapping the errno (DumpEnd). An error of msg is
// returned once the rest of the dump is read (the socket stays usable: the
// kernel refuses a new dump, EBUSY, while one is unread); after a failed
// send or receive (a timeout, a cancelled context) or a malformed answer
// the socket may hold the rest: the caller closes it. Set elements by the 100,000 go through
// nat/nftables' pipelined dump instead (the same decoders).
func (s *Socket) Dump(ctx context.Context, typ uint16, family uint8, attrs []netlink.Attribute, reply uint16, msg func(family uint8, attrs []byte) error) error {
	return s.query(ctx, typ, unix.NLM_F_DUMP, family, attrs, reply, msg)
}

// Get asks for one object (request typ with NLM_F_ACK: the object, then
// the ack, or an error answer) and calls msg as Dump does.
func (s *Socket) Get(ctx context.Context, typ uint16, family uint8, attrs []netlink.Attribute, reply uint16, msg func(family uint8, attrs []byte) error) error {
	return s.query(ctx, typ, unix.NLM_F_ACK, family, attrs, reply, msg)
}

// query sends one request with flags (beyond NLM_F_REQUEST) and reads its
// answers up to their end (see Dump).
func (s *Socket) query(ctx context.Context, typ, flags uint16, family uint8, attrs []netlink.Attribute, reply uint16, msg func(family uint8, attrs []byte) error) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	req, seq := s.Request(typ, unix.NLM_F_REQUEST|flags, family, data)
	if err := s.nl.Send(ctx, req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return readAnswers(s.Buffer(), seq, reply, msg, func(b []byte) (int, error) { return s.nl.Recv(ctx, b) })
}

// readAnswers reads the answers to request seq, one datagram at a time
// into buf with recv, up to their end (DumpEnd), and calls msg with each
// message of type reply (DecodeReply) until msg fails; then the rest is
// read, not decoded, and msg's error returned.
func readAnswers(buf []byte, seq uint32, reply uint16, msg func(family uint8, attrs []byte) error, recv func([]byte) (int, error)) error {
	var merr error
	for {
		n, err := recv(buf)
		if err != nil {
			return errors.Join(merr, err)
		}
		end, err := DumpEnd(buf[:n], seq)
		if err != nil {
			// The kernel's error answer (the end), or a bad datagram.
			return errors.Join(merr, err)
		}
		if merr == nil {
			merr = DecodeReply(buf[:n], reply, msg)
		}
		if end {
			return merr
		}
	}
}
