package nftables

import (
	"context"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nftconn"
)

// dumpSet dumps the elements of one set of natgw's table over natgw's own
// socket (r.nl), calling elem with each NFTA_LIST_ELEM payload (in another
// goroutine than the reads: the kernel walks the set for the next reply
// while the previous one is decoded). The payload is valid only during the
// call: its buffer is reused. It does what (*nft.Conn).GetSetElements does
// for the attributes natgw uses (nftconn.DecodeElem) with a decoder that
// allocates little per element: at 100,000 elements the library's decoder
// allocates ~190 MB, most of it garbage at once. It is nftconn.Socket.Dump
// with the decoding in a goroutine of its own, the same decoders.
func (r *Backend) dumpSet(ctx context.Context, set string, elem func(b []byte) error) error {
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(tableName + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return err
	}
	req, seq := r.request(unix.NFT_MSG_GETSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, nfFamily, data)
	if err := r.nl.Send(ctx, req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	free := make(chan []byte, maxDumpBufs)
	full := make(chan []byte, maxDumpBufs)
	decoded := make(chan error, 1)
	go func() {
		var derr error
		for b := range full {
			if derr == nil {
				derr = nftconn.DecodeReply(b, unix.NFT_MSG_NEWSETELEM, func(_ uint8, m []byte) error {
					return nftconn.ElemList(m, elem)
				})
			}
			free <- b[:cap(b)]
		}
		decoded <- derr
	}()
	rerr := r.readDump(ctx, seq, free, full)
	close(full)
	if derr := <-decoded; rerr == nil {
		rerr = derr
	}
	return rerr
}

// maxDumpBufs bounds the receive buffers of one dump (of 2*dumpChunk bytes
// each: 4 MiB in all). The kernel walks a set for the next reply only when
// the previous one is received, so the reads must not wait for the
// decoding: a buffer is taken from free if one is there, else allocated,
// up to this bound.
const maxDumpBufs = 64

// readDump reads the replies of one dump with sequence number seq, passing
// each datagram to full, until NLMSG_DONE. Its buffers come from free (the
// ones the decoding is done with) or are allocated while free is empty, up
// to maxDumpBufs.
func (r *Backend) readDump(ctx context.Context, seq uint32, free <-chan []byte, full chan<- []byte) error {
	bufs := 0
	next := func() []byte {
		select {
		case b := <-free:
			return b
		default:
		}
		if bufs < maxDumpBufs {
			bufs++
			return make([]byte, 2*dumpChunk)
		}
		return <-free
	}
	for {
		buf := next()
		n, err := r.nl.Recv(ctx, buf)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		b := buf[:n]
		end, err := nftconn.DumpEnd(b, seq)
		if err != nil {
			return err
		}
		full <- b
		if end {
			return nil
		}
	}
}
