package ctsync

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftables"
)

// TestReplicateConnections (root): real TCP connections through natgw's
// nftables data plane, one DNATed from outside to a VPC host and one
// SNATed from a VPC host to outside, on an EIP of each family (IPv4 on the
// standard topology, IPv6 on the dual-stack one): the Sender in the
// gateway's namespace streams their conntrack entries to a Receiver in a
// standby namespace, where each is recreated with the active's tuples
// (the DNAT binding and the SNAT's chosen port) and the NAT status.
func TestReplicateConnections(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "IPv4"
		if v6 {
			name = "IPv6"
		}
		t.Run(name, func(t *testing.T) { testReplicateConnections(t, v6) })
	}
}

func testReplicateConnections(t *testing.T, v6 bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{IPv6: v6})
	if err != nil {
		t.Fatal(err)
	}
	dp, err := nftables.New(ctx, gw.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	host := func(h netlab.Host) netip.Addr {
		if v6 {
			return h.Addr6
		}
		return h.Addr
	}
	eip, eipObj, vpc := netlab.EIP(0), nattest.EIP(nattest.UID(nat.KindEIP, 0), netlab.EIP(0)), netlab.VPCNet
	if v6 {
		eip, eipObj, vpc = netlab.EIP6(0), nattest.EIP6(nattest.UID(nat.KindEIP, 0), netlab.EIP6(0)), netlab.VPCNet6
	}
	vm, ext := gw.VMs[0], gw.Ext
	if err := dp.Apply(ctx, eipObj,
		nattest.DNAT(nattest.UID(nat.KindDNAT, 0), eip, nat.TCP, 2222, host(vm), 8080),
		nattest.SNAT(nattest.UID(nat.KindSNAT, 0), eip, vpc, false)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		ns   string
		addr netip.AddrPort
	}{{vm.NS, netip.AddrPortFrom(host(vm), 8080)}, {ext.NS, netip.AddrPortFrom(host(ext), 9090)}} {
		if _, err := lab.ServeTCP(ctx, s.ns, s.addr.String()); err != nil {
			t.Fatal(err)
		}
	}

	// The standby: a namespace joined to the gateway's by a veth (the
	// replication link, untranslated), a Receiver in it; the Sender in
	// the gateway's namespace.
	r := newRepLabOn(t, ctx, lab, gw.GW, "ha0")
	r.startSender(ctx)
	defer r.stopSender()
	waitFor(t, "first sync", 5*time.Second, r.recv.Synced)

	// Two live connections: DNAT in, SNAT out.
	for _, c := range []struct{ ns, dst string }{
		{ext.NS, netip.AddrPortFrom(eip, 2222).String()},
		{vm.NS, netip.AddrPortFrom(host(ext), 9090).String()},
	} {
		conn, _, err := netlab.Connect(ctx, c.ns, c.dst, netlab.DialTimeout)
		if err != nil {
			t.Fatalf("connect from %s to %s: %v", c.ns, c.dst, err)
		}
		defer conn.Close()
	}

	// The active's entries of the two connections, as the kernel made
	// them, recreated on the standby.
	flows := dumpFlows(t, r.act)
	var nated []Entry
	dnat, snat := 0, 0
	for i := range flows {
		if !Replicated(&flows[i]) {
			continue
		}
		e := FromFlow(OpUpsert, &flows[i])
		switch {
		case e.OrigDst.Addr() == eip && e.ReplySrc.Addr() == host(vm):
			dnat++
		case e.OrigSrc.Addr() == host(vm) && e.ReplyDst.Addr() == eip:
			snat++
		default:
			continue
		}
		nated = append(nated, e)
	}
	if dnat == 0 || snat == 0 {
		t.Fatalf("active: %d DNATed and %d SNATed entries through %s, want both (entries: %v)", dnat, snat, eip, flows)
	}
	waitNATed(t, r.sb, "standby", nated, nil)
	t.Logf("%d entries (%d DNAT, %d SNAT) of %s recreated on the standby with their bindings", len(nated), dnat, snat, eip)
}
