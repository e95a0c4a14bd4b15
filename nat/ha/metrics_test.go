package ha

import (
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/natgw/natgw/nat/ha/ctsync"
)

// TestCollector: the exported metrics follow the Status; the lag gauge is
// the last frame's lag while active and 0 while standby.
func TestCollector(t *testing.T) {
	base := Status{ToActive: 3, ToStandby: 2, TakeoversPeerSilent: 2, TakeoversPeerNotActive: 1, FenceErrors: 4, KeptByPeer: 6,
		Sender:   ctsync.SenderStats{Sent: 10000, Overruns: 1, LastLag: 25 * time.Millisecond},
		Receiver: ctsync.ReceiverStats{Dumps: 5, Applied: 777, Failed: 2}}
	for _, tc := range []struct {
		name                   string
		role                   Role
		rulesReady             bool
		wantActive, lag, ready string
	}{
		{"active", RoleActive, true, "1", "0.025", "1"},
		{"standby", RoleStandby, true, "0", "0", "1"},
		{"standby without rules", RoleStandby, false, "0", "0", "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := base
			st.Role = tc.role
			st.RulesReady = tc.rulesReady
			reg := prometheus.NewPedanticRegistry()
			if err := reg.Register(NewCollector(func() Status { return st })); err != nil {
				t.Fatal(err)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, mf := range mfs {
				for _, m := range mf.GetMetric() {
					k := mf.GetName()
					for _, l := range m.GetLabel() {
						k += "{" + l.GetName() + "=" + l.GetValue() + "}"
					}
					v := m.GetGauge().GetValue()
					if mf.GetType() == dto.MetricType_COUNTER {
						v = m.GetCounter().GetValue()
					}
					got[k] = strconv.FormatFloat(v, 'g', -1, 64)
				}
			}
			want := map[string]string{
				"natgw_ha_active":                            tc.wantActive,
				"natgw_ha_rules_ready":                       tc.ready,
				"natgw_ha_replication_lag_seconds":           tc.lag,
				"natgw_ha_fence_errors_total":                "4",
				"natgw_ha_lease_kept_by_peer_total":          "6",
				"natgw_ha_role_changes_total{role=active}":   "3",
				"natgw_ha_role_changes_total{role=standby}":  "2",
				"natgw_ha_takeovers_total{peer=silent}":      "2",
				"natgw_ha_takeovers_total{peer=not_active}":  "1",
				"natgw_ha_replication_sent_entries_total":    "10000",
				"natgw_ha_replication_overruns_total":        "1",
				"natgw_ha_replication_received_dumps_total":  "5",
				"natgw_ha_replication_applied_entries_total": "777",
				"natgw_ha_replication_failed_entries_total":  "2",
			}
			if !maps.Equal(got, want) {
				t.Fatalf("metrics\n got %v\nwant %v", got, want)
			}
		})
	}
}
