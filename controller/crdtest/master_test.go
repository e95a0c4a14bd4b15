package crdtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/natgw/natgw/internal/apitest"
)

// masterField is one field Kube-OVN master's schema has and v1.16.2's has
// not: a fact read from charts/kube-ovn-v2/crds/kube-ovn-crd.yaml at
// github.com/kubeovn/kube-ovn 1533681d7 (the Go module proxy serves no
// master, so the facts are written here, with the line they were read at).
type masterField struct {
	kind string
	path []string // under the object
	line int      // in master's kube-ovn-crd.yaml
	typ  string
	def  string // JSON of the default, "" for none
	min  *float64
	max  *float64
	enum []string
	// sample is a value master accepts, written and read back by the
	// round trip; defaulted lists the fields the API server defaults
	// when the sample leaves them out.
	sample    any
	defaulted map[string]any
}

func f(v float64) *float64 { return &v }

// masterFields are master's new fields of the kinds natgw serves.
var masterFields = []masterField{
	{kind: "VpcNatGateway", path: []string{"spec", "namespace"}, line: 5697, typ: "string", sample: "gateways"},
	{kind: "VpcNatGateway", path: []string{"spec", "replicas"}, line: 5708, typ: "integer", def: "1", min: f(1), sample: int64(2)},
	{kind: "VpcNatGateway", path: []string{"spec", "bfd"}, line: 5594, typ: "object",
		sample: map[string]any{"enabled": true}, defaulted: map[string]any{"minRX": int64(1000), "minTX": int64(1000), "multiplier": int64(3)}},
	{kind: "VpcNatGateway", path: []string{"spec", "bfd", "enabled"}, line: 5598, typ: "boolean", def: "false"},
	{kind: "VpcNatGateway", path: []string{"spec", "bfd", "minRX"}, line: 5605, typ: "integer", def: "1000", min: f(1), max: f(3600000)},
	{kind: "VpcNatGateway", path: []string{"spec", "bfd", "minTX"}, line: 5614, typ: "integer", def: "1000", min: f(1), max: f(3600000)},
	{kind: "VpcNatGateway", path: []string{"spec", "bfd", "multiplier"}, line: 5623, typ: "integer", def: "3", min: f(1), max: f(255)},
	{kind: "VpcNatGateway", path: []string{"spec", "internalCIDRs"}, line: 5676, typ: "array", sample: []any{"10.0.1.0/24", "10.0.2.0/24"}},
	{kind: "VpcNatGateway", path: []string{"spec", "internalSubnets"}, line: 5684, typ: "array", sample: []any{"subnet-a", "subnet-b"}},
	{kind: "IptablesDnatRule", path: []string{"spec", "type"}, line: 685, typ: "string", def: `"exclusive"`, enum: []string{"exclusive", "share"}, sample: "share"},
}

// schemaAt returns the schema of path under crd's, or nil.
func schemaAt(crd *apiextv1.CustomResourceDefinition, path []string) *apiextv1.JSONSchemaProps {
	s := Schema(crd)
	for _, p := range path {
		if s == nil {
			return nil
		}
		next, ok := s.Properties[p]
		if !ok {
			return nil
		}
		s = &next
	}
	return s
}

// TestMasterFields: natgw's schema has every field master added, with
// master's type and default, and accepts at least what master accepts
// (minimum no higher, maximum no lower, every enum value).
func TestMasterFields(t *testing.T) {
	ours, err := LoadSet(context.Background(), Natgw, natgwDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range masterFields {
		name := mf.kind + "." + strings.Join(mf.path, ".")
		t.Run(name, func(t *testing.T) {
			crd := ours[mf.kind]
			if crd == nil {
				t.Fatalf("no CRD of kind %s", mf.kind)
			}
			s := schemaAt(crd, mf.path)
			if s == nil {
				t.Fatalf("%s: missing (master's kube-ovn-crd.yaml:%d has it)", name, mf.line)
			}
			if s.Type != mf.typ {
				t.Errorf("%s: type %q, master's (line %d) %q", name, s.Type, mf.line, mf.typ)
			}
			def := ""
			if s.Default != nil {
				def = string(s.Default.Raw)
			}
			if def != mf.def {
				t.Errorf("%s: default %s, master's (line %d) %s", name, def, mf.line, mf.def)
			}
			if mf.min != nil && (s.Minimum == nil || *s.Minimum > *mf.min) {
				t.Errorf("%s: minimum %v, master's (line %d) %v: natgw would refuse what master accepts", name, s.Minimum, mf.line, *mf.min)
			}
			if mf.max != nil && s.Maximum != nil && *s.Maximum < *mf.max {
				t.Errorf("%s: maximum %v, master's (line %d) %v", name, *s.Maximum, mf.line, *mf.max)
			}
			var enum []string
			for _, e := range s.Enum {
				var v string
				if err := json.Unmarshal(e.Raw, &v); err != nil {
					t.Fatalf("%s: enum value %s: %v", name, e.Raw, err)
				}
				enum = append(enum, v)
			}
			for _, e := range mf.enum {
				if len(enum) > 0 && !slices.Contains(enum, e) {
					t.Errorf("%s: enum %v lacks master's %q (line %d)", name, enum, e, mf.line)
				}
			}
		})
	}
}

// TestMasterFieldsKept: an API server serving natgw's CRDs accepts an
// object with master's fields set to values master accepts, keeps each
// (nothing pruned), and defaults what master defaults.
func TestMasterFieldsKept(t *testing.T) {
	assets := apitest.RequireAssets(t)
	cfg := apitest.StartT(t, apitest.Environment(assets, natgwDir(t)))
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	resources := map[string]string{"VpcNatGateway": "vpc-nat-gateways", "IptablesDnatRule": "iptables-dnat-rules"}
	objs := map[string]*unstructured.Unstructured{}
	for kind := range resources {
		u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
		u.SetAPIVersion("kubeovn.io/v1")
		u.SetKind(kind)
		u.SetName("master-" + strings.ToLower(kind))
		objs[kind] = u
	}
	for _, mf := range masterFields {
		if mf.sample != nil {
			if err := unstructured.SetNestedField(objs[mf.kind].Object, mf.sample, mf.path...); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The rest of a valid DNAT, as natgw's schema checks it.
	for k, v := range map[string]any{"eip": "eip-a", "externalPort": "443", "internalIp": "10.0.1.5", "internalPort": "8443", "protocol": "tcp"} {
		if err := unstructured.SetNestedField(objs["IptablesDnatRule"].Object, v, "spec", k); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]*unstructured.Unstructured{}
	for kind, res := range resources {
		c := dyn.Resource(schema.GroupVersionResource{Group: "kubeovn.io", Version: "v1", Resource: res})
		if _, err := c.Create(ctx, objs[kind], createOpts); err != nil {
			t.Fatalf("create %s with master's fields: %v", kind, err)
		}
		if got[kind], err = c.Get(ctx, objs[kind].GetName(), getOpts); err != nil {
			t.Fatal(err)
		}
	}
	for _, mf := range masterFields {
		name := mf.kind + "." + strings.Join(mf.path, ".")
		v, found, err := unstructured.NestedFieldNoCopy(got[mf.kind].Object, mf.path...)
		if err != nil || !found {
			t.Errorf("%s: not kept (%v)", name, err)
			continue
		}
		if mf.sample == nil {
			continue
		}
		want := mf.sample
		if mf.defaulted != nil {
			m := map[string]any{}
			for k, x := range mf.sample.(map[string]any) {
				m[k] = x
			}
			for k, x := range mf.defaulted {
				m[k] = x
			}
			want = m
		}
		if fmt.Sprint(v) != fmt.Sprint(want) {
			t.Errorf("%s: stored %v, want %v", name, v, want)
		}
	}
	// Master's defaults apply to an object that leaves them out.
	c := dyn.Resource(schema.GroupVersionResource{Group: "kubeovn.io", Version: "v1", Resource: "iptables-dnat-rules"})
	bare := objs["IptablesDnatRule"].DeepCopy()
	bare.SetName("master-default")
	unstructured.RemoveNestedField(bare.Object, "spec", "type")
	if _, err := c.Create(ctx, bare, createOpts); err != nil {
		t.Fatal(err)
	}
	stored, err := c.Get(ctx, bare.GetName(), getOpts)
	if err != nil {
		t.Fatal(err)
	}
	if typ, _, _ := unstructured.NestedString(stored.Object, "spec", "type"); typ != "exclusive" {
		t.Errorf("IptablesDnatRule without spec.type stored with %q, want master's default exclusive", typ)
	}
	g := dyn.Resource(schema.GroupVersionResource{Group: "kubeovn.io", Version: "v1", Resource: "vpc-nat-gateways"})
	gw := objs["VpcNatGateway"].DeepCopy()
	gw.SetName("master-default-gw")
	unstructured.RemoveNestedField(gw.Object, "spec", "replicas")
	if _, err := g.Create(ctx, gw, createOpts); err != nil {
		t.Fatal(err)
	}
	if stored, err = g.Get(ctx, gw.GetName(), getOpts); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := unstructured.NestedInt64(stored.Object, "spec", "replicas"); n != 1 {
		t.Errorf("VpcNatGateway without spec.replicas stored with %d, want master's default 1", n)
	}
	// And refuses what master refuses.
	for _, bad := range []struct {
		res  string
		obj  *unstructured.Unstructured
		path []string
		val  any
	}{
		{"iptables-dnat-rules", objs["IptablesDnatRule"], []string{"spec", "type"}, "round-robin"},
		{"vpc-nat-gateways", objs["VpcNatGateway"], []string{"spec", "replicas"}, int64(0)},
		{"vpc-nat-gateways", objs["VpcNatGateway"], []string{"spec", "bfd", "multiplier"}, int64(256)},
	} {
		o := bad.obj.DeepCopy()
		o.SetName("bad-" + strings.ToLower(strings.Join(bad.path, "-")))
		if err := unstructured.SetNestedField(o.Object, bad.val, bad.path...); err != nil {
			t.Fatal(err)
		}
		r := dyn.Resource(schema.GroupVersionResource{Group: "kubeovn.io", Version: "v1", Resource: bad.res})
		if _, err := r.Create(ctx, o, createOpts); err == nil {
			t.Errorf("%s %s=%v accepted; master refuses it", bad.res, strings.Join(bad.path, "."), bad.val)
		}
	}
}

var (
	createOpts = metav1.CreateOptions{}
	getOpts    = metav1.GetOptions{}
)
