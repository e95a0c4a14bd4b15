package main

import (
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
)

// TestCompatQoSUnits checks EIP QoS set through nat-gateway.sh against
// upstream's documented units (rate in Mbit/s, burst in MB of 2^20 bytes)
// with measured TCP throughput through a FIP (upstream's own tc QoS cannot
// run on this kernel, so this is the reference instead):
//   - at 16 Mbit/s with a 1 MB burst, 6 MiB take at least 80% of what the
//     bytes beyond the bucket need at that rate (the kernel's limit bucket
//     holds one second of rate plus the burst), and finish (a rate read in
//     a smaller unit would not);
//   - at 8 Mbit/s with a 4 MB burst, 4 MiB fit in the bucket and pass in
//     under 1.5 s (a burst read in Mbit, 0.5 MB, leaves 2.5 MB for the
//     rate: about 2.6 s).
func TestCompatQoSUnits(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 3*time.Minute)
	if _, err := lab.ServeTCP(ctx, gw.VMs[0].NS, "0.0.0.0:80"); err != nil {
		t.Fatal(err)
	}
	eip := netlab.EIP(0).String()
	for _, c := range [][]string{{"init", ""}, {"eip-add", eip + "/24"}, {"floating-ip-add", eip + "," + gw.VMs[0].Addr.String()}} {
		compatCLI(t, gw.GW, "nftables", true, c[0], c[1:]...)
	}
	target := eip + ":80"
	xfers := []struct {
		dir string
		run func(n int64) (time.Duration, error)
	}{
		{"ingress", func(n int64) (time.Duration, error) {
			_, d, err := netlab.Upload(ctx, gw.Ext.NS, target, n, 30*time.Second)
			return d, err
		}},
		{"egress", func(n int64) (time.Duration, error) {
			_, d, err := netlab.Download(ctx, gw.Ext.NS, target, n, 30*time.Second)
			return d, err
		}},
	}
	const mb = 1 << 20
	for _, x := range xfers {
		// Rate: 16 Mbit/s, burst 1 MB.
		compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-add", eip+",1,16,1")
		const size, rate int64 = 6 * mb, 16_000_000 / 8
		d, err := x.run(size)
		if err != nil {
			t.Fatalf("%s at 16 Mbit/s: %v", x.dir, err)
		}
		floor := time.Duration((size - mb - rate) * 8 / 10 * int64(time.Second) / rate)
		t.Logf("%s, 16 Mbit/s burst 1 MB: %d bytes in %v (%.1f Mbit/s; at least %v)", x.dir, size, d, float64(size)*8/d.Seconds()/1e6, floor)
		if d < floor {
			t.Errorf("%s: %d bytes in %v, faster than 16 Mbit/s with a 1 MB burst allows (%v)", x.dir, size, d, floor)
		}
		// Burst: 8 Mbit/s, burst 4 MB; 4 MiB fit in the bucket.
		compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-add", eip+",1,8,4")
		time.Sleep(5500 * time.Millisecond) // the bucket refills (5.2 MB at 1 MB/s)
		d, err = x.run(4 * mb)
		if err != nil {
			t.Fatalf("%s at 8 Mbit/s burst 4 MB: %v", x.dir, err)
		}
		t.Logf("%s, 8 Mbit/s burst 4 MB: %d bytes in %v", x.dir, 4*mb, d)
		if d > 1500*time.Millisecond {
			t.Errorf("%s: 4 MiB in %v with a 4 MB burst: the burst was not read in MB", x.dir, d)
		}
		compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-del", eip)
	}
	// The controller deletes an EIP's QoS after the EIP.
	compatCLI(t, gw.GW, "nftables", true, "floating-ip-del", eip)
	compatCLI(t, gw.GW, "nftables", true, "eip-del", eip+"/24")
	compatCLI(t, gw.GW, "nftables", true, "eip-ingress-qos-del", eip)
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-del", eip)
}
