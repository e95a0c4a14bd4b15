package shape

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/stats"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/qoslab"
	"github.com/natgw/natgw/nat"
)

// plane is how an EIP's limit is enforced in a figures run.
type plane string

const (
	policer    plane = "police"      // natgw's nftables limit (drop above rate + burst)
	shaper     plane = "shape"       // this package's HTB classes with HTB's default leaf (pfifo, 1000 packets): upstream's shape without fq_codel
	shapeBFIFO plane = "shape-bfifo" // the same with a bfifo leaf of 100 ms at the rate (LeafDelay)
)

// figCell is one measured cell's repetitions.
type figCell struct {
	g1, r1, idle, load, pingLoss []float64
	g8, j8, r8                   []float64
	udpLoss, udpRx               []float64
	excess, firstMB              []float64
}

func med(v []float64) float64 {
	v = slices.DeleteFunc(slices.Clone(v), func(x float64) bool { return math.IsNaN(x) })
	if len(v) == 0 {
		return math.NaN()
	}
	return stats.Summarize(v).Median
}

func durMs(d []time.Duration) float64 {
	if len(d) == 0 {
		return math.NaN()
	}
	f := make([]float64, len(d))
	for i, x := range d {
		f[i] = float64(x) / float64(time.Millisecond)
	}
	return stats.Summarize(f).Median
}

// figBurstMB is the burst of the burst measurement, in upstream's MB.
const figBurstMB = 1

// configure makes plane p hold the lab's EIP to rateMbps both ways with a
// burst of burstMB (upstream's MB; the policer's whole Mbit rounded up, as
// natgw-controller converts it), from a fresh state: no limit of either
// plane first, so buckets start full.
func (tp *topo) configure(ctx context.Context, t *testing.T, p plane, rateMbps, burstMB float64) {
	t.Helper()
	tp.police(ctx, t, nil)
	if err := Set(t.Context(), tp.cfg, nil); err != nil {
		t.Fatal(err)
	}
	switch p {
	case policer:
		b := uint32(math.Ceil(burstMB * BytesPerMB * 8 / 1e6))
		r := uint32(rateMbps)
		tp.police(ctx, t, &nat.QoS{IngressRateMbps: r, IngressBurstMbit: b, EgressRateMbps: r, EgressBurstMbit: b})
	case shaper, shapeBFIFO:
		LeafDelay = 0
		if p == shapeBFIFO {
			LeafDelay = 100 * time.Millisecond
		}
		l := Limit{RateMbps: rateMbps, BurstMB: burstMB}
		if err := Set(t.Context(), tp.cfg, []EIP{{Address: labEIP, Ingress: l, Egress: l}}); err != nil {
			t.Fatal(err)
		}
	}
}

// envList reads a comma-separated list from env key, or def.
func envList(key, def string) []string {
	v := os.Getenv(key)
	if v == "" {
		v = def
	}
	return strings.Split(v, ",")
}

// TestQoSFigures measures natgw's policer against the HTB shaper, side by
// side in the same run, with real TCP and UDP through a FIP of an EIP
// limited at 1, 10 and 100 Mbit/s, both directions, with and without 20 ms
// of added RTT (internal/delayline). It prints medians over
// NATGW_QOS_FIGURES=N repetitions (the planes interleaved in each); it is a
// measurement, not a timed test, and skips without the variable.
// NATGW_QOS_RATES (e.g. "10") and NATGW_QOS_RTTS (e.g. "20ms") narrow it.
//
// Per cell: one TCP flow's goodput (% of the rate, bytes delivered from
// 1.5 s to 4 s), the sender's retransmitted segments (% of segments sent,
// /proc/net/snmp of its namespace), ping ext → EIP median RTT idle and
// under that load (100 ms apart; lost pings counted); 8 TCP flows sharing
// the limit: total goodput (%), Jain's fairness index of the 8,
// retransmits; UDP at twice the rate for 3 s: loss (%) and what arrived in
// the second half (% of the rate); then with a burst of 1 MB: the bytes
// one TCP flow got through above the steady rate (MB, the steady rate
// taken from the last half of 4 s) and how long its first MiB took.
// Limits without the burst measurement have burst 0 (the policer's
// bucket is then one second of rate, the shaper's tc's default).
func TestQoSFigures(t *testing.T) {
	reps, _ := strconv.Atoi(os.Getenv("NATGW_QOS_FIGURES"))
	if reps <= 0 {
		t.Skip("measurement: set NATGW_QOS_FIGURES=N (repetitions)")
	}
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	const (
		warm = 1500 * time.Millisecond
		dur  = 4 * time.Second
		udpD = 3 * time.Second
	)
	var rates []float64
	for _, s := range envList("NATGW_QOS_RATES", "1,10,100") {
		r, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("NATGW_QOS_RATES: %v", err)
		}
		rates = append(rates, r)
	}
	var rtts []time.Duration
	for _, s := range envList("NATGW_QOS_RTTS", "0s,20ms") {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("NATGW_QOS_RTTS: %v", err)
		}
		rtts = append(rtts, d)
	}
	planes := []plane{policer, shaper, shapeBFIFO}
	dirs := []flowDir{download, upload}
	type key struct {
		rtt  time.Duration
		rate float64
		dir  flowDir
		p    plane
	}
	cells := map[key]*figCell{}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	topos := map[time.Duration]*topo{}
	for _, rtt := range rtts {
		topos[rtt] = newTopo(t, ctx, rtt)
	}
	defer func() { LeafDelay = 0 }()
	table := func(done int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "\nmedians of %d repetitions; goodput and UDP rx in %% of the limit; retransmits in %% of segments sent; ping ms; burst: %g MB configured\n\n", done, float64(figBurstMB))
		b.WriteString("| RTT | limit | dir | plane | 1 flow | retr | ping idle → loaded (lost) | 8 flows | Jain | retr | UDP 2× loss | UDP rx | burst passed (MB) | first MiB (ms) |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, rtt := range rtts {
			for _, rate := range rates {
				for _, dir := range dirs {
					for _, p := range planes {
						c := cells[key{rtt, rate, dir, p}]
						if c == nil {
							continue
						}
						fmt.Fprintf(&b, "| %v | %g Mbit/s | %s | %s | %.1f | %.2f | %.1f → %.1f (%.0f%%) | %.1f | %.3f | %.2f | %.1f | %.1f | %.2f | %.0f |\n",
							rtt, rate, dir, p, med(c.g1), med(c.r1), med(c.idle), med(c.load), med(c.pingLoss), med(c.g8), med(c.j8), med(c.r8),
							med(c.udpLoss), med(c.udpRx), med(c.excess), med(c.firstMB))
					}
				}
			}
		}
		fmt.Fprintf(&b, "\ntook %v\n", time.Since(start).Round(time.Second))
		return b.String()
	}
	for rep := range reps {
		for _, rtt := range rtts {
			tp := topos[rtt]
			for _, rate := range rates {
				for _, dir := range dirs {
					for i := range planes {
						// Rotate which plane goes first.
						p := planes[(i+rep)%len(planes)]
						k := key{rtt, rate, dir, p}
						c := cells[k]
						if c == nil {
							c = &figCell{}
							cells[k] = c
						}
						tp.configure(ctx, t, p, rate, 0)
						idle, err := netlab.Ping(ctx, tp.ext, labEIP, 10, 50*time.Millisecond, time.Second)
						if err != nil {
							t.Fatal(err)
						}
						c.idle = append(c.idle, durMs(idle))
						r1, err := tp.runTCP(ctx, dir, 1, warm, dur, true)
						if err != nil {
							t.Fatalf("%v: %v", k, err)
						}
						c.g1 = append(c.g1, 100*r1.Goodput()/rate)
						c.r1 = append(c.r1, r1.Retrans)
						c.load = append(c.load, durMs(r1.Pings))
						sent := int((dur - warm) / (100 * time.Millisecond))
						c.pingLoss = append(c.pingLoss, 100*float64(sent-len(r1.Pings))/float64(sent))
						tp.configure(ctx, t, p, rate, 0)
						r8, err := tp.runTCP(ctx, dir, 8, warm, dur, false)
						if err != nil {
							t.Fatalf("%v: %v", k, err)
						}
						c.g8 = append(c.g8, 100*r8.Goodput()/rate)
						c.j8 = append(c.j8, r8.Jain())
						c.r8 = append(c.r8, r8.Retrans)
						var u qoslab.UDPRun
						for try := 1; ; try++ { // a stalled sender measures the machine, not the limit
							tp.configure(ctx, t, p, rate, 0)
							if u, err = tp.RunUDP(ctx, dir, 2*rate, udpD); err != nil {
								t.Fatalf("%v: %v", k, err)
							}
							if u.Steady() {
								break
							}
							if try == 3 {
								t.Fatalf("%v: UDP sender stalled up to %v in 3 runs", k, u.MaxGap)
							}
						}
						c.udpLoss = append(c.udpLoss, u.Loss())
						c.udpRx = append(c.udpRx, 100*u.RxMbps/rate)
						tp.configure(ctx, t, p, rate, figBurstMB)
						b, err := tp.runTCP(ctx, dir, 1, dur/2, dur, false)
						if err != nil {
							t.Fatalf("%v: %v", k, err)
						}
						ex, first := burstOf(b)
						c.excess = append(c.excess, ex/BytesPerMB)
						c.firstMB = append(c.firstMB, first)
						t.Logf("%v rep %d: 1 flow %.1f%% (retr %.2f%%, ping %.1f→%.1f ms), 8 flows %.1f%% J=%.3f (retr %.2f%%), UDP loss %.1f%% rx %.1f%%, burst %.2f MB first MiB %.0f ms (%s)",
							k, rep, c.g1[len(c.g1)-1], r1.Retrans, c.idle[len(c.idle)-1], c.load[len(c.load)-1], c.g8[len(c.g8)-1], r8.Jain(), r8.Retrans,
							u.Loss(), c.udpRx[len(c.udpRx)-1], ex/BytesPerMB, first, time.Since(start).Round(time.Second))
					}
				}
			}
		}
		out := table(rep + 1)
		t.Log(out)
		if path := os.Getenv("NATGW_QOS_FIGURES_OUT"); path != "" {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	for _, tp := range topos {
		tp.police(ctx, t, nil)
		if err := Set(t.Context(), tp.cfg, nil); err != nil {
			t.Error(err)
		}
	}
}

// burstOf returns, from a single flow's timeline, the bytes delivered above
// the steady rate and the milliseconds until the first MiB had arrived
// (NaN if it never did): qoslab.TCPRun.AboveRate.
func burstOf(r qoslab.TCPRun) (excess, firstMs float64) {
	excess, at := r.AboveRate(BytesPerMB)
	return excess, at * 1000
}
