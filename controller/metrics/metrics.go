// Package metrics holds natgw-controller's Prometheus metrics, registered
// with controller-runtime's registry (served on the manager's metrics
// address next to its default metrics).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/natgw/natgw/nat"
)

var (
	// ProgramDuration is the latency of one gateway call as the controller
	// sees it (request to confirmed response).
	ProgramDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "natgw_program_duration_seconds",
		Help:    "Latency of programming calls to a gateway agent, by operation, object kind and data plane.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16), // 0.5 ms .. ~16 s
	}, []string{"op", "kind", "dataplane"})

	// GatewayObjects is the number of objects the controller holds
	// programmed on each gateway.
	GatewayObjects = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "natgw_gateway_objects",
		Help: "Objects programmed on a gateway, by kind.",
	}, []string{"gateway", "kind"})

	// GatewayConnected is 1 while the controller has a working session.
	GatewayConnected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "natgw_gateway_connected",
		Help: "1 while a session to the gateway's agent is open.",
	}, []string{"gateway", "dataplane"})

	// SweepDeletions counts orphans removed from gateways.
	SweepDeletions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_sweep_deletions_total",
		Help: "Objects deleted from a gateway because their Kubernetes object was confirmed gone.",
	}, []string{"gateway"})

	// Resyncs counts sync transactions, by why they ran.
	Resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_resyncs_total",
		Help: "Full sync transactions sent to a gateway, by reason (bootid, drift, dataplane).",
	}, []string{"gateway", "reason"})

	// VanishedReaped counts objects that vanished from the API without
	// natgw's deletion (deleted while their finalizer was being added) and
	// whose rule the reconciler then deleted from what it remembered. Zero
	// for objects created with the finalizer (controller/config/admission).
	VanishedReaped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_vanished_reaped_total",
		Help: "Objects gone from the API without natgw's deletion whose programmed rule the reconciler deleted, by kind.",
	}, []string{"kind"})

	// UnchangedApplies counts objects a reconcile asked to apply that the
	// gateway's current session was known to hold exactly: not sent (the
	// agent would have planned no change).
	UnchangedApplies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_gateway_unchanged_applies_total",
		Help: "Objects asked to be applied that the gateway's agent already held exactly, per the controller's record of its current session: not sent.",
	}, []string{"gateway"})

	// Reconnects counts sessions opened after the first one.
	Reconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "natgw_transport_reconnects_total",
		Help: "Sessions to a gateway's agent reopened after one ended or failed to open.",
	}, []string{"gateway"})
)

func init() {
	crmetrics.Registry.MustRegister(ProgramDuration, GatewayObjects, GatewayConnected, SweepDeletions, Resyncs, Reconnects, VanishedReaped, UnchangedApplies)
}

// ObserveProgram records one call's latency since start.
func ObserveProgram(op, kind string, dataplane nat.DataplaneName, start time.Time) {
	ProgramDuration.WithLabelValues(op, kind, string(dataplane)).Observe(time.Since(start).Seconds())
}

// CounterValue reads a counter's current value (-1 when it cannot be
// read): for tests and checks that compare a counter before and after.
func CounterValue(c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
