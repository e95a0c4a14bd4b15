package v1_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/apitest"
)

// startAPIServer starts kube-apiserver + etcd from KUBEBUILDER_ASSETS with the
// CRDs of controller/config/crd installed, or skips the test when the
// binaries are not there.
func startAPIServer(t *testing.T) client.Client {
	t.Helper()
	assets := apitest.RequireAssets(t)
	cfg := apitest.StartT(t, apitest.Environment(assets, filepath.Join(repoRoot(t), "controller", "config", "crd")))

	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The API server is shared by the subtests: one start costs seconds.
func TestAPIServer(t *testing.T) {
	c := startAPIServer(t)
	t.Run("Admission", func(t *testing.T) { testAdmission(t, c) })
	t.Run("UpstreamManifests", func(t *testing.T) { testUpstreamManifests(t, c) })
	t.Run("MissingFields", func(t *testing.T) { testMissingFields(t, c) })
	t.Run("FullUpstreamObjects", func(t *testing.T) { testFullUpstreamObjects(t, c) })
	t.Run("Defaults", func(t *testing.T) { testDefaults(t, c) })
	t.Run("StatusSubresource", func(t *testing.T) { testStatusSubresource(t, c) })
}

func eip(mod func(*v1.IptablesEIPSpec)) client.Object {
	o := &v1.IptablesEIP{Spec: v1.IptablesEIPSpec{
		V4ip: "172.18.0.10", MacAddress: "00:00:5e:00:53:01", NatGwDp: "gw1",
		QoSPolicy: "qos1", ExternalSubnet: "ovn-vpc-external-network",
	}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

func fip(mod func(*v1.IptablesFIPRuleSpec)) client.Object {
	o := &v1.IptablesFIPRule{Spec: v1.IptablesFIPRuleSpec{EIP: "eip1", InternalIP: "10.0.1.5"}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

func dnat(mod func(*v1.IptablesDnatRuleSpec)) client.Object {
	o := &v1.IptablesDnatRule{Spec: v1.IptablesDnatRuleSpec{
		EIP: "eip1", ExternalPort: "8888", Protocol: "tcp", InternalIP: "10.0.1.10", InternalPort: "80",
	}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

func snat(mod func(*v1.IptablesSnatRuleSpec)) client.Object {
	o := &v1.IptablesSnatRule{Spec: v1.IptablesSnatRuleSpec{EIP: "eip1", InternalCIDR: "10.0.1.0/24"}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

func gw(mod func(*v1.VpcNatGatewaySpec)) client.Object {
	o := &v1.VpcNatGateway{Spec: v1.VpcNatGatewaySpec{
		Vpc: "vpc1", Subnet: "net1", LanIP: "10.0.1.254",
		ExternalSubnets: []string{"ovn-vpc-external-network"},
		Selector:        []string{"kubernetes.io/os: linux"},
		Tolerations:     []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		Routes:          []v1.Route{{CIDR: "10.1.0.0/16", NextHopIP: "10.0.1.1"}},
	}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

func qos(mod func(*v1.QoSPolicySpec)) client.Object {
	o := &v1.QoSPolicy{Spec: v1.QoSPolicySpec{
		BindingType: v1.QoSBindingTypeEIP,
		BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{{
			Name: "ingress", RateMax: "10", BurstMax: "20", Direction: v1.QoSDirectionIngress,
		}},
	}}
	if mod != nil {
		mod(&o.Spec)
	}
	return o
}

const (
	notIP     = "must be an IPv4 or IPv6 address"
	notCIDR   = "must be a CIDR such as 10.0.1.0/24 or fd00:1::/64, or an address"
	notIPv4   = "must be an IPv4 address"
	notPort   = "must be a port number from 1 to 65535"
	notCIDRv4 = "must be an IPv4 CIDR"
)

func testAdmission(t *testing.T, c client.Client) {
	cases := []struct {
		name string
		obj  client.Object
		// want: nil means accepted; otherwise every string must appear in the
		// Invalid error, the first one being the field path.
		want []string
	}{
		// IptablesEIP
		{"eip/valid", eip(nil), nil},
		{"eip/minimal", eip(func(s *v1.IptablesEIPSpec) { *s = v1.IptablesEIPSpec{NatGwDp: "gw1"} }), nil},
		{"eip/dual-stack", eip(func(s *v1.IptablesEIPSpec) { s.V6ip = "fd00:10::10" }), nil},
		{"eip/v4ip-octet", eip(func(s *v1.IptablesEIPSpec) { s.V4ip = "172.18.0.300" }), []string{"spec.v4ip", notIPv4}},
		{"eip/v4ip-is-v6", eip(func(s *v1.IptablesEIPSpec) { s.V4ip = "fd00::10" }), []string{"spec.v4ip", notIPv4}},
		{"eip/v4ip-cidr", eip(func(s *v1.IptablesEIPSpec) { s.V4ip = "10.0.0.1/24" }), []string{"spec.v4ip", notIPv4}},
		{"eip/v4ip-leading-zero", eip(func(s *v1.IptablesEIPSpec) { s.V4ip = "10.0.0.01" }), []string{"spec.v4ip", notIPv4}},
		{"eip/v4ip-too-long", eip(func(s *v1.IptablesEIPSpec) { s.V4ip = "1000.1000.1000.1000" }), []string{"spec.v4ip"}},
		{"eip/v6ip-is-v4", eip(func(s *v1.IptablesEIPSpec) { s.V6ip = "10.0.0.1" }), []string{"spec.v6ip", "must be an IPv6 address"}},
		{"eip/mac", eip(func(s *v1.IptablesEIPSpec) { s.MacAddress = "00:00:5e:00:53" }), []string{"spec.macAddress", "must be a MAC address"}},
		// Empty names are accepted as upstream's schema accepts them;
		// natgw-controller reports such objects (EIPNotFound,
		// GatewayNotFound).
		{"eip/no-gateway", eip(func(s *v1.IptablesEIPSpec) { s.NatGwDp = "" }), nil},

		// IptablesFIPRule
		{"fip/valid", fip(nil), nil},
		{"fip/internal-octet", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "10.0.1.256" }), []string{"spec.internalIp", notIP}},
		{"fip/internal-v6", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "fd00::5" }), nil},
		{"fip/internal-v6-long", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "fd00:1111:2222:3333:4444:5555:6666:7777" }), nil},
		{"fip/internal-cidr", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "fd00::5/64" }), []string{"spec.internalIp", notIP}},
		{"fip/internal-empty", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "" }), []string{"spec.internalIp", notIP}},
		{"fip/internal-name", fip(func(s *v1.IptablesFIPRuleSpec) { s.InternalIP = "vm1" }), []string{"spec.internalIp", notIP}},
		{"fip/no-eip", fip(func(s *v1.IptablesFIPRuleSpec) { s.EIP = "" }), nil},

		// IptablesDnatRule
		{"dnat/valid-tcp", dnat(nil), nil},
		{"dnat/valid-udp-bounds", dnat(func(s *v1.IptablesDnatRuleSpec) {
			s.Protocol, s.ExternalPort, s.InternalPort = "udp", "1", "65535"
		}), nil},
		{"dnat/protocol", dnat(func(s *v1.IptablesDnatRuleSpec) { s.Protocol = "icmp" }), []string{"spec.protocol", `Unsupported value: "icmp"`}},
		{"dnat/sctp", dnat(func(s *v1.IptablesDnatRuleSpec) { s.Protocol = v1.ProtocolSCTP }), nil},
		{"dnat/external-port-0", dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "0" }), []string{"spec.externalPort", notPort}},
		{"dnat/external-port-65536", dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "65536" }), []string{"spec.externalPort", notPort}},
		{"dnat/external-port-word", dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "http" }), []string{"spec.externalPort", notPort}},
		{"dnat/external-port-range", dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "80-90" }), []string{"spec.externalPort", notPort}},
		{"dnat/external-port-empty", dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "" }), []string{"spec.externalPort", notPort}},
		{"dnat/internal-port-99999", dnat(func(s *v1.IptablesDnatRuleSpec) { s.InternalPort = "99999" }), []string{"spec.internalPort", notPort}},
		{"dnat/internal-port-negative", dnat(func(s *v1.IptablesDnatRuleSpec) { s.InternalPort = "-1" }), []string{"spec.internalPort", notPort}},
		{"dnat/internal-ip", dnat(func(s *v1.IptablesDnatRuleSpec) { s.InternalIP = "10.0.1" }), []string{"spec.internalIp", notIP}},

		// IptablesSnatRule
		{"snat/valid", snat(nil), nil},
		{"snat/valid-host-bits", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "10.0.1.7/24" }), nil},
		{"snat/valid-bare-ip", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "10.0.1.7" }), nil},
		{"snat/valid-default", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "0.0.0.0/0" }), nil},
		{"snat/prefix-33", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "10.0.1.0/33" }), []string{"spec.internalCIDR", notCIDR}},
		{"snat/v6", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "fd00::/64" }), nil},
		{"snat/v6-long", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "fd00:1111:2222:3333:4444:5555:6666:7777/128" }), nil},
		{"snat/v6-prefix-129", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "fd00::/129" }), []string{"spec.internalCIDR", notCIDR}},
		{"snat/garbage", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "10.0.1.0/x" }), []string{"spec.internalCIDR", notCIDR}},
		{"snat/empty", snat(func(s *v1.IptablesSnatRuleSpec) { s.InternalCIDR = "" }), []string{"spec.internalCIDR", notCIDR}},

		// VpcNatGateway
		{"gw/valid", gw(nil), nil},
		{"gw/no-lan-ip", gw(func(s *v1.VpcNatGatewaySpec) { s.LanIP = "" }), nil},
		{"gw/lan-ip", gw(func(s *v1.VpcNatGatewaySpec) { s.LanIP = "10.0.1.254/24" }), []string{"spec.lanIp", notIPv4}},
		{"gw/route-cidr", gw(func(s *v1.VpcNatGatewaySpec) { s.Routes[0].CIDR = "10.1.0.0/40" }), []string{"spec.routes[0].cidr", notCIDRv4}},
		{"gw/route-nexthop", gw(func(s *v1.VpcNatGatewaySpec) {
			s.Routes = append(s.Routes, v1.Route{CIDR: "10.2.0.0/16", NextHopIP: "fd00::1"})
		}), []string{"spec.routes[1].nextHopIP", notIPv4}},
		{"gw/no-vpc", gw(func(s *v1.VpcNatGatewaySpec) { s.Vpc = "" }), nil},

		// QoSPolicy
		{"qos/valid", qos(nil), nil},
		{"qos/direction", qos(func(s *v1.QoSPolicySpec) { s.BandwidthLimitRules[0].Direction = "both" }),
			[]string{"spec.bandwidthLimitRules[0].direction", `Unsupported value: "both"`}},
		{"qos/rate", qos(func(s *v1.QoSPolicySpec) { s.BandwidthLimitRules[0].RateMax = "10M" }),
			[]string{"spec.bandwidthLimitRules[0].rateMax", "must be a number"}},
		{"qos/binding", qos(func(s *v1.QoSPolicySpec) { s.BindingType = "POD" }), []string{"spec.bindingType", `Unsupported value: "POD"`}},
	}

	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.obj.SetName(fmt.Sprintf("admission-%d", i))
			err := c.Create(ctx, tc.obj)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("valid object rejected: %v", err)
				}
				if err := c.Delete(ctx, tc.obj); err != nil {
					t.Errorf("delete: %v", err)
				}
				return
			}
			if err == nil {
				_ = c.Delete(ctx, tc.obj)
				t.Fatalf("invalid object accepted, want error naming %q", tc.want[0])
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v (reason %q), want an Invalid error", err, apierrors.ReasonForError(err))
			}
			msg := err.Error()
			t.Logf("rejected: %s", msg)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q\n does not contain %q", msg, w)
				}
			}
			// The field is named next to its cause, not only somewhere.
			if !strings.Contains(msg, tc.want[0]+": ") {
				t.Errorf("error %q\n does not name %q as the invalid field", msg, tc.want[0])
			}
		})
	}
}

// Manifests shaped like upstream Kube-OVN's documentation examples apply
// unchanged, with strict field validation (unknown fields would fail).
const upstreamManifests = `
apiVersion: kubeovn.io/v1
kind: VpcNatGateway
metadata:
  name: up-gw1
spec:
  vpc: test-vpc-1
  subnet: net1
  lanIp: 10.0.1.254
  selector:
    - "kubernetes.io/hostname: kube-ovn-worker"
    - "kubernetes.io/os: linux"
  externalSubnets:
    - ovn-vpc-external-network
  tolerations:
    - key: node-role.kubernetes.io/control-plane
      operator: Exists
      effect: NoSchedule
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector:
            matchExpressions:
              - key: app
                operator: In
                values: [vpc-nat-gw-gw2]
          topologyKey: kubernetes.io/hostname
  qosPolicy: ""
  bgpSpeaker:
    enabled: false
    asn: 65500
    remoteAsn: 65000
    neighbors: ["100.127.4.161"]
    holdTime: 1m
    routerId: 1.1.1.1
    enableGracefulRestart: true
    extraArgs: ["--log-level=debug"]
  routes:
    - cidr: 10.2.0.0/16
      nextHopIP: 10.0.1.1
---
apiVersion: kubeovn.io/v1
kind: IptablesEIP
metadata:
  name: up-eip-random
spec:
  natGwDp: up-gw1
---
apiVersion: kubeovn.io/v1
kind: IptablesEIP
metadata:
  name: up-eip-static
spec:
  natGwDp: up-gw1
  v4ip: 10.0.1.111
  macAddress: 00:00:00:00:00:01
  externalSubnet: ovn-vpc-external-network
  qosPolicy: qos-eip-example
---
apiVersion: kubeovn.io/v1
kind: IptablesFIPRule
metadata:
  name: up-fip01
spec:
  eip: up-eip-static
  internalIp: 10.0.1.5
---
apiVersion: kubeovn.io/v1
kind: IptablesSnatRule
metadata:
  name: up-snat01
spec:
  eip: up-eip-random
  internalCIDR: 10.0.1.0/24
---
apiVersion: kubeovn.io/v1
kind: IptablesDnatRule
metadata:
  name: up-dnat01
spec:
  eip: up-eip-random
  externalPort: '8888'
  internalIp: 10.0.1.10
  internalPort: '80'
  protocol: tcp
---
apiVersion: kubeovn.io/v1
kind: QoSPolicy
metadata:
  name: up-qos-eip-example
spec:
  bindingType: EIP
  bandwidthLimitRules:
    - name: eip-ingress
      rateMax: "1"
      burstMax: "1"
      priority: 1
      direction: ingress
    - name: eip-egress
      rateMax: "3"
      burstMax: "3"
      priority: 1
      direction: egress
      matchType: ip
      matchValue: src 10.0.1.0/24
`

func testUpstreamManifests(t *testing.T, c client.Client) {
	ctx := context.Background()
	for _, doc := range strings.Split(upstreamManifests, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("bad test manifest: %v\n%s", err, doc)
		}
		if err := c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
			continue
		}
		if err := c.Delete(ctx, u); err != nil {
			t.Errorf("delete %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// Fields upstream's schema leaves optional are optional here too: manifests
// without them are accepted as on upstream's CRDs (natgw-controller then
// reports the object Invalid, naming the field).
func testMissingFields(t *testing.T, c client.Client) {
	docs := []string{
		"kind: IptablesFIPRule\nspec: {eip: eip1}",
		"kind: IptablesFIPRule\nspec: {internalIp: 10.0.1.5}",
		"kind: IptablesDnatRule\nspec: {eip: eip1, internalIp: 10.0.1.5, internalPort: '80'}",
		"kind: IptablesSnatRule\nspec: {eip: eip1}",
		"kind: IptablesEIP\nspec: {v4ip: 172.18.0.10}",
		"kind: VpcNatGateway\nspec: {vpc: vpc1}",
		"kind: IptablesFIPRule",
	}
	for i, doc := range docs {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte("apiVersion: kubeovn.io/v1\n"+doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetName(fmt.Sprintf("missing-%d", i))
		if err := c.Create(context.Background(), u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Errorf("%s: %v, want accepted (as upstream's schema does)", doc, err)
			continue
		}
		_ = c.Delete(context.Background(), u)
	}
}

// testFullUpstreamObjects creates, for every kind, an object with every
// field of upstream v1.16.2's schema set (crdtest.Object), with strict field
// validation (an unknown field would fail), writes a status with every
// status field through the status subresource, and reads both back
// unchanged, field by field: natgw's CRDs keep everything upstream's do.
func testFullUpstreamObjects(t *testing.T, c client.Client) {
	ctx := context.Background()
	up, err := crdtest.LoadSet(ctx, crdtest.Upstream, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range crdtest.Kinds {
		t.Run(kind, func(t *testing.T) {
			u := crdtest.Object(up[kind], "full-"+strings.ToLower(kind), crdtest.Valid)
			status := u.Object["status"]
			delete(u.Object, "status")
			want := crdtest.Leaves(u.Object["spec"])
			if err := c.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Fatalf("create: %v", err)
			}
			defer c.Delete(ctx, u)
			u.Object["status"] = status
			if err := c.Status().Update(ctx, u, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
				t.Fatalf("status update: %v", err)
			}
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(u.GroupVersionKind())
			if err := c.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
				t.Fatal(err)
			}
			for what, pair := range map[string][2]map[string]any{
				"spec":   {want, crdtest.Leaves(got.Object["spec"])},
				"status": {crdtest.Leaves(status), crdtest.Leaves(got.Object["status"])},
			} {
				if d := crdtest.DiffLeaves(pair[0], pair[1]); len(d) > 0 {
					t.Errorf("%s changed on natgw's CRDs:\n%s", what, strings.Join(d, "\n"))
				}
			}
		})
	}
}

func testDefaults(t *testing.T, c client.Client) {
	ctx := context.Background()
	d := &v1.IptablesDnatRule{
		ObjectMeta: metav1.ObjectMeta{Name: "default-protocol"},
		Spec:       v1.IptablesDnatRuleSpec{EIP: "eip1", ExternalPort: "53", InternalIP: "10.0.1.53", InternalPort: "53"},
	}
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	defer c.Delete(ctx, d) //nolint:errcheck
	// No default (upstream's schema has none): natgw-controller reads an
	// empty protocol as tcp.
	if d.Spec.Protocol != "" {
		t.Errorf("spec.protocol defaulted to %q, want it left empty as on upstream's schema", d.Spec.Protocol)
	}
}

func testStatusSubresource(t *testing.T, c client.Client) {
	ctx := context.Background()
	f := fip(nil).(*v1.IptablesFIPRule)
	f.Name = "status-fip"
	f.Labels = map[string]string{v1.LabelEIPV4IP: "172.18.0.10", v1.LabelVpcNatGwName: "gw1"}
	f.Finalizers = []string{v1.Finalizer}
	if err := c.Create(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Finalizers = nil
		_ = c.Update(ctx, f)
		_ = c.Delete(ctx, f)
	})

	f.Status = v1.IptablesFIPRuleStatus{
		Ready: true, V4ip: "172.18.0.10", NatGwDp: "gw1", InternalIP: f.Spec.InternalIP,
	}
	v1.SetCondition(&f.Status.Conditions, v1.Condition{
		Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonProgrammed,
		Message: "programmed on gw1", ObservedGeneration: f.Generation,
	}, metav1.Now())
	f.Spec.InternalIP = "10.0.1.99" // ignored through /status
	if err := c.Status().Update(ctx, f); err != nil {
		t.Fatalf("status update: %v", err)
	}

	got := &v1.IptablesFIPRule{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(f), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.InternalIP != "10.0.1.5" {
		t.Errorf("status update changed spec.internalIp to %q", got.Spec.InternalIP)
	}
	if !got.Status.Ready || got.Status.V4ip != "172.18.0.10" {
		t.Errorf("status not stored: %+v", got.Status)
	}
	if c := v1.FindCondition(got.Status.Conditions, v1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue ||
		c.ObservedGeneration != got.Generation || c.LastUpdateTime.IsZero() || c.LastTransitionTime.IsZero() {
		t.Errorf("Ready condition not stored: %+v", got.Status.Conditions)
	}

	// A condition in upstream's shape (lastUpdateTime, no reason or
	// message), as kube-ovn-controller writes them, is stored as is.
	got.Status.Conditions = append(got.Status.Conditions, v1.Condition{
		Type: "Validated", Status: metav1.ConditionTrue, LastUpdateTime: metav1.Now(),
	})
	if err := c.Status().Update(ctx, got); err != nil {
		t.Errorf("condition in upstream's shape: %v", err)
	}

	// Deleting an object with a finalizer leaves it terminating, spec intact.
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(f), got); err != nil {
		t.Fatal(err)
	}
	if got.DeletionTimestamp.IsZero() {
		t.Error("object with finalizer has no deletionTimestamp after delete")
	}
	f = got
}
