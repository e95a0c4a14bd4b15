package provision

import (
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/internal/objdiff"
)

// Line numbers below are of Kube-OVN v1.16.2's
// pkg/controller/vpc_nat_gateway.go unless a file is named.

const (
	testNS    = "kube-system"
	testImage = "docker.io/natgw/natgw:test"
	extProv   = "ovn-vpc-external-network.kube-system"
)

// subnets are the Subnets of the documentation's example: the external
// network (a NAD provider), the gateway's VPC subnet, and other subnets.
func subnets() map[string]kubeovn.Subnet {
	return map[string]kubeovn.Subnet{
		kubeovn.DefaultExternalNetwork: {Name: kubeovn.DefaultExternalNetwork, Provider: extProv, CIDRBlock: "192.0.2.0/24", Gateway: "192.0.2.1", Validated: true},
		"net1":                         {Name: "net1", Vpc: "vpc1", Provider: "ovn", CIDRBlock: "10.0.1.0/24", Gateway: "10.0.1.1", Validated: true},
	}
}

func gateway() *v1.VpcNatGateway {
	return &v1.VpcNatGateway{
		ObjectMeta: metav1.ObjectMeta{Name: "gw1", UID: "uid-gw1"},
		Spec:       v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "net1", LanIP: "10.0.1.254"},
	}
}

// want is the StatefulSet upstream builds for gateway() with subnets()
// (genNatGwStatefulSet, :913-1134), with natgw's image, owner reference and
// finalizer.
func want() *appsv1.StatefulSet {
	labels := map[string]string{
		"app":                          "vpc-nat-gw-gw1", // util.GenNatGwLabels, pkg/util/vpc_nat_gateway.go:79-85
		"ovn.kubernetes.io/vpc-nat-gw": "true",
	}
	return &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      "vpc-nat-gw-gw1", // util.GenNatGwName, pkg/util/vpc_nat_gateway.go:31-43
			Namespace: testNS,           // created in c.config.PodNamespace (:249-250)
			Labels:    labels,           // :1056, :1058-1062
			// natgw only: upstream sets no owner and deletes the StatefulSet itself (:144-163).
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubeovn.io/v1", Kind: "VpcNatGateway", Name: "gw1", UID: "uid-gw1",
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
			// natgw only: held through Kube-OVN's cleanup of vpc-nat-gw-* (StatefulSetFinalizer).
			Finalizers: []string{StatefulSetFinalizer},
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To[int32](1),                                        // :1064
			Selector:       &metav1.LabelSelector{MatchLabels: labels},              // :1065-1067
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: "RollingUpdate"}, // :1109-1111
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: labels,
					// util.GenNatGwPodAnnotations, pkg/util/vpc_nat_gateway.go:107-148.
					Annotations: map[string]string{
						// The external network's NAD, from the external subnet's provider (:1137-1159).
						"k8s.v1.cni.cncf.io/networks":  "kube-system/ovn-vpc-external-network",
						"ovn.kubernetes.io/vpc_nat_gw": "gw1",
						// eth0: the VPC subnet and lanIp under its provider.
						"ovn.kubernetes.io/logical_switch": "net1",
						"ovn.kubernetes.io/ip_address":     "10.0.1.254",
						// net1's default route via the external gateway (:1032-1045).
						extProv + ".kubernetes.io/routes": `[{"dst":"0.0.0.0/0","gw":"192.0.2.1"}]`,
					},
				},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](0), // :1074
					Containers: []corev1.Container{{
						Name:    "vpc-nat-gw",
						Image:   testImage,                     // natgw's (upstream: ConfigMap ovn-vpc-nat-config "image")
						Command: []string{"sleep", "infinity"}, // :1079
						Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{
							Command: []string{"sh", "-c", "sysctl -w net.ipv4.ip_forward=1"}, // :1080-1086
						}}},
						ImagePullPolicy: corev1.PullIfNotPresent, // :1087
						Env: []corev1.EnvVar{ // :1088-1097, the external subnet's gateways
							{Name: "GATEWAY_V4", Value: "192.0.2.1"},
							{Name: "GATEWAY_V6", Value: ""},
						},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), AllowPrivilegeEscalation: ptr.To(true)}, // :1098-1101
					}},
					Affinity: &corev1.Affinity{}, // &gw.Spec.Affinity, always set (:1106)
				},
			},
		},
	}
}

// changedInputs are gateway() and subnets() changed by gw and subs (nil:
// unchanged).
func changedInputs(gw func(*v1.VpcNatGateway), subs func(map[string]kubeovn.Subnet)) (*v1.VpcNatGateway, map[string]kubeovn.Subnet) {
	g, m := gateway(), subnets()
	if gw != nil {
		gw(g)
	}
	if subs != nil {
		subs(m)
	}
	return g, m
}

// checkBuilt reports each field where what Build sent (the apply
// configuration's JSON), field by field, differs from exp.
func checkBuilt(t *testing.T, ac *appsv1ac.StatefulSetApplyConfiguration, exp *appsv1.StatefulSet) {
	t.Helper()
	got, err := objdiff.Flatten(ac)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := objdiff.Flatten(exp)
	if err != nil {
		t.Fatal(err)
	}
	// The typed object's zero values that an apply sends nothing for.
	objdiff.Drop(wf, "metadata.creationTimestamp", "spec.template.metadata.creationTimestamp", "status",
		"spec.template.spec.containers[0].resources", "spec.template.spec.containers[1].resources", "spec.serviceName")
	for _, d := range objdiff.Diff(wf, got) {
		t.Errorf("%s (want != built)", d)
	}
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name    string
		gw      func(*v1.VpcNatGateway)
		subnets func(map[string]kubeovn.Subnet)
		svc     string
		want    func(*appsv1.StatefulSet)
	}{
		{name: "documentation example"},
		{
			// Placement from the spec: selector "k: v" entries (malformed
			// ones skipped, util.GenNatGwSelectors, pkg/util/vpc_nat_gateway.go:87-101),
			// tolerations and affinity as written (:1104-1106).
			name: "placement",
			gw: func(g *v1.VpcNatGateway) {
				g.Spec.Selector = []string{"kubernetes.io/os: linux", " zone : a ", "malformed", "a:b:c"}
				g.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "nat", Effect: corev1.TaintEffectNoSchedule}}
				g.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
				}}}
			},
			want: func(s *appsv1.StatefulSet) {
				p := &s.Spec.Template.Spec
				p.NodeSelector = map[string]string{"kubernetes.io/os": "linux", "zone": "a"}
				p.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "nat", Effect: corev1.TaintEffectNoSchedule}}
				p.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
				}}}
			},
		},
		{
			// eth0's routes (:958-1023): the service CIDR, then the VPC's
			// other validated OVN subnets (VLAN ones only with u2o), then
			// spec.routes ("gateway": the subnet's gateway), all in one
			// annotation under the subnet's provider (:1020).
			name: "routes",
			svc:  "10.96.0.0/12",
			gw: func(g *v1.VpcNatGateway) {
				g.Spec.Routes = []v1.Route{{CIDR: "172.16.0.0/16", NextHopIP: "gateway"}, {CIDR: "172.17.0.0/16", NextHopIP: "10.0.1.9"}}
			},
			subnets: func(m map[string]kubeovn.Subnet) {
				m["b"] = kubeovn.Subnet{Name: "b", Vpc: "vpc1", CIDRBlock: "10.0.2.0/24", Gateway: "10.0.2.1", Validated: true}
				m["a"] = kubeovn.Subnet{Name: "a", Vpc: "vpc1", Provider: "ovn", CIDRBlock: "10.0.3.0/24,fd00::/64", Validated: true}
				m["notvalidated"] = kubeovn.Subnet{Name: "notvalidated", Vpc: "vpc1", CIDRBlock: "10.0.4.0/24"}
				m["vlan"] = kubeovn.Subnet{Name: "vlan", Vpc: "vpc1", CIDRBlock: "10.0.5.0/24", Vlan: "v1", Validated: true}
				m["vlanu2o"] = kubeovn.Subnet{Name: "vlanu2o", Vpc: "vpc1", CIDRBlock: "10.0.6.0/24", Vlan: "v1", U2OInterconnection: true, Validated: true}
				m["othervpc"] = kubeovn.Subnet{Name: "othervpc", Vpc: "vpc2", CIDRBlock: "10.0.7.0/24", Validated: true}
				m["underlay"] = kubeovn.Subnet{Name: "underlay", Vpc: "vpc1", Provider: "macvlan.default", CIDRBlock: "10.0.8.0/24", Validated: true}
			},
			want: func(s *appsv1.StatefulSet) {
				s.Spec.Template.Annotations["ovn.kubernetes.io/routes"] = `[{"dst":"10.96.0.0/12","gw":"10.0.1.1"},{"dst":"10.0.3.0/24","gw":"10.0.1.1"},{"dst":"10.0.2.0/24","gw":"10.0.1.1"},{"dst":"10.0.6.0/24","gw":"10.0.1.1"},{"dst":"172.16.0.0/16","gw":"10.0.1.1"},{"dst":"172.17.0.0/16","gw":"10.0.1.9"}]`
			},
		},
		{
			// spec.externalSubnets[0] is the external network (util.GetNatGwExternalNetwork);
			// a provider that names no NAD falls back to <namespace>/<subnet> (:1150-1158).
			name: "external subnet named, provider without NAD",
			gw:   func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"ext2", "ignored"} },
			subnets: func(m map[string]kubeovn.Subnet) {
				m["ext2"] = kubeovn.Subnet{Name: "ext2", Provider: "ovn", CIDRBlock: "198.51.100.0/24", Gateway: "198.51.100.1,2001:db8::1"}
			},
			want: func(s *appsv1.StatefulSet) {
				a := s.Spec.Template.Annotations
				a["k8s.v1.cni.cncf.io/networks"] = "kube-system/ext2"
				delete(a, extProv+".kubernetes.io/routes")
				a["ovn.kubernetes.io/routes"] = `[{"dst":"0.0.0.0/0","gw":"198.51.100.1"},{"dst":"::/0","gw":"2001:db8::1"}]`
				s.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GATEWAY_V4", Value: "198.51.100.1"}, {Name: "GATEWAY_V6", Value: "2001:db8::1"}}
			},
		},
		{
			// noDefaultEIP: net1 without Kube-OVN IPAM, no default route (:1040-1051).
			name: "noDefaultEIP",
			gw:   func(g *v1.VpcNatGateway) { g.Spec.NoDefaultEIP = true },
			want: func(s *appsv1.StatefulSet) {
				a := s.Spec.Template.Annotations
				delete(a, extProv+".kubernetes.io/routes")
				a[extProv+".kubernetes.io/allocated"] = "true"
			},
		},
		{
			// A custom provider <name>.<namespace>.ovn keys eth0's
			// annotations and overrides Multus's default network
			// (pkg/util/vpc_nat_gateway.go:126-145); user annotations are the
			// base, upstream's own win.
			name: "custom provider and user annotations",
			gw: func(g *v1.VpcNatGateway) {
				g.Spec.Annotations = map[string]string{"team": "net", "ovn.kubernetes.io/vpc_nat_gw": "overridden"}
			},
			subnets: func(m map[string]kubeovn.Subnet) {
				s := m["net1"]
				s.Provider = "vpcnet.tenant.ovn"
				m["net1"] = s
			},
			want: func(s *appsv1.StatefulSet) {
				a := s.Spec.Template.Annotations
				delete(a, "ovn.kubernetes.io/logical_switch")
				delete(a, "ovn.kubernetes.io/ip_address")
				a["team"] = "net"
				a["vpcnet.tenant.ovn.kubernetes.io/logical_switch"] = "net1"
				a["vpcnet.tenant.ovn.kubernetes.io/ip_address"] = "10.0.1.254"
				a["v1.multus-cni.io/default-network"] = "tenant/vpcnet"
			},
		},
		{
			// The BGP speaker sidecar is not built (reported by the reconciler).
			name: "bgp speaker",
			gw:   func(g *v1.VpcNatGateway) { g.Spec.BgpSpeaker = &v1.VpcBgpSpeaker{Enabled: true, ASN: 1, RemoteASN: 2} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, subs := changedInputs(tc.gw, tc.subnets)
			exp := want()
			if tc.want != nil {
				tc.want(exp)
			}
			ac, err := Build(Inputs{Gateway: g, Subnets: subs, Namespace: testNS, Image: testImage, ServiceClusterIPRange: tc.svc})
			if err != nil {
				t.Fatal(err)
			}
			checkBuilt(t, ac, exp)
			if BGPUnsupported(g) != (tc.name == "bgp speaker") {
				t.Errorf("BGPUnsupported = %v", BGPUnsupported(g))
			}
		})
	}
}

func TestBuildRefuses(t *testing.T) {
	tests := []struct {
		name    string
		gw      func(*v1.VpcNatGateway)
		subnets func(map[string]kubeovn.Subnet)
		want    string
	}{
		// util.ValidateNatGwStatefulSetNameLength, pkg/util/vpc_nat_gateway.go:61-69.
		{name: "name too long", gw: func(g *v1.VpcNatGateway) { g.Name = strings.Repeat("a", 42) }, want: "at most 52"},
		{name: "subnet missing", gw: func(g *v1.VpcNatGateway) { g.Spec.Subnet = "nope" }, want: `subnet "nope" not found`},
		{name: "external subnet missing", gw: func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"nope"} }, want: `external subnet "nope" not found`},
		// GetSubnetProvider (:901-911).
		{name: "not an OVN subnet", subnets: func(m map[string]kubeovn.Subnet) { s := m["net1"]; s.Provider = "macvlan.default"; m["net1"] = s }, want: "not an OVN subnet"},
		// pkg/util/vpc_nat_gateway.go:131-135.
		{name: "malformed provider", subnets: func(m map[string]kubeovn.Subnet) { s := m["net1"]; s.Provider = "x.ovn"; m["net1"] = s }, want: "not an OVN subnet"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, subs := changedInputs(tc.gw, tc.subnets)
			_, err := Build(Inputs{Gateway: g, Subnets: subs, Namespace: testNS, Image: testImage})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestChangedAndStatusPatch(t *testing.T) {
	aff := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}
	tol := []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
	tests := []struct {
		name    string
		spec    v1.VpcNatGatewaySpec
		status  v1.VpcNatGatewayStatus
		changed bool
		patch   string
	}{
		{name: "empty", changed: false, patch: `{"status":{"externalSubnets":null,"selector":null,"tolerations":null,"affinity":{}}}`},
		{name: "empty affinity is none", spec: v1.VpcNatGatewaySpec{Affinity: &corev1.Affinity{}}, changed: false},
		{name: "empty tolerations are none", spec: v1.VpcNatGatewaySpec{Tolerations: []corev1.Toleration{}}, changed: false},
		{
			name:    "all four",
			spec:    v1.VpcNatGatewaySpec{ExternalSubnets: []string{"e"}, Selector: []string{"a: b"}, Tolerations: tol, Affinity: aff, Routes: []v1.Route{{CIDR: "1.0.0.0/8"}}},
			changed: true,
			patch:   `{"status":{"externalSubnets":["e"],"selector":["a: b"],"tolerations":[{"key":"k","operator":"Exists"}],"affinity":{"nodeAffinity":{}}}}`,
		},
		{
			name:   "recorded",
			spec:   v1.VpcNatGatewaySpec{ExternalSubnets: []string{"e"}, Selector: []string{"a: b"}, Tolerations: tol, Affinity: aff},
			status: v1.VpcNatGatewayStatus{ExternalSubnets: []string{"e"}, Selector: []string{"a: b"}, Tolerations: tol, Affinity: aff, QoSPolicy: "q"},
		},
		// Only the four fields count (routes, lanIp, annotations: not a rebuild).
		{name: "routes only", spec: v1.VpcNatGatewaySpec{Routes: []v1.Route{{CIDR: "1.0.0.0/8"}}, LanIP: "10.0.0.2"}, changed: false},
		{name: "selector removed", status: v1.VpcNatGatewayStatus{Selector: []string{"a: b"}}, changed: true},
		{name: "affinity removed", status: v1.VpcNatGatewayStatus{Affinity: aff}, changed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &v1.VpcNatGateway{Spec: tc.spec, Status: tc.status}
			if got := Changed(g); got != tc.changed {
				t.Errorf("Changed = %v, want %v", got, tc.changed)
			}
			if tc.patch == "" {
				return
			}
			b, err := StatusPatch(g)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.patch {
				t.Errorf("StatusPatch = %s\nwant          %s", b, tc.patch)
			}
		})
	}
}

// TestReplicas: the one rule of the number of replicas (the admission
// webhook's and the provisioner's): 1 or 2 from spec.replicas or the
// annotation; anything else names the field and the value.
func TestReplicas(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *int32
		ann  *string
		want int32
		err  []string // the error holds each
	}{
		{name: "unset", want: 1},
		{name: "spec 1", spec: ptr.To[int32](1), want: 1},
		{name: "spec 2", spec: ptr.To[int32](2), want: 2},
		{name: "spec 0", spec: ptr.To[int32](0), err: []string{"spec.replicas", "Invalid value: 0", "want 1"}},
		{name: "spec negative", spec: ptr.To[int32](-1), err: []string{"spec.replicas", "Invalid value: -1"}},
		{name: "spec 3", spec: ptr.To[int32](3), err: []string{"spec.replicas", "Invalid value: 3"}},
		{name: "annotation 2", ann: ptr.To("2"), want: 2},
		{name: "annotation 2, spec defaulted to 1", spec: ptr.To[int32](1), ann: ptr.To("2"), want: 2},
		{name: "annotation 1, spec 1", spec: ptr.To[int32](1), ann: ptr.To(" 1 "), want: 1},
		{name: "annotation and spec 2", spec: ptr.To[int32](2), ann: ptr.To("2"), want: 2},
		{name: "annotation 1, spec 2", spec: ptr.To[int32](2), ann: ptr.To("1"), err: []string{"metadata.annotations[natgw.kubeovn.io/replicas]", `"1"`, "disagrees with spec.replicas 2"}},
		{name: "annotation 0", ann: ptr.To("0"), err: []string{"metadata.annotations[natgw.kubeovn.io/replicas]", `Invalid value: "0"`}},
		{name: "annotation 3", ann: ptr.To("3"), err: []string{"natgw.kubeovn.io/replicas", `"3"`}},
		{name: "annotation negative", ann: ptr.To("-2"), err: []string{"natgw.kubeovn.io/replicas", `"-2"`}},
		{name: "annotation not a number", ann: ptr.To("two"), err: []string{"natgw.kubeovn.io/replicas", `"two"`, "not an integer"}},
		{name: "annotation empty", ann: ptr.To(""), err: []string{"natgw.kubeovn.io/replicas", "not an integer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &v1.VpcNatGateway{Spec: v1.VpcNatGatewaySpec{Replicas: tc.spec}}
			if tc.ann != nil {
				g.Annotations = map[string]string{ReplicasAnnotation: *tc.ann}
			}
			n, ferr := Replicas(g)
			if len(tc.err) == 0 {
				if ferr != nil || n != tc.want {
					t.Fatalf("Replicas = %d, %v; want %d", n, ferr, tc.want)
				}
				return
			}
			if ferr == nil {
				t.Fatalf("Replicas = %d, want an error", n)
			}
			for _, w := range tc.err {
				if !strings.Contains(ferr.Error(), w) {
					t.Errorf("error %q does not hold %q", ferr, w)
				}
			}
		})
	}
}

// TestReplicasChange: a live gateway keeps its number of replicas; the
// refusal says both numbers and the way out.
func TestReplicasChange(t *testing.T) {
	for _, tc := range []struct{ from, to int32 }{{1, 1}, {2, 2}, {1, 2}, {2, 1}} {
		ferr := ReplicasChange(tc.from, tc.to)
		if (ferr == nil) != (tc.from == tc.to) {
			t.Fatalf("%d -> %d: %v", tc.from, tc.to, ferr)
		}
		if ferr == nil {
			continue
		}
		for _, w := range []string{"spec.replicas", fmt.Sprintf("runs %d replica(s) and cannot change to %d", tc.from, tc.to), ReplicasAnnotation, "create a new VpcNatGateway"} {
			if !strings.Contains(ferr.Error(), w) {
				t.Errorf("%d -> %d: error %q does not hold %q", tc.from, tc.to, ferr, w)
			}
		}
	}
}

// TestBuildReplicas: Inputs.Replicas 1 (and 0) is today's StatefulSet
// (want(), unchanged by two-replica provisioning); 2 is the same with two replicas, no
// static eth0 address, natgw's replicas annotation, preferred pod
// anti-affinity by hostname (unless the user set one), the gateway
// ServiceAccount and the natgw-ha container running `natgw ha` (its peer
// the sibling pod, the lanIp with the subnet's length, the Lease fence);
// anything else, and a lanIp the HA pair cannot float, is refused.
func TestBuildReplicas(t *testing.T) {
	anti := func(s *appsv1.StatefulSet) *corev1.PodAntiAffinity {
		return &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchLabels: s.Spec.Selector.MatchLabels},
				TopologyKey:   "kubernetes.io/hostname",
			},
		}}}
	}
	two := func(s *appsv1.StatefulSet) {
		s.Spec.Replicas = ptr.To[int32](2)
		a := s.Spec.Template.Annotations
		delete(a, "ovn.kubernetes.io/ip_address")
		a[ReplicasAnnotation] = "2"
		a[AAPsAnnotation] = LanVipName("gw1")
		s.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: anti(s)}
		s.Spec.Template.Spec.ServiceAccountName = GatewayServiceAccount
		fieldEnv := func(name, path string) corev1.EnvVar {
			return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
		}
		// Both containers share the sync mark's directory.
		mark := []corev1.VolumeMount{{Name: "natgw-run", MountPath: "/run/natgw"}}
		s.Spec.Template.Spec.Volumes = []corev1.Volume{{Name: "natgw-run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		s.Spec.Template.Spec.Containers[0].VolumeMounts = mark
		// Ready once the controller synced the pod (the agent's mark).
		s.Spec.Template.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/natgw", "synced", "--file", "/run/natgw/rules-synced"}}},
			PeriodSeconds: 2, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3,
		}
		s.Spec.Template.Spec.Containers = append(s.Spec.Template.Spec.Containers, corev1.Container{
			Name:            HAContainer,
			VolumeMounts:    mark,
			Image:           testImage,
			ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/natgw", "ha", "--id", "$(POD_NAME)", "--local", "$(POD_IP):7460",
				"--peer-sibling", "$(POD_NAMESPACE)", "--eips-from-dataplane",
				"--lan-ip", "10.0.1.254/24", "--fence-lease", testNS + "/vpc-nat-gw-gw1",
				"--rules-synced-file", "/run/natgw/rules-synced"},
			Env:             []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_NAMESPACE", "metadata.namespace"), fieldEnv("POD_IP", "status.podIP")},
			SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), AllowPrivilegeEscalation: ptr.To(true)},
		})
	}
	userAnti := &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "zone"}}}
	tests := []struct {
		name     string
		replicas int32
		lease    time.Duration
		gw       func(*v1.VpcNatGateway)
		want     func(*appsv1.StatefulSet)
		err      string
	}{
		{name: "0 is 1", replicas: 0},
		{name: "1", replicas: 1},
		{name: "1, the annotation in spec.annotations is natgw's: dropped", replicas: 1, gw: func(g *v1.VpcNatGateway) { g.Spec.Annotations = map[string]string{ReplicasAnnotation: "2"} }},
		{name: "2", replicas: 2, want: two},
		{
			name: "2, node affinity kept", replicas: 2,
			gw: func(g *v1.VpcNatGateway) {
				g.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}}
			},
			want: func(s *appsv1.StatefulSet) {
				two(s)
				s.Spec.Template.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
			},
		},
		{
			name: "2, the user's pod anti-affinity replaces natgw's", replicas: 2,
			gw: func(g *v1.VpcNatGateway) { g.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: userAnti} },
			want: func(s *appsv1.StatefulSet) {
				two(s)
				s.Spec.Template.Spec.Affinity.PodAntiAffinity = userAnti
			},
		},
		{
			name: "2, HALease 1s: natgw ha --lease", replicas: 2, lease: time.Second,
			want: func(s *appsv1.StatefulSet) {
				two(s)
				c := &s.Spec.Template.Spec.Containers[1]
				c.Command = append(c.Command, "--lease", "1s")
			},
		},
		{name: "2, IPv6 lanIp", replicas: 2, gw: func(g *v1.VpcNatGateway) { g.Spec.LanIP = "fd00::5" }, err: `a two-replica gateway needs an IPv4 lanIp: invalid spec.lanIp "fd00::5": not an IPv4 address`},
		{name: "2, lanIp outside the subnet", replicas: 2, gw: func(g *v1.VpcNatGateway) { g.Spec.LanIP = "10.9.0.5" }, err: `spec.lanIp "10.9.0.5": not in subnet "net1"`},
		{name: "3", replicas: 3, err: "replicas 3: want 1"},
		{name: "-1", replicas: -1, err: "replicas -1: want 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gateway()
			if tc.gw != nil {
				tc.gw(g)
			}
			ac, err := Build(Inputs{Gateway: g, Subnets: subnets(), Namespace: testNS, Image: testImage, Replicas: tc.replicas, HALease: tc.lease})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Build: %v, want an error holding %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			exp := want()
			if tc.want != nil {
				tc.want(exp)
			}
			checkBuilt(t, ac, exp)
			if p := ProvisionedReplicas(ac.Spec.Template.Annotations); p != max(tc.replicas, 1) {
				t.Errorf("ProvisionedReplicas of the template = %d", p)
			}
		})
	}
}
