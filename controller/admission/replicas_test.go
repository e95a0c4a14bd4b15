package admission

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/controller/provision"
)

// replicasGW is gw(name) with spec.replicas and the replicas annotation
// (nil: unset).
func replicasGW(name string, spec *int32, ann *string) *v1.VpcNatGateway {
	g := gw(name, func(s *v1.VpcNatGatewaySpec) { s.Replicas = spec })
	if ann != nil {
		g.Annotations = map[string]string{provision.ReplicasAnnotation: *ann}
	}
	return g
}

// TestWebhookReplicas: the number of gateway replicas is checked by a
// real API server calling the webhook as shipped, on natgw's CRDs
// (spec.replicas, minimum 1 in the schema) and on Kube-OVN v1.16.2's
// (which prune spec.replicas: the annotation): 0, negative, 3 or more and
// a non-number are refused naming the field and the value; 1 and 2 are
// admitted; a live gateway cannot change between 1 and 2.
func TestWebhookReplicas(t *testing.T) {
	const ann = "metadata.annotations[" + provision.ReplicasAnnotation + "]"
	for _, set := range crdtest.Sets {
		t.Run(string(set), func(t *testing.T) {
			w := newWorldOf(t, set)
			if set == crdtest.Upstream {
				for _, o := range []client.Object{
					kubeOVN("Vpc", "vpc1", map[string]any{}),
					kubeOVN("Subnet", "vpc1-net", map[string]any{"cidrBlock": "10.0.1.0/24", "gateway": "10.0.1.1", "vpc": "vpc1", "protocol": "IPv4"}),
					kubeOVN("Subnet", kubeovn.DefaultExternalNetwork, map[string]any{"cidrBlock": "192.0.2.0/24", "gateway": "192.0.2.1", "protocol": "IPv4", "provider": "ovn-vpc-external-network.kube-system"}),
				} {
					if err := w.c.Create(w.ctx, o); err != nil {
						t.Fatalf("create %s: %v", o.GetName(), err)
					}
				}
			}
			type tc struct {
				name string
				obj  *v1.VpcNatGateway
				want []string // empty: admitted
			}
			creates := []tc{
				{"annotation 2", replicasGW("gw-a2", nil, ptr.To("2")), nil},
				{"annotation 1", replicasGW("gw-a1", nil, ptr.To("1")), nil},
				{"annotation 0", replicasGW("gw-a0", nil, ptr.To("0")), []string{ann, `Invalid value: "0"`, "want 1"}},
				{"annotation 3", replicasGW("gw-a3", nil, ptr.To("3")), []string{ann, `"3"`}},
				{"annotation negative", replicasGW("gw-an", nil, ptr.To("-1")), []string{ann, `"-1"`}},
				{"annotation not a number", replicasGW("gw-ax", nil, ptr.To("two")), []string{ann, `"two"`, "not an integer"}},
			}
			if set == crdtest.Natgw {
				creates = append(creates,
					tc{"spec 1", replicasGW("gw-s1", ptr.To[int32](1), nil), nil},
					tc{"spec 2", replicasGW("gw-s2", ptr.To[int32](2), nil), nil},
					tc{"spec unset (defaulted to 1)", replicasGW("gw-s", nil, nil), nil},
					// The CRD schema's minimum refuses these before the webhook.
					tc{"spec 0", replicasGW("gw-s0", ptr.To[int32](0), nil), []string{"spec.replicas", "Invalid value: 0"}},
					tc{"spec negative", replicasGW("gw-sn", ptr.To[int32](-3), nil), []string{"spec.replicas", "Invalid value: -3"}},
					// The webhook (provision.Replicas).
					tc{"spec 3", replicasGW("gw-s3", ptr.To[int32](3), nil), []string{"spec.replicas", "Invalid value: 3", "want 1 (one gateway pod) or 2"}},
					tc{"spec 100", replicasGW("gw-s100", ptr.To[int32](100), nil), []string{"spec.replicas", "Invalid value: 100"}},
					tc{"spec 2, annotation 1", replicasGW("gw-s2a1", ptr.To[int32](2), ptr.To("1")), []string{ann, `"1"`, "disagrees with spec.replicas 2"}},
				)
			}
			objs := map[string]*v1.VpcNatGateway{}
			for _, c := range creates {
				err := w.c.Create(w.ctx, c.obj)
				check(t, "create: "+c.name, err, c.want...)
				if err != nil && len(c.want) > 0 && !apierrors.IsInvalid(err) {
					t.Errorf("create: %s: %v is not a 422 Invalid", c.name, err)
				}
				if err == nil {
					w.cached(c.obj)
					objs[c.obj.Name] = c.obj
				}
			}
			if t.Failed() {
				t.FailNow()
			}
			upd := func(name string, mut func(*v1.VpcNatGateway)) error {
				g := &v1.VpcNatGateway{}
				if err := w.c.Get(w.ctx, types.NamespacedName{Name: name}, g); err != nil {
					t.Fatal(err)
				}
				mut(g)
				return w.c.Update(w.ctx, g)
			}
			setAnn := func(v string) func(*v1.VpcNatGateway) {
				return func(g *v1.VpcNatGateway) { g.Annotations[provision.ReplicasAnnotation] = v }
			}
			check(t, "update: annotation 2 -> 1", upd("gw-a2", setAnn("1")), "spec.replicas", "Forbidden", "runs 2 replica(s) and cannot change to 1", "create a new VpcNatGateway")
			check(t, "update: annotation 1 -> 2", upd("gw-a1", setAnn("2")), "spec.replicas", "cannot change to 2")
			check(t, "update: annotation 2 removed", upd("gw-a2", func(g *v1.VpcNatGateway) { delete(g.Annotations, provision.ReplicasAnnotation) }), "cannot change to 1")
			check(t, "update: annotation 2 -> 3", upd("gw-a2", setAnn("3")), ann, `"3"`)
			check(t, "update: annotation 2 -> \" 2\" (the same number)", upd("gw-a2", setAnn(" 2")))
			check(t, "update: another annotation", upd("gw-a1", func(g *v1.VpcNatGateway) { g.Annotations["team"] = "net" }))
			check(t, "update: another spec field", upd("gw-a2", func(g *v1.VpcNatGateway) { g.Spec.Selector = []string{"zone: a"} }))
			if set == crdtest.Natgw {
				setSpec := func(n int32) func(*v1.VpcNatGateway) {
					return func(g *v1.VpcNatGateway) { g.Spec.Replicas = ptr.To(n) }
				}
				check(t, "update: spec 1 -> 2", upd("gw-s1", setSpec(2)), "spec.replicas", "cannot change to 2")
				check(t, "update: spec.namespace set", upd("gw-s1", func(g *v1.VpcNatGateway) { g.Spec.Namespace = "gw-ns" }), "spec.namespace", "Forbidden", `"" cannot change to "gw-ns"`, "create a new VpcNatGateway")
				check(t, "update: spec 2 -> 1", upd("gw-s2", setSpec(1)), "spec.replicas", "cannot change to 1")
				check(t, "update: spec 2 -> 3", upd("gw-s2", setSpec(3)), "spec.replicas", "Invalid value: 3")
				check(t, "update: defaulted 1 -> annotation 2", upd("gw-s", func(g *v1.VpcNatGateway) {
					g.Annotations = map[string]string{provision.ReplicasAnnotation: "2"}
				}), "cannot change to 2")
				check(t, "update: spec 2, labels", upd("gw-s2", func(g *v1.VpcNatGateway) { g.Labels = map[string]string{"a": "b"} }))
			}
		})
	}
}
