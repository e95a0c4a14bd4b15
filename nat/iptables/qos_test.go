package iptables

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
)

// udpBytes sends n datagrams of size bytes from sendNS to dst, paced at about
// 40 Mbit/s, and returns how many bytes a listener on listen in recvNS got
// and how long the sending took.
func udpBytes(t *testing.T, recvNS, listen, sendNS, dst string, n, size int) (int, time.Duration) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(recvNS, func() (err error) {
		pc, err = net.ListenPacket("udp4", listen)
		return err
	}); err != nil {
		t.Fatalf("listen %s in %s: %v", listen, recvNS, err)
	}
	defer pc.Close()
	if u, ok := pc.(*net.UDPConn); ok {
		_ = u.SetReadBuffer(8 << 20)
	}
	got := make(chan int)
	go func() {
		total, buf := 0, make([]byte, 64<<10)
		for {
			_ = pc.SetReadDeadline(time.Now().Add(time.Second))
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				got <- total
				return
			}
			total += k
		}
	}()
	var c net.Conn
	if err := netns.Do(sendNS, func() (err error) {
		c, err = net.Dial("udp4", dst)
		return err
	}); err != nil {
		t.Fatalf("dial %s from %s: %v", dst, sendNS, err)
	}
	defer c.Close()
	payload := make([]byte, size)
	start := time.Now()
	for i := 0; i < n; i++ {
		_, _ = c.Write(payload) // ICMP errors may surface as write errors: ignore
		if i%50 == 49 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	took := time.Since(start)
	return <-got, took
}

// TestKernelQoSPolices sends 2 MB through a FIP in each direction, first
// without QoS (nearly everything arrives), then with 1 Mbit/s on the EIP in
// that direction: hashlimit lets through one second of credit (125 kB) plus
// 125 kB per second of sending.
func TestKernelQoSPolices(t *testing.T) {
	e := newKEnv(t)
	vm := e.gw.VMs[0]
	eip := nat.Object{UID: "eip-q", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip0, PrefixLen: 24}}
	e.apply(eip, nat.Object{UID: "fip-q", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: vm.Addr}})
	const n, size = 2000, 1000
	dirs := []struct {
		name           string
		recvNS, listen string
		sendNS, dst    string
		qos            nat.QoS
	}{
		{"ingress", vm.NS, vm.Addr.String() + ":9001", e.gw.Ext.NS, eip0.String() + ":9001", nat.QoS{IngressRateMbps: 1}},
		{"egress", e.gw.Ext.NS, e.gw.Ext.Addr.String() + ":9002", vm.NS, e.gw.Ext.Addr.String() + ":9002", nat.QoS{EgressRateMbps: 1}},
	}
	for _, d := range dirs {
		t.Run(d.name, func(t *testing.T) {
			e.apply(eip) // no QoS
			free, _ := udpBytes(t, d.recvNS, d.listen, d.sendNS, d.dst, n, size)
			if free < n*size*8/10 {
				t.Fatalf("without QoS only %d of %d bytes arrived", free, n*size)
			}
			q := eip
			q.EIP = &nat.EIP{Address: eip0, PrefixLen: 24, QoS: &d.qos}
			e.apply(q)
			limited, took := udpBytes(t, d.recvNS, d.listen, d.sendNS, d.dst, n, size)
			bound := 250_000 + int(took.Seconds()*125_000*1.5)
			t.Logf("%s: %d bytes without QoS, %d with 1 Mbit/s over %v (bound %d)", d.name, free, limited, took, bound)
			if limited > bound || limited == 0 || bound > n*size/2 {
				t.Fatalf("with 1 Mbit/s %s QoS %d bytes of %d arrived in %v, want 0 < x <= %d (and a bound well under the total)", d.name, limited, n*size, took, bound)
			}
		})
	}
}

// TestKernelFailedRestoreChangesNothing: when the kernel refuses a restore
// (here a -D of a rule removed by hand), the call fails, iptables-save is
// unchanged and the index still holds the object; Reload then repairs.
func TestKernelFailedRestoreChangesNothing(t *testing.T) {
	e := newKEnv(t)
	fip := nat.Object{UID: "fip-0", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: vm0}}
	e.apply(fip)
	rule := e.chain(chainExclusiveDNAT)[0]
	args, err := splitArgs(strings.TrimPrefix(rule, "-A "))
	if err != nil {
		t.Fatal(err)
	}
	e.sh(append([]string{"iptables-legacy", "-t", "nat", "-D"}, args...)...)
	before := e.save()
	err = e.dp.Delete(e.ctx, fip.UID)
	if err == nil || errors.Is(err, nat.ErrUnknownState) {
		t.Fatalf("delete with a rule missing: err = %v, want a plain error", err)
	}
	if after := e.save(); after != before {
		t.Fatalf("failed restore changed the kernel:\n%s\n---\n%s", before, after)
	}
	e.wantList(fip)
	if err := e.dp.Reload(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.chain(chainExclusiveDNAT); len(got) != 1 || got[0] != rule {
		t.Fatalf("reload did not restore %q: %q", rule, got)
	}
	if err := e.dp.Delete(e.ctx, fip.UID); err != nil {
		t.Fatalf("delete after repair: %v", err)
	}
	e.wantList()
}

// TestKernelForeignRulesUntouched: rules and chains of others, in the
// tables we write and in others, stay byte-identical through every call.
func TestKernelForeignRulesUntouched(t *testing.T) {
	lab := netlab.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	foreign := `*nat
:FOREIGN - [0:0]
-A PREROUTING -d 203.0.113.5/32 -j DNAT --to-destination 198.51.100.99
-A POSTROUTING -s 203.0.113.0/24 -j MASQUERADE
-A FOREIGN -m comment --comment "not ours" -j RETURN
COMMIT
*mangle
-A PREROUTING -i net1 -j MARK --set-xmark 0x1/0x1
-A POSTROUTING -j RETURN
COMMIT
*filter
-A FORWARD -s 203.0.113.0/24 -j DROP
COMMIT
`
	if _, err := netlab.Exec(ctx, gw.GW, foreign, "iptables-legacy-restore", "--noflush"); err != nil {
		t.Fatal(err)
	}
	others := func() string {
		out, err := netlab.IptablesSave(ctx, gw.GW, true)
		if err != nil {
			t.Fatal(err)
		}
		var keep []string
		for _, l := range strings.Split(out, "\n") {
			if !strings.Contains(l, "NATGW_") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	}
	base := others()
	dp, err := New(ctx, gw.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	check := func(step string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if got := others(); got != base {
			t.Fatalf("%s changed foreign rules:\n%s\n--- was ---\n%s", step, got, base)
		}
	}
	check("open", nil)
	objs := testObjects()
	check("apply", dp.Apply(ctx, objs...))
	moved := objs[2]
	moved.FIP = &nat.FIP{EIP: eip0, InternalIP: netip.MustParseAddr("198.51.100.50")}
	check("update", dp.Apply(ctx, moved))
	check("delete", dp.Delete(ctx, "snat-0", "dnat-0"))
	check("sync", dp.Sync(ctx, objs[:2]))
	check("reload", dp.Reload(ctx))
}
