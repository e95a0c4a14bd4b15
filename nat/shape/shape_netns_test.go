package shape

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
)

// TestShapeTCP shapes the lab's EIP at 10 Mbit/s both ways and checks with
// real TCP through the FIP (vm's connections to ext, SNATed to the EIP) and
// with pings from ext to the EIP (DNATed to vm) that each direction is
// held at the rate, that the kernel holds natgw's qdiscs, classes and table,
// that Get reads the limits back, and that Set(nil) removes all of it and
// the transfers are fast again.
func TestShapeTCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tp := newTopo(t, ctx, 0)
	want := []EIP{{Address: labEIP, Ingress: Limit{RateMbps: 10, BurstMB: 0.1}, Egress: Limit{RateMbps: 10, BurstMB: 0.1}}}
	if err := Set(tp.cfg, want); err != nil {
		t.Fatal(err)
	}
	got, err := Get(tp.cfg)
	if err != nil || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}
	for _, dev := range []string{"eth0", "net1"} {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "class htb 4e47:1 root") || !strings.Contains(out, "rate 10Mbit ceil 10Mbit") {
			t.Errorf("tc class show dev %s: no 10 Mbit class 4e47:1:\n%s", dev, out)
		}
		q, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		// 100 ms at 10 Mbit/s.
		if !strings.Contains(q, "qdisc htb 4e47: root") || !strings.Contains(q, "parent 4e47:1 limit 125000b") {
			t.Errorf("tc qdisc show dev %s: no htb root 4e47: with a bfifo of 125000 bytes under 4e47:1:\n%s", dev, q)
		}
	}
	for _, dir := range []flowDir{download, upload} {
		r, err := tp.runTCP(ctx, dir, 1, 1500*time.Millisecond, 4*time.Second, true)
		if err != nil {
			t.Fatal(err)
		}
		g := r.goodput()
		t.Logf("%s shaped at 10 Mbit/s: %.2f Mbit/s, retransmits %.2f%%, %d pings answered", dir, g, r.retrans, len(r.pings))
		if g < 8.5 || g > 10.5 {
			t.Errorf("%s shaped at 10 Mbit/s: goodput %.2f Mbit/s, want 8.5–10.5", dir, g)
		}
		if len(r.pings) == 0 {
			t.Errorf("%s: no ping through the EIP answered under load", dir)
		}
	}
	if err := Set(tp.cfg, nil); err != nil {
		t.Fatal(err)
	}
	rs, err := netlab.NftRuleset(ctx, tp.gw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rs, Table) {
		t.Errorf("table %s still there after Set(nil)", Table)
	}
	for _, dev := range []string{"eth0", "net1"} {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "4e47") {
			t.Errorf("natgw's qdisc still on %s after Set(nil):\n%s", dev, out)
		}
	}
	r, err := tp.runTCP(ctx, download, 1, 500*time.Millisecond, 2*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.goodput(); g < 50 {
		t.Errorf("download after Set(nil): %.1f Mbit/s, still shaped?", g)
	}
}
