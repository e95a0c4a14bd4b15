package companion

import (
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// Removed counts leaked compat objects the companion removed.
	Removed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_companion_removed_total",
		Help: "Compat objects (programmed by Kube-OVN's controller through nat-gateway.sh) removed from a gateway because no NAT CR claims them, by kind.",
	}, []string{"kind"})

	// Restored counts removed objects put back because a CR claiming them
	// appeared between the confirming read and the removal.
	Restored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_companion_restored_total",
		Help: "Removed compat objects put back at once because a NAT CR claiming them was found right after the removal, by kind.",
	}, []string{"kind"})

	// Suspected is the number of compat objects no CR claims, per gateway,
	// as of the gateway's last sweep (removed ones included until the
	// next sweep finds them gone).
	Suspected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "natgw_companion_suspected_orphans",
		Help: "Compat objects on a gateway that no NAT CR claimed at its last sweep.",
	}, []string{"gateway"})

	// Unresolved is the number of CRs of a kind whose compat UID could not
	// be computed at the last sweep; while it is above 0 no object of that
	// kind is removed anywhere.
	Unresolved = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "natgw_companion_unresolved_crs",
		Help: "NAT CRs whose compat UID cannot be computed (no EIP address yet, unknown EIP, malformed field), by object kind; while above 0 no object of that kind is removed.",
	}, []string{"kind"})

	// Sweeps counts gateway sweeps by result (ok, error).
	Sweeps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_companion_sweeps_total",
		Help: "Companion sweeps of one gateway, by result (ok, error).",
	}, []string{"gateway", "result"})
)

func init() {
	crmetrics.Registry.MustRegister(Removed, Restored, Suspected, Unresolved, Sweeps)
}
