package shape

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
)

// GatewayMinorBase is the first class minor of gateway-wide QoS classes
// (nat/gwqos) under natgw's root qdisc 4e47:; EIP classes stay below it.
// Both live under the same root HTB, as upstream's EIP and gateway-wide
// classes are siblings under its 1:, so a packet goes to exactly one class.
const GatewayMinorBase = 0x8000

// GatewayClass is one gateway-wide QoS class: on Device, 4e47:Minor
// (Minor at least GatewayMinorBase), shaped to Limit.
type GatewayClass struct {
	Device string
	Minor  uint16
	Limit  Limit
}

// SetGateway makes the gateway-wide classes of cfg's namespace exactly
// want (prev is what the caller's table says is there now), around commit,
// the caller's nftables transaction that points packets at them: wanted
// classes (and root qdiscs) are added or changed first, then commit runs;
// if it fails, the class changes are undone (prev's limits put back, new
// classes and qdiscs removed) and its error returned. After commit, classes
// of minor GatewayMinorBase or above that want does not hold are deleted,
// and natgw's root qdisc of an interface left without classes. Everything
// is validated first; an interface whose root qdisc is someone else's is
// refused before anything is touched.
func SetGateway(ctx context.Context, cfg nat.Config, prev, want []GatewayClass, commit func() error) error {
	cfg = cfg.WithDefaults()
	for i, c := range want {
		if c.Minor < GatewayMinorBase || c.Minor == 0xffff {
			return &nat.FieldError{Field: fmt.Sprintf("classes[%d].minor", i), Value: fmt.Sprint(c.Minor), Reason: fmt.Sprintf("want %#x to 0xfffe", GatewayMinorBase)}
		}
		if c.Limit.RateMbps == 0 {
			return &nat.FieldError{Field: fmt.Sprintf("classes[%d].limit.rateMbps", i), Value: "0", Reason: "a gateway-wide class needs a rate"}
		}
		if err := c.Limit.Validate(fmt.Sprintf("classes[%d].limit", i)); err != nil {
			return err
		}
	}
	return withKernel(ctx, cfg, func(k *kernel) error { return k.setGateway(prev, want, commit) })
}

func (k *kernel) setGateway(prev, want []GatewayClass, commit func() error) (err error) {
	links := map[string]netlink.Link{}
	ours := map[string]bool{}
	for _, c := range want {
		if links[c.Device] != nil {
			continue
		}
		l, err := k.link(c.Device)
		if err != nil {
			return err
		}
		o, err := k.rootState(l)
		if err != nil {
			return err
		}
		links[c.Device], ours[c.Device] = l, o
	}
	prevBy := map[[2]any]GatewayClass{}
	for _, c := range prev {
		prevBy[[2]any{c.Device, c.Minor}] = c
	}
	var undo undoList
	defer undo.onError(&err)
	existing := map[string]map[uint16]uint64{} // minor: rate (bytes/s)
	for dev, l := range links {
		existing[dev] = map[uint16]uint64{}
		if !ours[dev] {
			q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(Major, 0), Parent: netlink.HANDLE_ROOT})
			if err := k.h.QdiscAdd(q); err != nil {
				return fmt.Errorf("shape: add htb qdisc %x: on %s: %w", Major, dev, err)
			}
			undo = append(undo, func() error { return k.h.QdiscDel(q) })
			continue
		}
		rates, err := k.classRates(dev)
		if err != nil {
			return err
		}
		existing[dev] = rates
	}
	for _, c := range want {
		l := links[c.Device]
		cl := class{minor: c.Minor, lim: c.Limit}
		old, had := prevBy[[2]any{c.Device, c.Minor}]
		rate, there := existing[c.Device][c.Minor]
		if had && there && old.Limit == c.Limit && rate == c.Limit.rate() {
			continue
		}
		if err := k.h.ClassReplace(htbClass(l, cl)); err != nil {
			return fmt.Errorf("shape: gateway class %x:%x (%g Mbit/s, burst %g MB) on %s: %w", Major, c.Minor, c.Limit.RateMbps, c.Limit.BurstMB, c.Device, err)
		}
		if err := k.setLeaf(l, cl); err != nil {
			return err
		}
		if had && there {
			undo = append(undo, func() error { return k.h.ClassReplace(htbClass(l, class{minor: old.Minor, lim: old.Limit})) })
		} else {
			undo = append(undo, func() error { return k.h.ClassDel(classRef(l, c.Minor)) })
		}
	}
	if err := commit(); err != nil {
		return err
	}
	undo = nil
	// Classes and qdiscs no longer used, on every interface with natgw's
	// root qdisc.
	keep := map[[2]any]bool{}
	for _, c := range want {
		keep[[2]any{c.Device, c.Minor}] = true
	}
	all, err := k.h.LinkList()
	if err != nil {
		return fmt.Errorf("shape: list links: %w", err)
	}
	var errs []error
	for _, l := range all {
		if o, err := k.rootState(l); err != nil || !o {
			continue
		}
		cls, err := k.h.ClassList(l, netlink.MakeHandle(Major, 0))
		if err != nil {
			errs = append(errs, fmt.Errorf("shape: list classes of %s: %w", l.Attrs().Name, err))
			continue
		}
		for _, c := range cls {
			m := uint16(c.Attrs().Handle)
			if m < GatewayMinorBase || keep[[2]any{l.Attrs().Name, m}] {
				continue
			}
			if err := k.h.ClassDel(classRef(l, m)); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("shape: delete class %x:%x of %s: %w", Major, m, l.Attrs().Name, err))
			}
		}
		errs = append(errs, k.dropEmptyRoot(l))
	}
	return errors.Join(errs...)
}

// dropEmptyRoot deletes natgw's root qdisc of l when no class is left under
// it (EIP classes and gateway-wide classes share it).
func (k *kernel) dropEmptyRoot(l netlink.Link) error {
	cls, err := k.h.ClassList(l, netlink.MakeHandle(Major, 0))
	if err != nil {
		return fmt.Errorf("shape: list classes of %s: %w", l.Attrs().Name, err)
	}
	if slices.ContainsFunc(cls, func(c netlink.Class) bool { return c.Attrs().Handle>>16 == Major }) {
		return nil
	}
	q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(Major, 0), Parent: netlink.HANDLE_ROOT})
	if err := k.h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("shape: delete htb qdisc %x: of %s: %w", Major, l.Attrs().Name, err)
	}
	return nil
}

// MaxGatewayClasses is how many gateway-wide classes fit their minors.
const MaxGatewayClasses = 0xffff - GatewayMinorBase

// HoldsGateway says whether every class of want is in cfg's kernel, under
// natgw's root qdisc, with its rate (what a class deleted or changed by
// hand lacks).
func HoldsGateway(ctx context.Context, cfg nat.Config, want []GatewayClass) (bool, error) {
	cfg = cfg.WithDefaults()
	held := true
	err := withKernel(ctx, cfg, func(k *kernel) error {
		var err error
		held, err = k.holds(want)
		return err
	})
	return held, err
}

// holds says whether each class of want is on its device with its rate.
func (k *kernel) holds(want []GatewayClass) (bool, error) {
	byDev := map[string]map[uint16]uint64{}
	for _, c := range want {
		have, ok := byDev[c.Device]
		if !ok {
			var err error
			if have, err = k.classRates(c.Device); err != nil {
				return false, err
			}
			byDev[c.Device] = have
		}
		if r, ok := have[c.Minor]; !ok || r != c.Limit.rate() {
			return false, nil
		}
	}
	return true, nil
}

// classRates returns the rate (bytes/s) of each of natgw's HTB classes on
// dev whose ceil is its rate, by minor (none when there is no dev).
func (k *kernel) classRates(dev string) (map[uint16]uint64, error) {
	have := map[uint16]uint64{}
	l, err := k.h.LinkByName(dev)
	if err != nil {
		return have, nil
	}
	cls, err := k.h.ClassList(l, netlink.MakeHandle(Major, 0))
	if err != nil {
		return nil, fmt.Errorf("shape: list classes of %s: %w", dev, err)
	}
	for _, x := range cls {
		if h, ok := x.(*netlink.HtbClass); ok && h.Handle>>16 == Major && h.Rate == h.Ceil {
			have[uint16(h.Handle)] = h.Rate
		}
	}
	return have, nil
}
