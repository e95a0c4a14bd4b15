package lbsvc

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestCallsInANamespace runs a LoadBalancer-Service pod's calls (init,
// eip-add, dnat-add, dnat-del) in a pod namespace the test makes (net1 to
// an external namespace holding the gateway, eth0 to a backend namespace),
// and checks them with real TCP from the external side: nothing before the
// DNAT, the backend reached through EIP:80 with the pod's masquerade
// address as source after it, nothing after dnat-del. A call with a bad
// rule programs nothing.
func TestCallsInANamespace(t *testing.T) {
	lab := netlab.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var pod, ext, be string
	for role, ns := range map[string]*string{"pod": &pod, "ext": &ext, "be": &be} {
		var err error
		if *ns, err = lab.NS(role); err != nil {
			t.Fatal(err)
		}
	}
	pfx := netip.MustParsePrefix
	if err := netlab.Veth(netlab.End{NS: pod, Name: ExternalInterface}, netlab.End{NS: ext, Name: "up", Addrs: []netip.Prefix{pfx("192.0.2.1/24")}}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: pod, Name: InternalInterface, Addrs: []netip.Prefix{pfx("10.0.1.1/24")}}, netlab.End{NS: be, Name: "eth0", Addrs: []netip.Prefix{pfx("10.0.1.5/24")}}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.Sysctl(pod, "net.ipv4.ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.ServeTCP(ctx, be, "10.0.1.5:8080"); err != nil {
		t.Fatal(err)
	}
	run := func(op string, rules ...string) error {
		t.Helper()
		c, err := NewCall(op, rules)
		if err != nil {
			return err
		}
		return netns.Do(pod, c.Run)
	}
	const eip = "192.0.2.10:80"
	if err := run("init", ""); err != nil {
		t.Fatalf("init: %v", err)
	}
	if err := run("eip-add", "192.0.2.10/24,192.0.2.1"); err != nil {
		t.Fatalf("eip-add: %v", err)
	}
	if err := run("eip-add", "192.0.2.11/24,192.0.2.99"); err == nil || !strings.Contains(err.Error(), "no ARP reply from 192.0.2.99") {
		t.Fatalf("eip-add with a gateway that does not answer: %v, want no ARP reply", err)
	}
	if r, err := netlab.Dial(ctx, ext, eip, netlab.FailTimeout); err == nil {
		t.Fatalf("reached the backend before dnat-add: %+v", r)
	}
	// A good rule then a bad one: the call fails and programs nothing.
	err := run("dnat-add", "192.0.2.10,80,tcp,10.0.1.5,8080,10.0.1.5 192.0.2.10,080,tcp,10.0.1.5,8080,10.0.1.5")
	if err == nil || !strings.Contains(err.Error(), `rule 2 "192.0.2.10,080`) {
		t.Fatalf("dnat-add with a bad second rule: %v, want rule 2 named", err)
	}
	if out, err := netlab.NftRuleset(ctx, pod); err != nil || strings.Contains(out, string(table.Name)) {
		t.Fatalf("a refused call programmed the table: %q, %v", out, err)
	}
	for i := 0; i < 2; i++ { // the second call finds the DNAT and ends with success
		if err := run("dnat-add", "192.0.2.10,80,tcp,10.0.1.5,8080,10.0.1.5"); err != nil {
			t.Fatalf("dnat-add %d: %v", i+1, err)
		}
	}
	r, err := netlab.Dial(ctx, ext, eip, netlab.DialTimeout)
	if err != nil || r.Client.Addr() != netip.MustParseAddr("10.0.1.1") {
		t.Fatalf("ext -> %s: %+v, %v (want the backend to see 10.0.1.1, the masquerade)", eip, r, err)
	}
	out, err := netlab.NftTable(ctx, pod, "ip", table.Name)
	if err != nil || strings.Count(out, "dnat to 10.0.1.5:8080") != 1 || strings.Count(out, "masquerade") != 1 {
		t.Fatalf("table after two dnat-add: %q, %v (want one DNAT and one masquerade)", out, err)
	}
	// The golden layout (TestLayoutGolden) says what the kernel lists.
	f := nftconn.NewFake()
	fakeDNAT(t, f, "192.0.2.10,80,tcp,10.0.1.5,8080")
	if miss := f.NotListed(table, out); miss != nil {
		t.Errorf("the kernel does not list %q as the golden layout has it:\n%s", miss, out)
	}
	if err := run("dnat-del", "192.0.2.10,80,tcp,10.0.1.5,8080"); err != nil {
		t.Fatalf("dnat-del: %v", err)
	}
	if r, err := netlab.Dial(ctx, ext, eip, netlab.FailTimeout); err == nil {
		t.Fatalf("reached the backend after dnat-del: %+v", r)
	}
	if err := run("dnat-del", "192.0.2.10,80,tcp,10.0.1.5,8080"); err != nil {
		t.Fatalf("dnat-del of a DNAT not there: %v, want success as the script", err)
	}
}
