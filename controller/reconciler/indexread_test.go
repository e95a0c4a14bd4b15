package reconciler

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// TestEachIndexed reads each field index RegisterIndexes registers
// through the informers' indexers (Deps.Informers) and through a cache
// List (no Informers): both must give exactly the objects whose field has
// the value, so the index name and key eachIndexed builds are the
// cache's.
func TestEachIndexed(t *testing.T) {
	cfg := apiServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := RegisterIndexes(ctx, ca); err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	cached, err := client.New(cfg, client.Options{Scheme: testScheme, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		t.Fatal(err)
	}

	const p = "eachidx-"
	om := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: p + name, Labels: map[string]string{testLabel: "eachidx"}}
	}
	eip := func(name, gw, qos string) *v1.IptablesEIP {
		return &v1.IptablesEIP{ObjectMeta: om(name), Spec: v1.IptablesEIPSpec{V4ip: "192.0.2.1", NatGwDp: p + gw, QoSPolicy: qos}}
	}
	fip := func(name, eip string) *v1.IptablesFIPRule {
		return &v1.IptablesFIPRule{ObjectMeta: om(name), Spec: v1.IptablesFIPRuleSpec{EIP: p + eip, InternalIP: "10.0.0.5"}}
	}
	objs := []client.Object{
		eip("a", "g1", p+"q1"), eip("b", "g2", ""), eip("c", "g1", p+"q1"),
		fip("f1", "a"), fip("f2", "a"), fip("f3", "b"),
		&v1.IptablesDnatRule{ObjectMeta: om("d1"), Spec: v1.IptablesDnatRuleSpec{EIP: p + "a", ExternalPort: "80", InternalIP: "10.0.0.5", InternalPort: "80"}},
		&v1.VpcNatGateway{ObjectMeta: om("g1"), Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "net1", QoSPolicy: p + "q1"}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}

	cases := []struct {
		name  string
		obj   client.Object
		list  client.ObjectList
		index string
		value string
		want  []string
	}{
		{"fips of eip a", &v1.IptablesFIPRule{}, &v1.IptablesFIPRuleList{}, EIPIndex, p + "a", []string{p + "f1", p + "f2"}},
		{"fips of eip b", &v1.IptablesFIPRule{}, &v1.IptablesFIPRuleList{}, EIPIndex, p + "b", []string{p + "f3"}},
		{"dnats of eip a", &v1.IptablesDnatRule{}, &v1.IptablesDnatRuleList{}, EIPIndex, p + "a", []string{p + "d1"}},
		{"snats of eip a", &v1.IptablesSnatRule{}, &v1.IptablesSnatRuleList{}, EIPIndex, p + "a", nil},
		{"eips of gateway g1", &v1.IptablesEIP{}, &v1.IptablesEIPList{}, GatewayIndex, p + "g1", []string{p + "a", p + "c"}},
		{"eips of policy q1", &v1.IptablesEIP{}, &v1.IptablesEIPList{}, qosPolicyIndex, p + "q1", []string{p + "a", p + "c"}},
		{"gateways of policy q1", &v1.VpcNatGateway{}, &v1.VpcNatGatewayList{}, qosPolicyIndex, p + "q1", []string{p + "g1"}},
		{"no match", &v1.IptablesFIPRule{}, &v1.IptablesFIPRuleList{}, EIPIndex, p + "none", nil},
	}
	paths := []struct {
		name string
		deps *Deps
	}{
		{"informer index", &Deps{Client: cached, Informers: ca, Log: testLog(t)}},
		{"cache list", &Deps{Client: cached, Log: testLog(t)}},
	}
	names := func(d *Deps, tc int) ([]string, error) {
		var got []string
		err := d.eachIndexed(ctx, cases[tc].obj, cases[tc].list, cases[tc].index, cases[tc].value, func(o client.Object) {
			got = append(got, o.GetName())
		})
		slices.Sort(got)
		return got, err
	}
	// The cache catches up with the creates: wait until the List path sees
	// them all (the last case with objects).
	if err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		for i, tc := range cases {
			if got, err := names(paths[1].deps, i); err != nil || !slices.Equal(got, tc.want) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("cache never listed the objects: %v", err)
	}
	for i, tc := range cases {
		for _, path := range paths {
			t.Run(tc.name+"/"+path.name, func(t *testing.T) {
				got, err := names(path.deps, i)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, tc.want) {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			})
		}
	}
}
