package shape

import (
	"context"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/qoslab"
	"github.com/natgw/natgw/nat"
)

// topo is the QoS lab of internal/qoslab (ext ── [delay line] ── net1 gw
// eth0 ── vm, the nftables data plane in gw holding one EIP and a FIP of
// it to vm) with the test's shorthands.
type topo struct {
	*qoslab.Topo
	ext, gw, vm string
	cfg         nat.Config
	dp          nat.Dataplane
}

var (
	labEIP = qoslab.EIP
	labVM  = qoslab.VM
)

// newTopo builds the lab with rtt added between ext and gw (0: a plain
// veth), removed with the test.
func newTopo(t *testing.T, ctx context.Context, rtt time.Duration) *topo {
	t.Helper()
	q, err := qoslab.New(ctx, netlab.ForTest(t), rtt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return &topo{Topo: q, ext: q.Ext, gw: q.GW, vm: q.VM, cfg: q.Cfg, dp: q.DP}
}

// police sets the EIP's policer (nil: none).
func (tp *topo) police(ctx context.Context, t *testing.T, q *nat.QoS) {
	t.Helper()
	if err := tp.Police(ctx, q); err != nil {
		t.Fatal(err)
	}
}

// flowDir and its values are qoslab's directions.
type flowDir = qoslab.Dir

const (
	download = qoslab.Download
	upload   = qoslab.Upload
)

// runTCP is qoslab's RunTCP with pings every 100 ms when ping is set.
func (tp *topo) runTCP(ctx context.Context, dir flowDir, n int, warm, d time.Duration, ping bool) (qoslab.TCPRun, error) {
	o := qoslab.TCPOptions{Dir: dir, Flows: n, Warm: warm, Dur: d}
	if ping {
		o.PingEvery = 100 * time.Millisecond
	}
	return tp.RunTCP(ctx, o)
}
