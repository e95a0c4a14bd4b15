package upstream

import (
	"bytes"
	"context"
	"testing"
	"time"
)

func TestFiles(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, tc := range []struct {
		rel, want string
	}{
		{NatGatewayScript, "floating-ip-add"},
		{LBSvcScript, "dnat-add"},
		{CRDs, "iptables-fip-rules.kubeovn.io"},
	} {
		b, err := ReadFile(ctx, tc.rel)
		if err != nil {
			t.Fatalf("%s: %v", tc.rel, err)
		}
		if !bytes.Contains(b, []byte(tc.want)) {
			t.Errorf("%s does not contain %q", tc.rel, tc.want)
		}
	}
}
