package main

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/reconciler"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		args    []string
		wantErr string
		check   func(*flags) bool
	}{
		{nil, "", func(f *flags) bool {
			return f.mode == modeReplace && f.transport == "exec" && f.dataplane == "nftables" && f.leaderElect && f.workers == reconciler.DefaultWorkers && f.removeUpstream && !f.ruleLabels && !f.provision && f.networkSource == networkConfig
		}},
		{[]string{"--mode=companion", "--companion-grace=45s", "--companion-period=10s"}, "", func(f *flags) bool {
			return f.mode == modeCompanion && f.companionGrace == 45*time.Second && f.companionPeriod == 10*time.Second
		}},
		{[]string{"--mode=both"}, `--mode: "both"`, nil},
		{[]string{"--mode=companion", "--dataplane=iptables"}, "--dataplane=iptables", nil},
		{[]string{"--mode=companion", "--companion-grace=0s"}, "--companion-grace=0s", nil},
		{[]string{"--rule-labels"}, "", func(f *flags) bool { return f.ruleLabels }},
		{[]string{"--transport=local", "--gateway-config=/x.yaml", "--dataplane=iptables", "--workers=8", "--leader-elect=false", "--sweep-period=1m"}, "", func(f *flags) bool {
			return f.transport == "local" && f.dataplane == "iptables" && f.workers == 8 && !f.leaderElect && f.sweepPeriod == time.Minute
		}},
		{[]string{"--transport=local"}, "--gateway-config", nil},
		{[]string{"--transport=ssh"}, "--transport", nil},
		{[]string{"--dataplane=ebpf"}, "--dataplane", nil},
		{[]string{"--workers=0"}, "--workers", nil},
		{[]string{"--gateway-sync-parallel=3"}, "", func(f *flags) bool { return f.syncParallel == 3 }},
		{nil, "", func(f *flags) bool { return f.syncParallel == gateway.DefaultSyncParallel() && f.syncParallel >= 1 }},
		{[]string{"--gateway-sync-parallel=0"}, "--gateway-sync-parallel: 0", nil},
		{[]string{"--provision-gateways", "--gateway-image=natgw:1", "--service-cluster-ip-range=10.96.0.0/24"}, "", func(f *flags) bool {
			return f.provision && f.gatewayImage == "natgw:1" && f.serviceCIDR == "10.96.0.0/24" && f.networkSource == networkKubeOVN
		}},
		{[]string{"--provision-gateways", "--gateway-image=x", "--network-source=config"}, "", func(f *flags) bool { return f.networkSource == networkConfig }},
		{[]string{"--network-source=kube-ovn"}, "", func(f *flags) bool { return f.networkSource == networkKubeOVN }},
		{[]string{"--network-source=subnets"}, `--network-source: "subnets"`, nil},
		{[]string{"--mode=companion", "--network-source=kube-ovn"}, "--network-source=kube-ovn needs --mode=replace", nil},
		{[]string{"--provision-gateways"}, "--gateway-image", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--ha-gateways"}, "", func(f *flags) bool { return f.haGateways }},
		{[]string{"--ha-gateways"}, "--ha-gateways needs --provision-gateways", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--ha-gateways", "--ha-lease=1s"}, "", func(f *flags) bool { return f.haLease == time.Second }},
		{[]string{"--provision-gateways", "--gateway-image=x", "--ha-lease=1s"}, "--ha-lease needs --ha-gateways", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--ha-gateways", "--ha-lease=50ms"}, "--ha-lease 50ms: want 0", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--ha-gateways", "--ha-lease=-1s"}, "--ha-lease -1s: want 0", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--gateway-namespaces=team-a, team-b"}, "", func(f *flags) bool {
			return len(f.gatewayNS) == 2 && f.gatewayNS[0] == "team-a" && f.gatewayNS[1] == "team-b"
		}},
		{[]string{"--gateway-namespaces=team-a,Team_B"}, `flag -gateway-namespaces: namespace "Team_B"`, nil},
		{[]string{"--webhook-port=9443", "--webhook-cert-dir=/certs"}, "", func(f *flags) bool { return f.webhookPort == 9443 && f.webhookCertDir == "/certs" }},
		{[]string{"--mode=companion", "--webhook-port=9443"}, "--webhook-port needs --mode=replace", nil},
		{[]string{"--webhook-port=70000"}, "--webhook-port: 70000", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--mode=companion"}, "--mode=replace", nil},
		{[]string{"--provision-gateways", "--gateway-image=x", "--transport=local", "--gateway-config=/x.yaml"}, "--transport=exec", nil},
		{[]string{"--pprof", "--metrics-bind-address=127.0.0.1:9090"}, "", func(f *flags) bool {
			return f.pprof && metricsOptions(f).ExtraHandlers["/debug/pprof/"] != nil
		}},
		{nil, "", func(f *flags) bool { return len(metricsOptions(f).ExtraHandlers) == 0 }},
		{[]string{"--pprof", "--metrics-bind-address=0"}, "--pprof needs --metrics-bind-address", nil},
		{nil, "", func(f *flags) bool {
			return f.leaseDuration == DefaultLeaseDuration && f.renewDeadline == DefaultRenewDeadline && f.retryPeriod == DefaultRetryPeriod
		}},
		{[]string{"--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s"}, "", func(f *flags) bool {
			return f.leaseDuration == 15*time.Second && f.renewDeadline == 10*time.Second && f.retryPeriod == 2*time.Second
		}},
		{[]string{"--leader-elect-renew-deadline=60s"}, "--leader-elect-lease-duration 1m0s: want more than --leader-elect-renew-deadline (1m0s)", nil},
		{[]string{"--leader-elect-renew-deadline=2s"}, "--leader-elect-renew-deadline 2s: want more than 1.2 × --leader-elect-retry-period (2s)", nil},
		{[]string{"--leader-elect-retry-period=0s"}, "--leader-elect-retry-period 0s: want > 0", nil},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f, err := parseFlags(fs, tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f) {
				t.Errorf("flags = %+v", f)
			}
		})
	}
}

// TestRestConfigRateLimit: a --kubeconfig without a QPS gets no client-side
// rate limit (as ctrl.GetConfig), one with a QPS keeps it.
func TestRestConfigRateLimit(t *testing.T) {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS >= 0 {
		t.Errorf("QPS = %v, want client-side rate limiting off (negative)", cfg.QPS)
	}
	if _, err := restConfig(filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("missing kubeconfig: %v, want an error naming --kubeconfig", err)
	}
}

// TestCacheStripsManagedFields: every kind the cache holds is stored without
// managedFields (the transform ByObject entries inherit), and nothing else
// of the object is dropped.
func TestCacheStripsManagedFields(t *testing.T) {
	for _, provision := range []bool{false, true} {
		o := cacheOptions(&flags{provision: provision, podNamespace: "kube-system"})
		if o.DefaultTransform == nil {
			t.Fatalf("provision=%v: no default transform", provision)
		}
		for obj, bo := range o.ByObject {
			if bo.Transform != nil {
				t.Errorf("provision=%v: %T has its own transform, which replaces the default", provision, obj)
			}
		}
		eip := &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{
			Name: "e", UID: "u1", Annotations: map[string]string{"a": "b", "kubectl.kubernetes.io/last-applied-configuration": `{"spec":{"v4ip":"172.31.0.10"}}`}, Finalizers: []string{"f"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		}, Spec: v1.IptablesEIPSpec{V4ip: "172.31.0.10"}}
		out, err := o.DefaultTransform(eip)
		if err != nil {
			t.Fatal(err)
		}
		got := out.(*v1.IptablesEIP)
		if len(got.ManagedFields) != 0 {
			t.Errorf("provision=%v: managedFields kept: %v", provision, got.ManagedFields)
		}
		if _, ok := got.Annotations["kubectl.kubernetes.io/last-applied-configuration"]; ok {
			t.Errorf("provision=%v: kubectl's last-applied-configuration kept", provision)
		}
		if len(got.Annotations) != 1 || got.Annotations["a"] != "b" || len(got.Finalizers) != 1 || got.Spec.V4ip != "172.31.0.10" || got.UID != "u1" {
			t.Errorf("provision=%v: transform dropped more than managedFields: %+v", provision, got)
		}
	}
}

// TestGatewayNamespaceOf: the exec transport's namespace of a gateway is
// provision.GatewayNamespace of the VpcNatGateway in the cache; a gone one
// is looked for in --pod-namespace. The cache covers --gateway-namespaces.
func TestGatewayNamespaceOf(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "own"}, Spec: v1.VpcNatGatewaySpec{Namespace: "team-a"}},
		&v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "plain"}},
	).Build()
	of := gatewayNamespaceOf(c, "kube-system")
	for gw, want := range map[string]string{"own": "team-a", "plain": "kube-system", "gone": "kube-system"} {
		got, err := of(context.Background(), gw)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", gw, got, err, want)
		}
	}
	o := cacheOptions(&flags{provision: true, podNamespace: "kube-system", gatewayNS: []string{"team-a"}, haGateways: true})
	n := 0
	for obj, bo := range o.ByObject {
		switch obj.(type) {
		case *appsv1.StatefulSet, *coordinationv1.Lease:
			n++
			if _, ok := bo.Namespaces["team-a"]; !ok || len(bo.Namespaces) != 2 {
				t.Errorf("%T cached in %v, want kube-system and team-a", obj, bo.Namespaces)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d of StatefulSet and Lease in the cache options, want 2", n)
	}
}
