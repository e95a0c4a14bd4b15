package admission_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/natgw/natgw/controller/admission"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/nat"
)

// The four paths a value can enter natgw by: the admission webhook, the
// reconcile's translation, the compat CLI (Kube-OVN's nat-gateway.sh
// calls) and the agent (nat.Object.Validate, on the typed wire form).
const (
	pathAdmission = "admission"
	pathReconcile = "reconcile"
	pathCompat    = "compat"
	pathAgent     = "agent"
)

var paths = []string{pathAdmission, pathReconcile, pathCompat, pathAgent}

// The verdicts of one path.
const (
	refused  = "refused"
	accepted = "accepted"
	// na: the path cannot carry the value at all (the agent's wire form is
	// typed: a port is a number, an address a netip.Addr).
	na = "n/a"
)

// A logical field and its name on each path. The CRD name is the one
// admission and reconcile both report.
type fieldNames struct{ crd, compat, agent string }

var names = map[string]fieldNames{
	"dnat.externalPort": {"spec.externalPort", "externalPort", "dnat.externalPort"},
	"dnat.protocol":     {"spec.protocol", "protocol", "dnat.protocol"},
	"dnat.internalIP":   {"spec.internalIp", "internalIP", "dnat.internalIP"},
	"dnat.internalPort": {"spec.internalPort", "internalPort", "dnat.internalPort"},
	"snat.internalCIDR": {"spec.internalCIDR", "internalCIDR", "snat.internalCIDR"},
	"fip.internalIP":    {"spec.internalIp", "internalIP", "fip.internalIP"},
	"eip.address":       {"spec.v4ip", "eip", "eip.address"},
}

// The values of a valid rule; each row replaces one.
const (
	eipName = "e1"
	eipAddr = "198.51.100.10"
)

var good = map[string]string{
	"dnat.externalPort": "80", "dnat.protocol": "tcp", "dnat.internalIP": "10.0.1.5", "dnat.internalPort": "8080",
	"snat.internalCIDR": "10.0.1.0/24", "fip.internalIP": "10.0.1.5", "eip.address": eipAddr,
}

// TestCrossPath feeds the same bad value of one field to the four paths
// and requires the same verdict, each path naming the field (by its own
// name for it). Where upstream's own paths differ, the row says which
// path differs and why (except), and the test holds that difference.
func TestCrossPath(t *testing.T) {
	v := validator(t)
	for _, tc := range []struct {
		field, value string
		// except: the verdict of the paths that legitimately differ from
		// "refused, naming the field"; why says why.
		except map[string]string
		why    string
	}{
		// Ports: upstream's script hands the text to iptables, which reads
		// a leading zero as octal ("080" an error, "010" port 8); natgw
		// refuses both on every path that sees text.
		{"dnat.externalPort", "080", map[string]string{pathAgent: na}, "the agent's port is a number"},
		{"dnat.externalPort", "010", map[string]string{pathAgent: na}, "the agent's port is a number"},
		{"dnat.externalPort", "0", nil, ""},
		{"dnat.externalPort", "65536", map[string]string{pathAgent: na}, "the agent's port is 16 bits"},
		{"dnat.externalPort", "http", map[string]string{pathAgent: na}, "the agent's port is a number"},
		{"dnat.internalPort", "0", nil, ""},
		{"dnat.internalPort", "-1", map[string]string{pathAgent: na}, "the agent's port is a number"},
		{"dnat.internalPort", "65536", map[string]string{pathAgent: na}, "the agent's port is 16 bits"},
		// Protocol: iptables -p takes TCP as tcp (checked with iptables
		// 1.8.9, legacy and nft), and so do reconcile and compat
		// (nat.ParseProtocol); they hand the agent the canonical lower case.
		{"dnat.protocol", "TCP", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: accepted},
			"upstream takes TCP (iptables -p is case-insensitive); reconcile and compat lower it, the agent's wire form is canonical lower case"},
		{"dnat.protocol", "", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: refused},
			"the CRD defaults spec.protocol to tcp (nat.DefaultProtocol); the script has no default and drops an empty field (bash word splitting), so compat refuses the rule's shape; the agent's wire form always carries the protocol"},
		{"dnat.protocol", "icmp", nil, ""},
		// Addresses a gateway programs: unicast IPv4 only.
		{"dnat.internalIP", "127.0.0.1", nil, ""},
		{"dnat.internalIP", "0.0.0.0", nil, ""},
		{"dnat.internalIP", "224.0.0.1", nil, ""},
		{"dnat.internalIP", "255.255.255.255", nil, ""},
		{"dnat.internalIP", "2001:db8::1", nil, ""},
		{"dnat.internalIP", "10.0.1.5/32", map[string]string{pathAgent: na}, "the agent's address is a netip.Addr"},
		{"fip.internalIP", "127.0.0.1", nil, ""},
		{"fip.internalIP", "2001:db8::1", nil, ""},
		{"eip.address", "127.0.0.1", nil, ""},
		{"eip.address", "2001:db8::1", nil, ""},
		{"eip.address", "", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: accepted},
			"an IptablesEIP without spec.v4ip asks for an address (Kube-OVN's IPAM, or natgw's allocator); eip-add with an empty argument is a call with no rules, a no-op as in the script's loop; the agent needs an address"},
		{"eip.address", "198.51.100.10/24", map[string]string{pathCompat: accepted, pathAgent: na},
			"spec.v4ip is a bare address, while eip-add's argument is EIP/LEN (the prefix length of the external network)"},
		// SNAT internal CIDRs.
		{"snat.internalCIDR", "10.0.1.0/33", map[string]string{pathAgent: na}, "the agent's CIDR is a netip.Prefix"},
		{"snat.internalCIDR", "2001:db8::/64", nil, ""},
		{"snat.internalCIDR", "10.0.1.5/24", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: accepted},
			"upstream hands the CIDR to iptables -s, which masks host bits; reconcile and compat mask it too, the agent's wire form is the masked network"},
		{"snat.internalCIDR", "10.0.1.5", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: accepted, pathAgent: na},
			"a bare address is its /32 in the CRD and in the script (iptables -s)"},
	} {
		t.Run(tc.field+"="+strconv.Quote(tc.value), func(t *testing.T) {
			if (tc.except == nil) != (tc.why == "") {
				t.Fatal("a row that differs between paths must say why, and only such a row")
			}
			got := map[string]result{
				pathAdmission: admit(t, v, tc.field, tc.value),
				pathReconcile: reconcile(tc.field, tc.value),
				pathCompat:    compatCLI(tc.field, tc.value),
				pathAgent:     agent(tc.field, tc.value),
			}
			n := names[tc.field]
			wantField := map[string]string{pathAdmission: n.crd, pathReconcile: n.crd, pathCompat: n.compat, pathAgent: n.agent}
			for _, p := range paths {
				want, ok := tc.except[p]
				if !ok {
					want = refused
				}
				g := got[p]
				if g.verdict != want {
					t.Errorf("%s: %s (%s), want %s", p, g.verdict, g.err, want)
					continue
				}
				// A refusal names the field, except compat's refusal of the
				// rule's shape (an empty field dropped, as the script does).
				if want == refused && g.field != wantField[p] && !(p == pathCompat && tc.value == "") {
					t.Errorf("%s refused naming field %q (%s), want %q", p, g.field, g.err, wantField[p])
				}
			}
		})
	}
}

type result struct {
	verdict, field, err string
}

func verdictOf(err error) result {
	if err == nil {
		return result{verdict: accepted}
	}
	r := result{verdict: refused, err: err.Error()}
	var fe *nat.FieldError
	var ae *compat.ArgError
	switch {
	case errors.As(err, &ae):
		r.field = ae.Field
	case errors.As(err, &fe):
		r.field = fe.Field
	}
	return r
}

// values returns the values of a valid object of field's kind with field
// set to value.
func values(field, value string) map[string]string {
	kind, _, _ := strings.Cut(field, ".")
	out := map[string]string{}
	for f, v := range good {
		if strings.HasPrefix(f, kind+".") {
			out[f] = v
		}
	}
	out[field] = value
	return out
}

// crdObject is field's kind as the API object, with field set to value.
func crdObject(field, value string) (client.Object, string) {
	f := values(field, value)
	om := metav1.ObjectMeta{Name: "r1", UID: types.UID("3f2a7c1e-0000-4000-8000-000000000001")}
	switch kind, _, _ := strings.Cut(field, "."); kind {
	case "dnat":
		return &v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{EIP: eipName, ExternalPort: f["dnat.externalPort"],
			Protocol: f["dnat.protocol"], InternalIP: f["dnat.internalIP"], InternalPort: f["dnat.internalPort"]}}, "IptablesDnatRule"
	case "snat":
		return &v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{EIP: eipName, InternalCIDR: f["snat.internalCIDR"]}}, "IptablesSnatRule"
	case "fip":
		return &v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{EIP: eipName, InternalIP: f["fip.internalIP"]}}, "IptablesFIPRule"
	}
	return &v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: f["eip.address"], NatGwDp: "gw1"}}, "IptablesEIP"
}

// fieldIndexer registers the controller's indexes on a fake client.
type fieldIndexer struct{ b *fake.ClientBuilder }

func (x fieldIndexer) IndexField(_ context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	x.b.WithIndex(obj, field, fn)
	return nil
}

// validator is the webhook's Validator over a fake client holding the
// rules' EIP, with the controller's own indexes (no Kube-OVN lookups).
func validator(t *testing.T) *admission.Validator {
	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(&v1.IptablesEIP{
		ObjectMeta: metav1.ObjectMeta{Name: eipName}, Spec: v1.IptablesEIPSpec{V4ip: eipAddr, NatGwDp: "gw1"}})
	if err := reconciler.RegisterIndexes(context.Background(), fieldIndexer{b}); err != nil {
		t.Fatal(err)
	}
	return admission.New(b.Build(), scheme, false)
}

// admit sends a create review to the webhook's handler.
func admit(t *testing.T, v *admission.Validator, field, value string) result {
	obj, kind := crdObject(field, value)
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	resp := v.Handle(context.Background(), ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "review", Operation: admissionv1.Create, Name: obj.GetName(), Object: runtime.RawExtension{Raw: raw},
		Kind: metav1.GroupVersionKind{Group: v1.GroupVersion.Group, Version: v1.GroupVersion.Version, Kind: kind}}})
	if resp.Allowed {
		return result{verdict: accepted}
	}
	r := result{verdict: refused}
	if st := resp.Result; st != nil {
		r.err = st.Message
		if st.Details != nil && len(st.Details.Causes) > 0 {
			r.field = st.Details.Causes[0].Field
		}
	}
	return r
}

// reconcile runs the reconcile's translation of the object.
func reconcile(field, value string) result {
	obj, _ := crdObject(field, value)
	if e, ok := obj.(*v1.IptablesEIP); ok {
		return verdictOf(reconciler.CheckEIP(e))
	}
	_, err := reconciler.RuleObject(obj, netip.MustParseAddr(eipAddr))
	return verdictOf(err)
}

// compatCLI parses the script call the object's kind corresponds to, and
// validates the objects it would apply as the engine does.
func compatCLI(field, value string) result {
	f := values(field, value)
	var op, rule string
	switch kind, _, _ := strings.Cut(field, "."); kind {
	case "dnat":
		op, rule = compat.OpDNATAdd, strings.Join([]string{eipAddr, f["dnat.externalPort"], f["dnat.protocol"], f["dnat.internalIP"], f["dnat.internalPort"]}, ",")
	case "snat":
		op, rule = compat.OpSNATAdd, eipAddr+","+f["snat.internalCIDR"]
	case "fip":
		op, rule = compat.OpFIPAdd, eipAddr+","+f["fip.internalIP"]
	default:
		op, rule = compat.OpEIPAdd, f["eip.address"]
		if rule != "" && !strings.Contains(rule, "/") {
			rule += "/24"
		}
	}
	p, err := compat.Parse(op, []string{rule})
	if err != nil {
		return verdictOf(err)
	}
	for _, o := range p.Apply {
		if err := o.Validate(); err != nil {
			return verdictOf(err)
		}
	}
	return verdictOf(nil)
}

// agent validates the typed object carrying value, when the wire form can
// carry it.
func agent(field, value string) result {
	f := values(field, value)
	addr := func(s string) (netip.Addr, bool) {
		if s == "" {
			return netip.Addr{}, true
		}
		a, err := netip.ParseAddr(s)
		return a, err == nil
	}
	port := func(s string) (uint16, bool) {
		if s == "" {
			return 0, true
		}
		n, err := strconv.ParseUint(s, 10, 16)
		return uint16(n), err == nil && strconv.FormatUint(n, 10) == s
	}
	eip := netip.MustParseAddr(eipAddr)
	o := nat.Object{UID: "3f2a7c1e-0000-4000-8000-000000000001"}
	ok := true
	switch kind, _, _ := strings.Cut(field, "."); kind {
	case "dnat":
		d := &nat.DNAT{EIP: eip, Protocol: nat.Protocol(f["dnat.protocol"])}
		var ok1, ok2, ok3 bool
		d.ExternalPort, ok1 = port(f["dnat.externalPort"])
		d.InternalIP, ok2 = addr(f["dnat.internalIP"])
		d.InternalPort, ok3 = port(f["dnat.internalPort"])
		ok = ok1 && ok2 && ok3
		o.Kind, o.DNAT = nat.KindDNAT, d
	case "snat":
		p, err := netip.ParsePrefix(f["snat.internalCIDR"])
		ok = err == nil
		o.Kind, o.SNAT = nat.KindSNAT, &nat.SNAT{EIP: eip, InternalCIDR: p}
	case "fip":
		var in netip.Addr
		in, ok = addr(f["fip.internalIP"])
		o.Kind, o.FIP = nat.KindFIP, &nat.FIP{EIP: eip, InternalIP: in}
	default:
		var a netip.Addr
		a, ok = addr(f["eip.address"])
		o.Kind, o.EIP = nat.KindEIP, &nat.EIP{Address: a, PrefixLen: 24}
	}
	if !ok {
		return result{verdict: na}
	}
	return verdictOf(o.Validate())
}
