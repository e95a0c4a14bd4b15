package gwqos

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/shape"
)

var update = flag.Bool("update", false, "rewrite testdata/table.nft")

var pfx = netip.MustParsePrefix

// TestValidate: every field's refusal names the field and the value.
func TestValidate(t *testing.T) {
	ok := Rule{Direction: Egress, Iface: "net1", Priority: 1, Classifier: U32, MatchDir: "src", CIDR: pfx("10.0.0.0/24"), RateMbps: 10, BurstMB: 1}
	all := Rule{Direction: Ingress, Iface: "net1", Classifier: MatchAll, RateMbps: 0.5}
	for _, tt := range []struct {
		name  string
		mod   func(*Rule)
		base  Rule
		field string
		value string
	}{
		{"valid u32", func(*Rule) {}, ok, "", ""},
		{"valid matchall, zero burst", func(*Rule) {}, all, "", ""},
		{"direction", func(r *Rule) { r.Direction = "both" }, ok, "direction", "both"},
		{"interface empty", func(r *Rule) { r.Iface = "" }, ok, "interface", ""},
		{"interface too long", func(r *Rule) { r.Iface = "abcdefghijklmnop" }, ok, "interface", "abcdefghijklmnop"},
		{"interface blank", func(r *Rule) { r.Iface = "net 1" }, ok, "interface", "net 1"},
		{"classifier", func(r *Rule) { r.Classifier = "fw" }, ok, "classifier", "fw"},
		{"match direction", func(r *Rule) { r.MatchDir = "up" }, ok, "matchDirection", "up"},
		{"cidr missing", func(r *Rule) { r.CIDR = netip.Prefix{} }, ok, "cidr", "invalid Prefix"},
		{"cidr IPv6", func(r *Rule) { r.CIDR = pfx("2001:db8::/64") }, ok, "cidr", "2001:db8::/64"},
		{"cidr host bits", func(r *Rule) { r.CIDR = pfx("10.0.0.1/24") }, ok, "cidr", "10.0.0.1/24"},
		{"matchall with a cidr", func(r *Rule) { r.CIDR = pfx("10.0.0.0/24") }, all, "matchDirection", " 10.0.0.0/24"},
		{"rate zero", func(r *Rule) { r.RateMbps = 0 }, ok, "rateMbps", "0"},
		{"rate above HTB's 34359", func(r *Rule) { r.RateMbps = 34_360 }, ok, "rateMbps", "34360"},
		{"burst negative", func(r *Rule) { r.BurstMB = -1 }, ok, "burstMB", "-1"},
		{"burst above 32 bits of bytes", func(r *Rule) { r.BurstMB = 4096 }, ok, "burstMB", "4096"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.base
			tt.mod(&r)
			err := ValidateAll([]Rule{ok, r})
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", r, err)
				}
				return
			}
			var fe *nat.FieldError
			if !errors.As(err, &fe) || fe.Field != "qos[1]."+tt.field || fe.Value != tt.value {
				t.Fatalf("ValidateAll = %v (%#v), want field qos[1].%s value %q", err, fe, tt.field, tt.value)
			}
		})
	}
}

// TestKeyAndString: the rule identity qos-add/qos-del use and the rule as
// qos-add's argument.
func TestKeyAndString(t *testing.T) {
	u := Rule{Direction: Egress, Iface: "net1", Priority: 2, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.168.1.0/24"), RateMbps: 1.5, BurstMB: 0.5}
	m := Rule{Direction: Ingress, Iface: "net1", Priority: 3, Classifier: MatchAll, RateMbps: 25, BurstMB: 25}
	for _, tt := range []struct {
		r         Rule
		key, text string
	}{
		{u, "egress net1 u32 dst 192.168.1.0/24", "egress,net1,2,u32,ip,dst,192.168.1.0/24,1.5,0.5"},
		{m, "ingress net1 matchall", "ingress,net1,3,matchall,,,,25,25"},
	} {
		if tt.r.Key() != tt.key || tt.r.String() != tt.text {
			t.Errorf("Key, String = %q, %q; want %q, %q", tt.r.Key(), tt.r.String(), tt.key, tt.text)
		}
	}
}

// kernelNS is a test namespace with stub interfaces eth0, net1 and net2
// (the classes need them), or a skip when not root.
func kernelNS(t *testing.T) (*netlab.Lab, string) {
	t.Helper()
	lab := netlab.ForTest(t)
	ns, err := lab.NS("gw")
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"eth0", "net1", "net2"} {
		if err := netlab.Stub(ns, dev); err != nil {
			t.Fatal(err)
		}
	}
	return lab, ns
}

func nftTable(t *testing.T, ns string) (string, bool) {
	t.Helper()
	out, err := netlab.NftTable(context.Background(), ns, "ip", table.Name)
	if err != nil {
		if _, lerr := netlab.Exec(context.Background(), ns, "", "nft", "list", "tables"); lerr != nil {
			t.Fatal(lerr)
		}
		return "", false
	}
	return out, true
}

// TestSetKernel: in a real namespace, Set programs exactly the layout of
// nat/README.md (golden testdata/table.nft: order by priority, ties in
// list order, user data), replaces everything on the next call (also
// rules the compat path added), and removes the table when the list is
// empty; Apply adds and deletes by key; a table of someone else's stays
// byte-identical throughout.
func TestSetKernel(t *testing.T) {
	_, ns := kernelNS(t)
	ctx := context.Background()
	const foreign = `table ip other {
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "net1" ip saddr 10.9.0.0/16 limit rate over 1000 kbytes/second burst 100000 bytes drop
		iifname "net1" counter packets 0 bytes 0 accept
	}
}
`
	if _, err := netlab.Exec(ctx, ns, foreign, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	otherBefore, err := netlab.NftTable(ctx, ns, "ip", "other")
	if err != nil {
		t.Fatal(err)
	}
	checkOther := func(when string) {
		t.Helper()
		if got, err := netlab.NftTable(ctx, ns, "ip", "other"); err != nil || got != otherBefore {
			t.Fatalf("%s: table ip other changed (%v):\n%s\nwas:\n%s", when, err, got, otherBefore)
		}
	}

	// The rootless golden's rules (TestLayoutGolden) first: the kernel
	// lists each rule as its Text says.
	if err := Set(t.Context(), nat.Config{NetNS: ns}, goldenRules()); err != nil {
		t.Fatal(err)
	}
	listed, ok := nftTable(t, ns)
	if !ok {
		t.Fatal("no table after Set")
	}
	f := nftconn.NewFake()
	fakeWrite(t, f, adds(goldenRules()), true)
	if miss := f.NotListed(table, listed); miss != nil {
		t.Errorf("the kernel does not list %q as the rootless golden has it:\n%s", miss, listed)
	}

	rules := []Rule{
		{Direction: Egress, Iface: "net1", Priority: 3, Classifier: MatchAll, RateMbps: 16, BurstMB: 1},
		{Direction: Egress, Iface: "net1", Priority: 1, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.1/32"), RateMbps: 1000, BurstMB: 10},
		{Direction: Ingress, Iface: "net1", Priority: 2, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.0/24"), RateMbps: 12.5, BurstMB: 0.5},
		// Same priority as the one before it in its chain: after it.
		{Direction: Ingress, Iface: "net2", Priority: 2, Classifier: U32, MatchDir: "src", CIDR: pfx("10.0.0.0/8"), RateMbps: 8, BurstMB: 0},
		// Policed (compat's EIP QoS with --eip-qos=police): no class.
		{Direction: Egress, Iface: "net1", Priority: 2, Classifier: U32, MatchDir: "src", CIDR: pfx("192.0.2.10/32"), RateMbps: 10, BurstMB: 1, Police: true},
	}
	if err := Set(t.Context(), nat.Config{NetNS: ns}, rules); err != nil {
		t.Fatal(err)
	}
	got, ok := nftTable(t, ns)
	if !ok {
		t.Fatal("no table after Set")
	}
	golden.Check(t, "testdata/table.nft", got, *update)                   // go test -update rewrites it
	wantOrder := []Rule{rules[1], rules[2], rules[3], rules[4], rules[0]} // by priority, ties in list order
	if l, err := List(t.Context(), nat.Config{NetNS: ns}); err != nil || !reflect.DeepEqual(l, wantOrder) {
		t.Fatalf("List = %+v, %v; want %+v", l, err, wantOrder)
	}
	checkOther("after Set")

	// The compat path adds by key on top...
	extra := Rule{Direction: Ingress, Iface: "net1", Priority: 9, Classifier: MatchAll, RateMbps: 1, BurstMB: 1}
	if err := Apply(t.Context(), nat.Config{NetNS: ns}, []Change{{Add: true, Rule: extra}, {Rule: rules[1]}}); err != nil {
		t.Fatal(err)
	}
	if l, _ := List(t.Context(), nat.Config{NetNS: ns}); !reflect.DeepEqual(l, []Rule{rules[2], rules[3], rules[4], rules[0], extra}) {
		t.Fatalf("after Apply: %+v", l)
	}
	// ...and Set replaces all of it; a later rule of one key replaces an
	// earlier one.
	repl := Rule{Direction: Egress, Iface: "net1", Priority: 5, Classifier: U32, MatchDir: "src", CIDR: pfx("192.0.2.10/32"), RateMbps: 2, BurstMB: 2}
	repl2 := repl
	repl2.RateMbps = 3
	if err := Set(t.Context(), nat.Config{NetNS: ns}, []Rule{repl, repl2}); err != nil {
		t.Fatal(err)
	}
	if l, err := List(t.Context(), nat.Config{NetNS: ns}); err != nil || !reflect.DeepEqual(l, []Rule{repl2}) {
		t.Fatalf("after the second Set: %+v, %v; want only %+v", l, err, repl2)
	}
	got, _ = nftTable(t, ns)
	if strings.Count(got, "meta priority set") != 1 || !strings.Contains(got, `oifname "net1" ip saddr 192.0.2.10 meta priority set 4e47:8004 accept`) {
		t.Fatalf("after the second Set the table is:\n%s", got)
	}
	// One class left, on net1 at 3 Mbit/s with a 2 MB burst; eth0's and
	// net2's qdiscs are gone with their classes.
	for dev, want := range map[string]string{"net1": "class htb 4e47:8004 root prio 0 rate 3Mbit ceil 3Mbit burst 2Mb cburst 2Mb", "eth0": "", "net2": ""} {
		out, err := netlab.Exec(ctx, ns, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != want {
			t.Errorf("tc class show dev %s after the second Set:\n%s\nwant %q", dev, out, want)
		}
	}
	checkOther("after the second Set")

	// A refused list changes nothing.
	bad := repl
	bad.Iface = ""
	if err := Set(t.Context(), nat.Config{NetNS: ns}, []Rule{repl, bad}); err == nil || !strings.Contains(err.Error(), "qos[1].interface") {
		t.Fatalf("Set with an empty interface = %v, want an error naming qos[1].interface", err)
	}
	if l, _ := List(t.Context(), nat.Config{NetNS: ns}); !reflect.DeepEqual(l, []Rule{repl2}) {
		t.Fatalf("a refused Set changed the rules: %+v", l)
	}
	// So does a rule the kernel cannot take (no such interface): the
	// valid rule before it is not half-applied, table and classes stay.
	tableBefore, _ := nftTable(t, ns)
	classesBefore, _ := netlab.Exec(ctx, ns, "", "tc", "class", "show", "dev", "net1")
	gone := Rule{Direction: Egress, Iface: "net9", Priority: 1, Classifier: MatchAll, RateMbps: 5}
	newOne := Rule{Direction: Egress, Iface: "net1", Priority: 1, Classifier: MatchAll, RateMbps: 7}
	if err := Set(t.Context(), nat.Config{NetNS: ns}, []Rule{newOne, gone}); err == nil || !strings.Contains(err.Error(), "net9") {
		t.Fatalf("Set with a rule on a missing interface = %v, want an error naming net9", err)
	}
	if got, _ := nftTable(t, ns); got != tableBefore {
		t.Fatalf("a failed Set changed the table:\n%s\nwas:\n%s", got, tableBefore)
	}
	if got, _ := netlab.Exec(ctx, ns, "", "tc", "class", "show", "dev", "net1"); got != classesBefore {
		t.Fatalf("a failed Set changed the classes:\n%s\nwas:\n%s", got, classesBefore)
	}

	// Nothing left: no table; Set of nothing on no table is a no-op.
	for i := range 2 {
		if err := Set(t.Context(), nat.Config{NetNS: ns}, nil); err != nil {
			t.Fatalf("Set(nil) #%d: %v", i+1, err)
		}
		if out, ok := nftTable(t, ns); ok {
			t.Fatalf("Set(nil) #%d left the table:\n%s", i+1, out)
		}
	}
	if l, err := List(t.Context(), nat.Config{NetNS: ns}); err != nil || len(l) != 0 {
		t.Fatalf("List without a table = %v, %v", l, err)
	}
	checkOther("after Set(nil)")
}

// TestLimitPackets: real UDP floods from ext through the gateway's net1 to
// two VPC hosts, with one ingress rule (u32 dst host 1's /32, 8 Mbit/s,
// burst 0.25 MB) set through Set: host 1 receives no more than the rate
// allows (the class's burst, plus the rate over the flood's time; the
// bound keeps one more second of rate, what a policer would let through),
// host 2, outside the CIDR, receives
// several times that; after Set(nil) host 1 is unlimited again.
func TestLimitPackets(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 2})
	if err != nil {
		t.Fatal(err)
	}
	// ext reaches the VPC through the gateway (routing only, no NAT).
	if err := netlab.AddRoute(gw.Ext.NS, netlab.VPCNet, netlab.GWExtAddr, "eth0"); err != nil {
		t.Fatal(err)
	}
	const rateMbps, burstMB = 8.0, 0.25
	limited := Rule{Direction: Ingress, Iface: gw.ExternalInterface, Priority: 1, Classifier: U32, MatchDir: "dst",
		CIDR: netip.PrefixFrom(gw.VMs[0].Addr, 32), RateMbps: rateMbps, BurstMB: burstMB}
	if err := Set(t.Context(), gw.Config(), []Rule{limited}); err != nil {
		t.Fatal(err)
	}
	const flood = 1500 * time.Millisecond
	allowed := func(d time.Duration) float64 { // bytes the limit lets through in d
		return rateMbps*1e6/8*(1+d.Seconds()) + burstMB*BytesPerMB
	}
	got1, d1 := udpFlood(t, gw.Ext.NS, gw.VMs[0], flood)
	got2, d2 := udpFlood(t, gw.Ext.NS, gw.VMs[1], flood)
	max1 := allowed(d1) * 1.1
	t.Logf("limited host %s: %d bytes in %v (%.1f Mbit/s; at most %.0f bytes); other host %s: %d bytes in %v (%.1f Mbit/s)",
		gw.VMs[0].Addr, got1, d1, float64(got1)*8/d1.Seconds()/1e6, max1, gw.VMs[1].Addr, got2, d2, float64(got2)*8/d2.Seconds()/1e6)
	if float64(got1) > max1 {
		t.Errorf("host %s behind a %g Mbit/s rule received %d bytes in %v, more than the limit allows (%.0f)", gw.VMs[0].Addr, rateMbps, got1, d1, max1)
	}
	if float64(got1) < allowed(d1)*0.5 {
		t.Errorf("host %s received only %d bytes in %v: the limit let much less than its rate through (%.0f)", gw.VMs[0].Addr, got1, d1, allowed(d1))
	}
	if float64(got2) < 3*allowed(d2) {
		t.Errorf("host %s outside the rule's CIDR received %d bytes in %v, not well above the limit (%.0f): the rule matched it", gw.VMs[1].Addr, got2, d2, allowed(d2))
	}
	if err := Set(t.Context(), gw.Config(), nil); err != nil {
		t.Fatal(err)
	}
	got3, d3 := udpFlood(t, gw.Ext.NS, gw.VMs[0], flood)
	t.Logf("host %s after Set(nil): %d bytes in %v", gw.VMs[0].Addr, got3, d3)
	if float64(got3) < 3*allowed(d3) {
		t.Errorf("host %s received %d bytes in %v after the rule was removed, not well above the old limit (%.0f)", gw.VMs[0].Addr, got3, d3, allowed(d3))
	}
}

// udpFlood sends 1,200-byte UDP datagrams from ns to host's port 9 as fast
// as it can for d and returns the bytes host received and the time taken
// up to the last datagram sent.
func udpFlood(t *testing.T, from string, host netlab.Host, d time.Duration) (int64, time.Duration) {
	t.Helper()
	var pc net.PacketConn
	if err := netns.Do(host.NS, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(host.Addr.String(), "9"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if u, ok := pc.(*net.UDPConn); ok {
		_ = u.SetReadBuffer(16 << 20)
	}
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got.Add(int64(n))
		}
	}()
	var conn net.Conn
	if err := netns.Do(from, func() error {
		var err error
		conn, err = net.Dial("udp4", net.JoinHostPort(host.Addr.String(), "9"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := make([]byte, 1200)
	start := time.Now()
	var sent int
	for time.Since(start) < d {
		for range 64 {
			if _, err := conn.Write(payload); err == nil {
				sent++
			}
		}
	}
	took := time.Since(start)
	time.Sleep(200 * time.Millisecond) // the last datagrams arrive
	pc.Close()
	<-done
	t.Logf("flood to %s: %d datagrams sent in %v", host.Addr, sent, took)
	return got.Load(), took
}

// TestEnsureRepairsDrift: in a real namespace, Ensure writes nothing when
// the table already holds the rules (the drift check's common case) and
// restores the table byte-for-byte when a rule was added to, deleted from
// or changed in it by hand, or the table was deleted, and the classes when
// one was deleted or its rate changed by hand.
func TestEnsureRepairsDrift(t *testing.T) {
	_, ns := kernelNS(t)
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	rules := []Rule{
		{Direction: Egress, Iface: "net1", Priority: 1, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.1/32"), RateMbps: 100, BurstMB: 1},
		{Direction: Ingress, Iface: "net1", Priority: 2, Classifier: MatchAll, RateMbps: 10, BurstMB: 1},
	}
	if changed, err := Ensure(t.Context(), nat.Config{NetNS: ns}, rules); err != nil || !changed {
		t.Fatalf("first Ensure = %v, %v; want written", changed, err)
	}
	want, ok := nftTable(t, ns)
	if !ok {
		t.Fatal("no table after Ensure")
	}
	classesOf := func() string {
		var b strings.Builder
		for _, dev := range []string{"eth0", "net1"} {
			out, err := netlab.Exec(ctx, ns, "", "tc", "class", "show", "dev", dev)
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(dev + ": " + out)
		}
		return b.String()
	}
	wantClasses := classesOf()
	// in and eg are the table's chains as nft names them: "TABLE CHAIN".
	in := string(table.Name) + " " + string(nftconn.GatewayQoSIngressChain)
	eg := string(table.Name) + " " + string(nftconn.GatewayQoSEgressChain)
	handle := func(chain nftconn.ChainName) string {
		out, err := netlab.Exec(ctx, ns, "", "nft", "-a", "list", "chain", "ip", string(table.Name), string(chain))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, "# handle "); i >= 0 && strings.Contains(l, "accept") {
				return strings.TrimSpace(l[i+len("# handle "):])
			}
		}
		t.Fatalf("no accept rule in chain %s:\n%s", chain, out)
		return ""
	}
	for _, tc := range []struct {
		name  string
		drift string // an nft script run by hand before Ensure ("" none)
	}{
		{"unchanged", ""},
		{"rule added by hand", "add rule ip " + in + " ip saddr 10.0.0.0/8 drop\n"},
		{"rule deleted by hand", "delete rule ip " + eg + " handle HANDLE\n"},
		{"rate changed by hand", "flush chain ip " + in + "\nadd rule ip " + in + " iifname \"net1\" limit rate over 1 mbytes/second drop\n"},
		{"table deleted", "delete table ip " + string(table.Name) + "\n"},
		{"class deleted by hand", "tc class del dev eth0 classid 4e47:8001"},
		{"class rate changed by hand", "tc class change dev net1 parent 4e47: classid 4e47:8000 htb rate 1mbit ceil 1mbit"},
	} {
		if strings.HasPrefix(tc.drift, "tc ") {
			if _, err := netlab.Exec(ctx, ns, "", strings.Fields(tc.drift)...); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got := classesOf(); got == wantClasses {
				t.Fatalf("%s: the hand edit changed nothing", tc.name)
			}
		} else if tc.drift != "" {
			script := strings.ReplaceAll(tc.drift, "HANDLE", handle(nftconn.GatewayQoSEgressChain))
			if _, err := netlab.Exec(ctx, ns, script, "nft", "-f", "-"); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got, _ := nftTable(t, ns); got == want {
				t.Fatalf("%s: the hand edit changed nothing", tc.name)
			}
		}
		changed, err := Ensure(t.Context(), nat.Config{NetNS: ns}, rules)
		if err != nil || changed != (tc.drift != "") {
			t.Errorf("%s: Ensure = %v, %v; want changed=%v", tc.name, changed, err, tc.drift != "")
		}
		if got, _ := nftTable(t, ns); got != want {
			t.Errorf("%s: table after Ensure:\n%s\nwant:\n%s", tc.name, got, want)
		}
		if got := classesOf(); got != wantClasses {
			t.Errorf("%s: classes after Ensure:\n%s\nwant:\n%s", tc.name, got, wantClasses)
		}
	}
	if changed, err := Ensure(t.Context(), nat.Config{NetNS: ns}, nil); err != nil || !changed {
		t.Fatalf("Ensure(nil) = %v, %v; want the table deleted", changed, err)
	}
	if changed, err := Ensure(t.Context(), nat.Config{NetNS: ns}, nil); err != nil || changed {
		t.Fatalf("Ensure(nil) without a table = %v, %v; want nothing written", changed, err)
	}
}

// TestMarkOf: an ingress rule's mark stays in MarkMask, clear of the NAT
// planes' hairpin bits (0x4000 nftables, 0x20000 iptables), distinct for
// every class the mark can number, and never 0 (no class).
func TestMarkOf(t *testing.T) {
	seen := map[uint32]bool{}
	for i := 0; i < maxMarked; i++ {
		m := markOf(uint16(shape.GatewayMinorBase + i))
		if m == 0 || m&^uint32(MarkMask) != 0 || m&(0x4000|0x20000) != 0 || seen[m] {
			t.Fatalf("markOf(%#x) = %#x: zero, outside %#x, on a hairpin bit or repeated", shape.GatewayMinorBase+i, m, uint32(MarkMask))
		}
		seen[m] = true
	}
}

// TestCanceledContext: every call that reaches netlink takes the caller's
// context, and an ended one is refused before any socket is opened (no
// root needed).
func TestCanceledContext(t *testing.T) {
	nattest.Canceled(t, map[string]func(context.Context, nat.Config) error{
		"Set":    func(ctx context.Context, cfg nat.Config) error { return Set(ctx, cfg, nil) },
		"Ensure": func(ctx context.Context, cfg nat.Config) error { _, err := Ensure(ctx, cfg, nil); return err },
		"Apply":  func(ctx context.Context, cfg nat.Config) error { return Apply(ctx, cfg, nil) },
		"List":   func(ctx context.Context, cfg nat.Config) error { _, err := List(ctx, cfg); return err },
	})
}
