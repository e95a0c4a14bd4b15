package kubeovn_test

import (
	"context"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/testlog"
)

// newManager returns a manager of the core and natgw kinds on restCfg with
// cache options c (no metrics or health endpoints, logging to t as name), a
// clientset on restCfg, and the manager's logger.
func newManager(t *testing.T, restCfg *rest.Config, name string, c cache.Options) (ctrl.Manager, kubernetes.Interface, logr.Logger) {
	t.Helper()
	log := testlog.New(t, 0).WithName(name)
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 apitest.Scheme(t),
		Cache:                  c,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Logger:                 log,
	})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	return mgr, cs, log
}

// runManager starts mgr until cancel and returns stop: it cancels and
// waits for the manager to return, reporting its error as what's (once,
// however often it is called; the test's cleanup calls it too).
func runManager(t *testing.T, ctx context.Context, cancel context.CancelFunc, mgr ctrl.Manager, what string) (stop func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
