package reconciler

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-logr/logr"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
)

// TestClassifyConnecting: a gateway whose first connect since the
// controller started has not ended gives a quiet failure (the object's
// status and Events are left alone, the reconcile runs again after
// gatewayRetry); a gateway known to be down gives GatewayNotReady with a
// status, as before.
func TestClassifyConnecting(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		reason string
		quiet  bool
	}{
		{"first connect not ended", fmt.Errorf("gateway gw1: %w: %w", gateway.ErrNotReady, gateway.ErrConnecting), v1.ReasonGatewayNotReady, true},
		{"no session after the first connect", fmt.Errorf("gateway gw1: %w", gateway.ErrNotReady), v1.ReasonGatewayNotReady, false},
		{"unknown gateway", fmt.Errorf("x: %w", gateway.ErrUnknownGateway), v1.ReasonGatewayNotFound, false},
		{"other", errors.New("boom"), v1.ReasonProgramFailed, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := classify("gw1", c.err)
			if f.reason != c.reason || f.quiet != c.quiet {
				t.Fatalf("classify: reason %q quiet %v, want %q %v", f.reason, f.quiet, c.reason, c.quiet)
			}
			res, ok := quietResult(logr.Discard(), f)
			if ok != c.quiet {
				t.Fatalf("quietResult ok = %v, want %v", ok, c.quiet)
			}
			if ok && res.RequeueAfter != gatewayRetry {
				t.Errorf("quiet requeue after %v, want %v", res.RequeueAfter, gatewayRetry)
			}
		})
	}
}
