package nftables

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/natgw/natgw/nat"
)

// The index snapshot (see nat/README.md, "The index snapshot"): the FIPs
// of the table, written to a file of the process's state directory
// (nat.Config.StateDir) before the transaction that names it in natgw_meta
// (udataSnap) commits. Load uses it instead of dumping the FIP maps only
// when the kernel proves that nothing committed since natgw's last
// stamping transaction (the mirror condition), that transaction named this
// snapshot, and the file's boot id, id and checksum match. Otherwise it
// reads the kernel in full.

// snapFile is the snapshot's name in the state directory: one per
// directory (a gateway pod has its own), the last writer wins.
const snapFile = "nftables-fips.snap"

// snapMagic starts a snapshot file (its format's version included).
var snapMagic = []byte("natgw-fips-snapshot 1\n")

// snapCRC is the checksum table of the file's trailer.
var snapCRC = crc32.MakeTable(crc32.Castagnoli)

// newSnapID returns a random non-zero snapshot id.
func newSnapID() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("snapshot id: %w", err)
		}
		if id := binary.BigEndian.Uint64(b[:]); id != 0 {
			return id, nil
		}
	}
}

// encodeSnapshot returns the file of the FIPs fips under boot id boot and
// snapshot id id: magic, boot id, id, count, then per FIP its UID
// (length-prefixed), the address length (4 or 16), EIP and internal IP;
// last a CRC-32C of everything before it.
func encodeSnapshot(boot string, id uint64, fips []nat.Object) []byte {
	b := make([]byte, 0, len(snapMagic)+64+len(fips)*(2+40+1+32))
	b = append(b, snapMagic...)
	b = binary.AppendUvarint(b, uint64(len(boot)))
	b = append(b, boot...)
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.AppendUvarint(b, uint64(len(fips)))
	for _, o := range fips {
		b = binary.AppendUvarint(b, uint64(len(o.UID)))
		b = append(b, o.UID...)
		eip, in := o.FIP.EIP, o.FIP.InternalIP
		if eip.Is4() {
			b = append(b, 4)
			e4, i4 := eip.As4(), in.As4()
			b = append(append(b, e4[:]...), i4[:]...)
		} else {
			b = append(b, 16)
			e16, i16 := eip.As16(), in.As16()
			b = append(append(b, e16[:]...), i16[:]...)
		}
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, snapCRC))
}

// errSnapshot marks a snapshot file that is unusable (damaged, another
// format); the caller reads the kernel in full.
var errSnapshot = errors.New("unusable index snapshot")

// decodeSnapshot checks file b against boot and id and calls fip for each
// FIP it holds, in its order, as it decodes them (no list is kept); hint
// gets their count before the first call. (UIDs as substrings of one
// copy of the file and payloads in one array, two allocations instead of
// two per FIP, were tried: cachegrind counted 2x the last-level misses of
// a build of 100k, the slabs being written then read back cold.)
func decodeSnapshot(b []byte, boot string, id uint64, hint func(n int), fip func(o nat.Object) error) error {
	if len(b) < len(snapMagic)+4 || !bytes.HasPrefix(b, snapMagic) {
		return fmt.Errorf("%w: not a snapshot of this format", errSnapshot)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, snapCRC) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("%w: checksum differs", errSnapshot)
	}
	r := body[len(snapMagic):]
	next := func(n int) ([]byte, bool) {
		if n < 0 || n > len(r) {
			return nil, false
		}
		v := r[:n]
		r = r[n:]
		return v, true
	}
	uvarint := func() (int, bool) {
		v, n := binary.Uvarint(r)
		if n <= 0 || v > uint64(len(b)) {
			return 0, false
		}
		r = r[n:]
		return int(v), true
	}
	short := fmt.Errorf("%w: truncated", errSnapshot)
	n, ok := uvarint()
	if !ok {
		return short
	}
	bt, ok := next(n)
	if !ok {
		return short
	}
	if string(bt) != boot {
		return fmt.Errorf("%w: boot id %q, the table's is %q", errSnapshot, bt, boot)
	}
	v, ok := next(8)
	if !ok {
		return short
	}
	if got := binary.BigEndian.Uint64(v); got != id {
		return fmt.Errorf("%w: id %016x, natgw_meta names %016x", errSnapshot, got, id)
	}
	count, ok := uvarint()
	if !ok {
		return short
	}
	// Every FIP takes at least 2+2*4 bytes of the file: a count the file
	// cannot hold is refused before anything is allocated for it.
	if count > len(r)/10 {
		return fmt.Errorf("%w: %d FIPs in %d bytes", errSnapshot, count, len(r))
	}
	hint(count)
	for i := range count {
		l, ok := uvarint()
		if !ok {
			return short
		}
		uid, ok := next(l)
		if !ok {
			return short
		}
		al, ok := next(1)
		if !ok || (al[0] != 4 && al[0] != 16) {
			return fmt.Errorf("%w: FIP %d: bad address length", errSnapshot, i)
		}
		a, ok := next(2 * int(al[0]))
		if !ok {
			return short
		}
		f := &nat.FIP{}
		if al[0] == 4 {
			f.EIP, f.InternalIP = netip.AddrFrom4([4]byte(a[:4])), netip.AddrFrom4([4]byte(a[4:]))
		} else {
			f.EIP, f.InternalIP = netip.AddrFrom16([16]byte(a[:16])), netip.AddrFrom16([16]byte(a[16:]))
		}
		if err := fip(nat.Object{UID: string(uid), Kind: nat.KindFIP, FIP: f}); err != nil {
			return err
		}
	}
	if len(r) != 0 {
		return fmt.Errorf("%w: %d bytes after the last FIP", errSnapshot, len(r))
	}
	return nil
}

// writeSnapshot writes the snapshot file of fips into dir atomically
// (a temporary file renamed over the old one).
func writeSnapshot(dir, boot string, id uint64, fips []nat.Object) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write index snapshot: %w", err)
	}
	f, err := os.CreateTemp(dir, snapFile+".*")
	if err != nil {
		return fmt.Errorf("write index snapshot: %w", err)
	}
	_, err = f.Write(encodeSnapshot(boot, id, fips))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, snapFile))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write index snapshot in %s: %w", dir, err)
	}
	return nil
}

// fipsOf returns the FIPs of st.
func fipsOf(st *nat.State) []nat.Object {
	var fips []nat.Object
	for _, o := range st.Unordered() {
		if o.Kind == nat.KindFIP {
			fips = append(fips, o)
		}
	}
	return fips
}
