package nftables

import (
	"fmt"
	"slices"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// Plan returns the transaction that creates natgw's table for cfg holding
// objs, from nothing, with boot as its boot id: the layout without a
// kernel. Its String is the table in nft syntax, one command per line and
// one command per element (see nat/README.md and
// testdata/golden/plan.nft). Five of the fixed rules use expressions nft
// shows but cannot parse (`ct mark set ip daddr`: natgw copies an address
// into the mark with a byteorder expression nft has no syntax for), so the
// text is for people and golden tests, not for `nft -f`; TestListing
// checks, in the kernel, that it says what the netlink batch does.
func Plan(cfg nat.Config, objs []nat.Object, boot string) (*nftconn.Tx, error) {
	cfg = cfg.WithDefaults()
	if err := checkInterfaces(cfg); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	st := nat.NewState()
	for _, o := range objs {
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		if err := st.Insert(o); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
	}
	add, err := renderBulk(objs)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	ch := &change{createTable: true, bootID: boot, fixedChains: true, stamp: true, add: add,
		qosBefore: map[qosKey]qosState{}, qosAfter: map[qosKey]qosVal{}, snatBefore: map[snatClass]bool{}}
	structureOf(slices.Values(objs), ch)
	ch.shareBefore, ch.shareAfter = map[shareKey][]nat.Object{}, shareWanted(slices.Values(objs))
	if err := checkShare(ch.shareAfter); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if _, err := (&Backend{}).markFull(ch, objs); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	r := &Backend{cfg: cfg}
	return &r.plan(ch).tx, nil
}
