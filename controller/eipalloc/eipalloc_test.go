package eipalloc

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
)

func eip(name, uid, v4, subnet string) *v1.IptablesEIP {
	e := &v1.IptablesEIP{}
	e.Name, e.UID = name, types.UID(uid)
	e.Spec.V4ip, e.Spec.ExternalSubnet = v4, subnet
	return e
}

func TestVipName(t *testing.T) {
	long := func(n int, c string) string { return strings.Repeat(c, n) }
	for _, tc := range []struct {
		name, eip string
		want      string // "" = check only validity and length
	}{
		{"short", "eip1", "natgw-eip-eip1"},
		{"dotted", "a.b-c", "natgw-eip-a.b-c"},
		{"at limit", long(253-len(NamePrefix), "a"), NamePrefix + long(253-len(NamePrefix), "a")},
		{"one over", long(254-len(NamePrefix), "a"), ""},
		{"253 long", long(253, "b"), ""},
		{"cut at dash", long(225, "c") + "-" + long(27, "d"), ""},
		{"cut at dot", long(225, "c") + "." + long(27, "d"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := VipName(tc.eip)
			if tc.want != "" && got != tc.want {
				t.Fatalf("VipName(%q) = %q, want %q", tc.eip, got, tc.want)
			}
			if len(got) > validation.DNS1123SubdomainMaxLength {
				t.Fatalf("VipName: %d characters", len(got))
			}
			if msgs := validation.IsDNS1123Subdomain(got); len(msgs) > 0 {
				t.Fatalf("VipName(%q) = %q: not a DNS subdomain: %v", tc.eip, got, msgs)
			}
			if got != VipName(tc.eip) || !strings.HasPrefix(got, NamePrefix) {
				t.Fatalf("VipName not deterministic or prefixed: %q", got)
			}
		})
	}
	// Long names differing only after the cut still map apart.
	a, b := VipName(long(240, "e")+"1"), VipName(long(240, "e")+"2")
	if a == b {
		t.Fatalf("distinct long names share a Vip name %q", a)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *v1.IptablesEIP
		want string // "" = valid; else substrings of the error, comma-separated
		addr string
	}{
		{"random", eip("e1", "u1", "", ""), "", ""},
		{"static", eip("e1", "u1", "172.18.0.10", "ext"), "", "172.18.0.10"},
		{"nil", nil, "nil object", ""},
		{"no name", eip("", "u1", "", ""), "metadata.name", ""},
		{"bad name", eip("E_1", "u1", "", ""), "metadata.name,E_1", ""},
		{"no uid", eip("e1", "", "", ""), "metadata.uid", ""},
		{"bad subnet", eip("e1", "u1", "", "Ext_1"), "spec.externalSubnet,Ext_1", ""},
		{"v6", eip("e1", "u1", "fd00::10", ""), "spec.v4ip,fd00::10,not an IPv4", ""},
		{"mapped", eip("e1", "u1", "::ffff:10.0.0.1", ""), "spec.v4ip,not an IPv4", ""},
		{"cidr", eip("e1", "u1", "10.0.0.1/24", ""), "spec.v4ip,10.0.0.1/24", ""},
		{"leading zero", eip("e1", "u1", "10.0.0.01", ""), "spec.v4ip,10.0.0.01", ""},
		{"octet", eip("e1", "u1", "10.0.0.300", ""), "spec.v4ip", ""},
		{"unspecified", eip("e1", "u1", "0.0.0.0", ""), "spec.v4ip,not a unicast", ""},
		{"multicast", eip("e1", "u1", "224.0.0.1", ""), "spec.v4ip,not a unicast", ""},
		{"broadcast", eip("e1", "u1", "255.255.255.255", ""), "spec.v4ip,not a unicast", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Validate(tc.e)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if tc.addr != "" && got != netip.MustParseAddr(tc.addr) || tc.addr == "" && got.IsValid() {
					t.Fatalf("Validate = %v, want %q", got, tc.addr)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate: %v, want ErrInvalid", err)
			}
			for _, s := range strings.Split(tc.want, ",") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}

func TestNewVip(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    *v1.IptablesEIP
		spec map[string]any
	}{
		{"random default subnet", eip("e1", "u1", "", ""), map[string]any{"subnet": kubeovn.DefaultExternalNetwork}},
		{"static", eip("e2", "u2", "172.18.0.9", "ext"), map[string]any{"subnet": "ext", "v4ip": "172.18.0.9"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := NewVip(tc.e)
			if u.GroupVersionKind() != VipGVK || u.GetName() != VipName(tc.e.Name) || u.GetNamespace() != "" {
				t.Fatalf("identity: %v %q %q", u.GroupVersionKind(), u.GetName(), u.GetNamespace())
			}
			if u.GetLabels()[ManagedByLabel] != FieldManager {
				t.Errorf("labels %v", u.GetLabels())
			}
			refs := u.GetOwnerReferences()
			if len(refs) != 1 || refs[0].APIVersion != "kubeovn.io/v1" || refs[0].Kind != "IptablesEIP" ||
				refs[0].Name != tc.e.Name || refs[0].UID != tc.e.UID ||
				!ptr.Deref(refs[0].Controller, false) || !ptr.Deref(refs[0].BlockOwnerDeletion, false) {
				t.Errorf("owner references %+v", refs)
			}
			spec, _, _ := unstructured.NestedMap(u.Object, "spec")
			if len(spec) != len(tc.spec) {
				t.Errorf("spec %v, want %v", spec, tc.spec)
			}
			for k, v := range tc.spec {
				if spec[k] != v {
					t.Errorf("spec.%s = %v, want %v", k, spec[k], v)
				}
			}
			if _, ok := u.Object["status"]; ok {
				t.Errorf("a created Vip carries a status: %v", u.Object["status"])
			}
		})
	}
}

// kubeOVNVip is a Vip as Kube-OVN's createOrUpdateVipCR leaves it
// (vip.go:404-435): spec and status set from the allocation.
func kubeOVNVip(e *v1.IptablesEIP, specV4, statusV4, mac string) *unstructured.Unstructured {
	u := NewVip(e)
	_ = unstructured.SetNestedField(u.Object, specV4, "spec", "v4ip")
	_ = unstructured.SetNestedField(u.Object, map[string]any{"v4ip": statusV4, "v6ip": "", "mac": mac}, "status")
	return u
}

func TestReserved(t *testing.T) {
	e := eip("e1", "u1", "", "ext")
	static := eip("e1", "u1", "172.18.0.10", "ext")
	other := func(u *unstructured.Unstructured, refs ...metav1.OwnerReference) *unstructured.Unstructured {
		u.SetOwnerReferences(refs)
		return u
	}
	deleting := NewVip(e)
	deleting.SetDeletionTimestamp(&metav1.Time{})
	for _, tc := range []struct {
		name string
		e    *v1.IptablesEIP
		vip  *unstructured.Unstructured
		want string // address; "" = pending
		err  error
		msg  string // substrings, comma-separated
	}{
		{name: "pending", e: e, vip: NewVip(e)},
		{name: "pending static", e: static, vip: NewVip(static)},
		{name: "deleting", e: e, vip: deleting},
		{name: "reserved", e: e, vip: kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "00:00:00:aa:bb:cc"), want: "172.18.0.20"},
		{name: "static reserved", e: static, vip: kubeOVNVip(static, "172.18.0.10", "172.18.0.10", "00:00:00:aa:bb:cc"), want: "172.18.0.10"},
		{name: "v4ip changed after reservation", e: static, vip: kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "m"),
			err: ErrConflict, msg: "spec.v4ip,172.18.0.10,172.18.0.20,natgw-eip-e1"},
		{name: "v4ip changed while pending", e: static, vip: NewVip(e), err: ErrConflict, msg: "spec.v4ip,172.18.0.10"},
		{name: "subnet changed", e: eip("e1", "u1", "", "ext2"), vip: NewVip(e), err: ErrConflict, msg: "spec.externalSubnet,ext2,spec.subnet"},
		{name: "no IPv4 in subnet", e: e, vip: kubeOVNVip(e, "", "", "00:00:00:aa:bb:cc"), err: ErrSubnet, msg: "status.v4ip,ext"},
		{name: "bad status", e: e, vip: kubeOVNVip(e, "x", "fd00::1", "m"), msg: "status.v4ip,fd00::1"},
		{name: "no owner", e: e, vip: other(NewVip(e)), err: ErrNotOwned, msg: "natgw-eip-e1,no controlling owner"},
		{name: "other eip", e: e, vip: other(NewVip(e), metav1.OwnerReference{APIVersion: "kubeovn.io/v1", Kind: "IptablesEIP", Name: "e1", UID: "old", Controller: ptr.To(true)}),
			err: ErrNotOwned, msg: "uid old"},
		{name: "other kind", e: e, vip: other(NewVip(e), metav1.OwnerReference{APIVersion: "kubeovn.io/v1", Kind: "OvnEip", Name: "e1", UID: "u1", Controller: ptr.To(true)}),
			err: ErrNotOwned, msg: "OvnEip"},
		{name: "owner not controller", e: e, vip: other(NewVip(e), metav1.OwnerReference{APIVersion: "kubeovn.io/v1", Kind: "IptablesEIP", Name: "e1", UID: "u1"}),
			err: ErrNotOwned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Reserved(tc.e, tc.vip)
			if tc.err == nil && tc.msg == "" {
				if err != nil {
					t.Fatalf("Reserved: %v", err)
				}
				if tc.want == "" && got.IsValid() || tc.want != "" && got != netip.MustParseAddr(tc.want) {
					t.Fatalf("Reserved = %v, want %q", got, tc.want)
				}
				return
			}
			if err == nil || got.IsValid() {
				t.Fatalf("Reserved = %v, %v; want an error", got, err)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("error %v, want %v", err, tc.err)
			}
			for _, s := range strings.Split(tc.msg, ",") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}

func TestCheckSubnet(t *testing.T) {
	for _, tc := range []struct {
		name, cidr, gw, static string
		msg                    string
	}{
		{"v4", "172.18.0.0/16", "172.18.0.1", "", ""},
		{"static inside", "172.18.0.0/16", "172.18.0.1", "172.18.3.4", ""},
		{"dual", "fd00::/64,172.18.0.0/16", "fd00::1,172.18.0.1", "172.18.3.4", ""},
		{"v6 only", "fd00::/64", "fd00::1", "", "spec.cidrBlock,no IPv4"},
		{"empty", "", "", "", "no IPv4"},
		{"outside", "172.18.0.0/16", "172.18.0.1", "10.0.0.1", "spec.v4ip,10.0.0.1,outside,172.18.0.0/16"},
		{"gateway", "172.18.0.0/16", "172.18.0.1", "172.18.0.1", "spec.v4ip,gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var static netip.Addr
			if tc.static != "" {
				static = netip.MustParseAddr(tc.static)
			}
			err := CheckSubnet("ext", tc.cidr, tc.gw, static)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrSubnet) {
				t.Fatalf("CheckSubnet: %v, want ErrSubnet", err)
			}
			for _, s := range strings.Split(tc.msg, ",") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}

func TestEIPOfVip(t *testing.T) {
	ref := func(apiVersion, kind, name string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: "u", Controller: ptr.To(controller)}
	}
	for _, tc := range []struct {
		name string
		refs []metav1.OwnerReference
		want string
	}{
		{"eip", []metav1.OwnerReference{ref("kubeovn.io/v1", "IptablesEIP", "e1", true)}, "e1"},
		{"other version", []metav1.OwnerReference{ref("kubeovn.io/v2", "IptablesEIP", "e1", true)}, "e1"},
		{"not controller", []metav1.OwnerReference{ref("kubeovn.io/v1", "IptablesEIP", "e1", false)}, ""},
		{"other group", []metav1.OwnerReference{ref("example.com/v1", "IptablesEIP", "e1", true)}, ""},
		{"other kind", []metav1.OwnerReference{ref("kubeovn.io/v1", "OvnEip", "e1", true)}, ""},
		{"bad apiVersion", []metav1.OwnerReference{ref("a/b/c", "IptablesEIP", "e1", true)}, ""},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := NewVip(eip("x", "u", "", ""))
			u.SetOwnerReferences(tc.refs)
			got := EIPOfVip(context.Background(), u)
			if tc.want == "" {
				if len(got) != 0 {
					t.Fatalf("EIPOfVip = %v, want none", got)
				}
				return
			}
			if len(got) != 1 || got[0].Name != tc.want || got[0].Namespace != "" {
				t.Fatalf("EIPOfVip = %v, want %s", got, tc.want)
			}
		})
	}
	if got := EIPOfVip(context.Background(), nil); got != nil {
		t.Errorf("EIPOfVip(nil) = %v", got)
	}
	if got := EIPOfVip(context.Background(), (*unstructured.Unstructured)(nil)); got != nil {
		t.Errorf("EIPOfVip(typed nil) = %v", got)
	}
}

func TestNilInputs(t *testing.T) {
	var a *Allocator
	ctx := context.Background()
	if _, err := a.Ensure(ctx, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Ensure(nil): %v", err)
	}
	if _, err := a.Ensure(ctx, eip("e1", "u1", "", "")); err == nil || !strings.Contains(err.Error(), "no client") {
		t.Errorf("Ensure without client: %v", err)
	}
	if _, err := a.Release(ctx, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Release(nil): %v", err)
	}
	if done, err := (&Allocator{}).Release(ctx, eip("e1", "", "", "")); done || !errors.Is(err, ErrInvalid) {
		t.Errorf("Release without uid: %v %v", done, err)
	}
}

// TestReservedV6: on a dual-stack external subnet Kube-OVN writes the
// Vip's status.v6ip beside status.v4ip; ReservedV6 reads it (the EIP's
// IPv6 address), refuses one natgw cannot program or that differs from
// spec.v6ip, and has none for a Vip that is not the EIP's, pending or gone.
func TestReservedV6(t *testing.T) {
	e := eip("e1", "u1", "", "ext")
	static6 := eip("e1", "u1", "", "ext")
	static6.Spec.V6ip = "2001:db8::20"
	withV6 := func(u *unstructured.Unstructured, v6 string) *unstructured.Unstructured {
		_ = unstructured.SetNestedField(u.Object, v6, "status", "v6ip")
		return u
	}
	notOwned := NewVip(e)
	notOwned.SetOwnerReferences(nil)
	for _, tc := range []struct {
		name string
		e    *v1.IptablesEIP
		vip  *unstructured.Unstructured // nil: none
		want string                     // "" = none
		err  error
		msg  string
	}{
		{name: "no vip", e: e},
		{name: "pending", e: e, vip: NewVip(e)},
		{name: "IPv4-only subnet", e: e, vip: kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "m")},
		{name: "dual stack", e: e, vip: withV6(kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "m"), "2001:db8::20"), want: "2001:db8::20"},
		{name: "static v6 reserved", e: static6, vip: withV6(kubeOVNVip(static6, "172.18.0.20", "172.18.0.20", "m"), "2001:db8::20"), want: "2001:db8::20"},
		{name: "v6ip changed after reservation", e: static6, vip: withV6(kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "m"), "2001:db8::21"),
			err: ErrConflict, msg: "spec.v6ip"},
		{name: "bad status", e: e, vip: withV6(kubeOVNVip(e, "172.18.0.20", "172.18.0.20", "m"), "fe80::1"), msg: "status.v6ip"},
		{name: "not owned", e: e, vip: withV6(notOwned, "2001:db8::20")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mapper := meta.NewDefaultRESTMapper(nil)
			mapper.Add(VipGVK, meta.RESTScopeRoot)
			b := fake.NewClientBuilder().WithScheme(testScheme(t)).WithRESTMapper(mapper)
			if tc.vip != nil {
				b.WithObjects(tc.vip)
			}
			got, err := (&Allocator{Client: b.Build()}).ReservedV6(context.Background(), tc.e)
			if tc.err != nil || tc.msg != "" {
				if err == nil || (tc.err != nil && !errors.Is(err, tc.err)) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("ReservedV6 = %v, %v; want an error %v naming %q", got, err, tc.err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (tc.want == "" && got.IsValid()) || (tc.want != "" && got != netip.MustParseAddr(tc.want)) {
				t.Errorf("ReservedV6 = %v, want %q", got, tc.want)
			}
		})
	}
	// The Vip asks for a static IPv6 address as Kube-OVN's vip.go reads it.
	if v6, _, _ := unstructured.NestedString(NewVip(static6).Object, "spec", "v6ip"); v6 != "2001:db8::20" {
		t.Errorf("NewVip spec.v6ip = %q", v6)
	}
}
