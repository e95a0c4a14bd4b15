package apitest_test

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/apitest"
)

const gwLabel = "ovn.kubernetes.io/vpc-nat-gw-name"

// TestAdmissionPolicy installs controller/config/admission as shipped
// (binding without selector) into a real kube-apiserver with natgw's CRDs
// and with upstream Kube-OVN v1.16.2's, and creates objects of every kind
// natgw finalizes: the create response already carries natgw's finalizer,
// finalizers and labels that were there stay, an IptablesEIP gets the
// vpc-nat-gw-name label from spec.natGwDp (only when set), and kinds the
// policy does not match (QoSPolicy) are untouched.
func TestAdmissionPolicy(t *testing.T) {
	assets := apitest.RequireAssets(t)
	for _, set := range crdtest.Sets {
		t.Run(string(set), func(t *testing.T) {
			ctx := context.Background()
			dir, err := crdtest.Path(ctx, set, apitest.CRDDir())
			if err != nil {
				t.Fatal(err)
			}
			cfg := apitest.StartT(t, apitest.Environment(assets, dir))
			if err := apitest.InstallAdmission(ctx, cfg, apitest.AdmissionOptions{}); err != nil {
				t.Fatal(err)
			}
			c, err := client.New(cfg, client.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name       string
				kind       string
				spec       map[string]any
				finalizers []string
				labels     map[string]string
				// wantFinalizers and wantLabels are the create response's.
				wantFinalizers []string
				wantLabels     map[string]string
			}{
				{name: "eip-bare", kind: "IptablesEIP", spec: map[string]any{"natGwDp": "gw1"},
					wantFinalizers: []string{apitest.AdmissionFinalizer}, wantLabels: map[string]string{gwLabel: "gw1"}},
				{name: "eip-kept", kind: "IptablesEIP", spec: map[string]any{"natGwDp": "gw2", "v4ip": "192.0.2.10"},
					finalizers: []string{"example.com/other"}, labels: map[string]string{"app": "x", gwLabel: "stale"},
					wantFinalizers: []string{"example.com/other", apitest.AdmissionFinalizer}, wantLabels: map[string]string{"app": "x", gwLabel: "gw2"}},
				{name: "eip-no-gateway", kind: "IptablesEIP", spec: map[string]any{"v4ip": "192.0.2.11"},
					labels:         map[string]string{"app": "y"},
					wantFinalizers: []string{apitest.AdmissionFinalizer}, wantLabels: map[string]string{"app": "y"}},
				{name: "eip-already", kind: "IptablesEIP", spec: map[string]any{"natGwDp": "gw1"},
					finalizers:     []string{apitest.AdmissionFinalizer, "kubeovn.io/kube-ovn-controller"},
					wantFinalizers: []string{apitest.AdmissionFinalizer, "kubeovn.io/kube-ovn-controller"}, wantLabels: map[string]string{gwLabel: "gw1"}},
				{name: "fip-bare", kind: "IptablesFIPRule", spec: map[string]any{"eip": "e1", "internalIp": "10.0.0.2"},
					wantFinalizers: []string{apitest.AdmissionFinalizer}},
				{name: "fip-kept", kind: "IptablesFIPRule", spec: map[string]any{"eip": "e1", "internalIp": "10.0.0.3"},
					finalizers: []string{"kubeovn.io/kube-ovn-controller"}, labels: map[string]string{"ovn.kubernetes.io/eip_v4_ip": "192.0.2.1"},
					wantFinalizers: []string{"kubeovn.io/kube-ovn-controller", apitest.AdmissionFinalizer}, wantLabels: map[string]string{"ovn.kubernetes.io/eip_v4_ip": "192.0.2.1"}},
				{name: "dnat", kind: "IptablesDnatRule", spec: map[string]any{"eip": "e1", "internalIp": "10.0.0.4", "internalPort": "80", "externalPort": "8080", "protocol": "tcp"},
					wantFinalizers: []string{apitest.AdmissionFinalizer}},
				{name: "snat", kind: "IptablesSnatRule", spec: map[string]any{"eip": "e1", "internalCIDR": "10.0.0.0/24"},
					labels: map[string]string{"team": "a"}, wantFinalizers: []string{apitest.AdmissionFinalizer}, wantLabels: map[string]string{"team": "a"}},
				{name: "gateway", kind: "VpcNatGateway", spec: map[string]any{"vpc": "vpc1", "subnet": "net1"},
					wantFinalizers: []string{apitest.AdmissionFinalizer}},
				{name: "qos-not-matched", kind: "QoSPolicy", spec: map[string]any{},
					wantFinalizers: nil},
			} {
				t.Run(tc.name, func(t *testing.T) {
					u := &unstructured.Unstructured{Object: map[string]any{"spec": tc.spec}}
					u.SetAPIVersion("kubeovn.io/v1")
					u.SetKind(tc.kind)
					u.SetName(tc.name)
					u.SetFinalizers(tc.finalizers)
					u.SetLabels(tc.labels)
					if err := c.Create(ctx, u); err != nil {
						t.Fatalf("create: %v", err)
					}
					// u is the create response.
					if got := u.GetFinalizers(); !slices.Equal(got, tc.wantFinalizers) {
						t.Errorf("create response finalizers %v, want %v", got, tc.wantFinalizers)
					}
					got := u.GetLabels()
					if len(got) != len(tc.wantLabels) {
						t.Errorf("create response labels %v, want %v", got, tc.wantLabels)
					}
					for k, v := range tc.wantLabels {
						if got[k] != v {
							t.Errorf("label %s = %q, want %q (labels %v)", k, got[k], v, got)
						}
					}
					// An update is not a create: the policy does not put
					// a finalizer back that someone removed.
					u.SetFinalizers(nil)
					if err := c.Update(ctx, u); err != nil {
						t.Fatalf("update: %v", err)
					}
					if len(u.GetFinalizers()) != 0 {
						t.Errorf("finalizers after an update that removed them: %v", u.GetFinalizers())
					}
					if err := c.Delete(ctx, u); err != nil {
						t.Errorf("delete: %v", err)
					}
				})
			}
		})
	}
}
