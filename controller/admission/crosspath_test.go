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
	"eip.v6address":     {"spec.v6ip", "eip", "eip.v6Address"},
}

// The values of a valid rule; each row replaces one.
const (
	eipName = "e1"
	eipAddr = "198.51.100.10"
)

// The rules' EIPs by name: e1 IPv4 only (every row of TestCrossPath), e6
// IPv6 only and ed dual stack (TestCrossPathIPv6).
var ruleEIPs = map[string]v1.IptablesEIPSpec{
	eipName: {V4ip: eipAddr, NatGwDp: "gw1"},
	"e6":    {V6ip: "2001:db8:100::10", NatGwDp: "gw1"},
	"ed":    {V4ip: "198.51.100.11", V6ip: "2001:db8:100::11", NatGwDp: "gw1"},
}

var good = map[string]string{
	"dnat.externalPort": "80", "dnat.protocol": "tcp", "dnat.internalIP": "10.0.1.5", "dnat.internalPort": "8080",
	"snat.internalCIDR": "10.0.1.0/24", "fip.internalIP": "10.0.1.5", "eip.address": "198.51.100.20", "eip.v6address": "",
}

// crossRow is one row of a cross-path table: field set to value, the
// paths whose verdict legitimately differs from "refused, naming the
// field" (except) and why.
type crossRow struct {
	field, value string
	except       map[string]string
	why          string
}

// TestCrossPath feeds the same bad value of one field to the four paths
// and requires the same verdict, each path naming the field (by its own
// name for it). Where upstream's own paths differ, the row says which
// path differs and why (except), and the test holds that difference.
func TestCrossPath(t *testing.T) {
	v := validator(t)
	for _, tc := range []crossRow{
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
		t.Run(tc.field+"="+strconv.Quote(tc.value), func(t *testing.T) { checkRow(t, v, eipName, tc) })
	}
}

// noScript: Kube-OVN's nat-gateway.sh has no IPv6 (no ip6tables), and
// upstream's controller calls it with an EIP's IPv4 address only: no
// script call carries an IPv6 EIP, so compat has nothing to compare.
const noScript = "Kube-OVN's script translates no IPv6 and is never called with an IPv6 EIP (compat: n/a)"

// TestCrossPathIPv6: the IPv6 rows, on an IPv6-only EIP (e6) and a dual
// stack one (ed), beside TestCrossPath's IPv4-only EIP (whose table holds
// the IPv6 internal addresses refused there). nat's family rule
// (nat.EIP.AddressFor, nat.CheckSameFamily) gives admission, reconcile and
// the agent the same verdict naming the same field; an IPv6 object the
// nftables data plane takes is refused by the iptables-legacy data plane,
// naming its IPv6 field (nat.Object.IPv6Field, what nat/iptables refuses
// with before it sends anything).
func TestCrossPathIPv6(t *testing.T) {
	v := validator(t)
	naCompat := map[string]string{pathCompat: na}
	ok := map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: na, pathAgent: accepted}
	for _, tc := range []struct {
		eip string
		crossRow
		iptables string // the IPv6 field the iptables data plane refuses an accepted row with
	}{
		{"ed", crossRow{"fip.internalIP", "fd00::5", ok, noScript}, "fip.eip"},
		{"e6", crossRow{"fip.internalIP", "fd00::5", ok, noScript}, "fip.eip"},
		{"ed", crossRow{"dnat.internalIP", "fd00::5", ok, noScript}, "dnat.eip"},
		{"ed", crossRow{"snat.internalCIDR", "fd00:1::/64", ok, noScript}, "snat.eip"},
		{"ed", crossRow{"snat.internalCIDR", "fd00:1::5/64", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: na, pathAgent: refused},
			noScript + "; reconcile masks host bits, the agent's wire form is the masked network"}, ""},
		{"ed", crossRow{"fip.internalIP", "10.0.1.5", map[string]string{pathAdmission: accepted, pathReconcile: accepted, pathCompat: na, pathAgent: accepted},
			noScript + " (an IPv4 rule on a dual-stack EIP uses its IPv4 address)"}, ""},
		// Family mismatch: an IPv4 internal address or CIDR on an
		// IPv6-only EIP.
		{"e6", crossRow{"fip.internalIP", "10.0.1.5", naCompat, noScript}, ""},
		{"e6", crossRow{"dnat.internalIP", "10.0.1.5", naCompat, noScript}, ""},
		{"e6", crossRow{"snat.internalCIDR", "10.0.1.0/24", naCompat, noScript}, ""},
		// IPv6 addresses a gateway does not program.
		{"e6", crossRow{"fip.internalIP", "fe80::1", naCompat, noScript}, ""},
		{"e6", crossRow{"fip.internalIP", "::1", naCompat, noScript}, ""},
		{"e6", crossRow{"dnat.internalIP", "ff02::1", naCompat, noScript}, ""},
		{"e6", crossRow{"fip.internalIP", "::ffff:10.0.1.5", naCompat, noScript}, ""},
		// An EIP's spec.v6ip (with spec.v4ip set).
		{"", crossRow{"eip.v6address", "2001:db8::10", ok, noScript}, "eip.v6Address"},
		{"", crossRow{"eip.v6address", "fe80::10", naCompat, noScript}, ""},
		{"", crossRow{"eip.v6address", "ff02::1", naCompat, noScript}, ""},
		{"", crossRow{"eip.v6address", "198.51.100.12", naCompat, noScript}, ""},
		{"", crossRow{"eip.v6address", "2001:DB8::10", map[string]string{pathCompat: na, pathAgent: na},
			noScript + "; the agent's address is a netip.Addr, which has no case (Kube-OVN refuses upper case in v6ip)"}, ""},
	} {
		t.Run(tc.eip+":"+tc.field+"="+strconv.Quote(tc.value), func(t *testing.T) {
			name := tc.eip
			if name == "" {
				name = eipName
			}
			checkRow(t, v, name, tc.crossRow)
			if tc.except[pathAgent] != accepted {
				return
			}
			o := agentObject(name, tc.field, tc.value)
			f, _, isV6 := o.IPv6Field()
			if tc.iptables == "" {
				if isV6 {
					t.Errorf("an IPv4 object holds IPv6 field %s", f)
				}
				return
			}
			if !isV6 || f != tc.iptables {
				t.Errorf("iptables data plane: IPv6Field() = %q, %v; want it refused naming %s", f, isV6, tc.iptables)
			}
		})
	}
}

// checkRow runs one row on the four paths, the rule on the EIP named eip.
func checkRow(t *testing.T, v *admission.Validator, eip string, tc crossRow) {
	t.Helper()
	if (tc.except == nil) != (tc.why == "") {
		t.Fatal("a row that differs between paths must say why, and only such a row")
	}
	got := map[string]result{
		pathAdmission: admit(t, v, eip, tc.field, tc.value),
		pathReconcile: reconcile(eip, tc.field, tc.value),
		pathCompat:    compatCLI(eip, tc.field, tc.value),
		pathAgent:     agent(eip, tc.field, tc.value),
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
func crdObject(eip, field, value string) (client.Object, string) {
	f := values(field, value)
	om := metav1.ObjectMeta{Name: "r1", UID: types.UID("3f2a7c1e-0000-4000-8000-000000000001")}
	switch kind, _, _ := strings.Cut(field, "."); kind {
	case "dnat":
		return &v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{EIP: eip, ExternalPort: f["dnat.externalPort"],
			Protocol: f["dnat.protocol"], InternalIP: f["dnat.internalIP"], InternalPort: f["dnat.internalPort"]}}, "IptablesDnatRule"
	case "snat":
		return &v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{EIP: eip, InternalCIDR: f["snat.internalCIDR"]}}, "IptablesSnatRule"
	case "fip":
		return &v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{EIP: eip, InternalIP: f["fip.internalIP"]}}, "IptablesFIPRule"
	}
	return &v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: f["eip.address"], V6ip: f["eip.v6address"], NatGwDp: "gw1"}}, "IptablesEIP"
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
	b := fake.NewClientBuilder().WithScheme(scheme)
	for name, spec := range ruleEIPs {
		b.WithObjects(&v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
	}
	if err := reconciler.RegisterIndexes(context.Background(), fieldIndexer{b}); err != nil {
		t.Fatal(err)
	}
	return admission.New(b.Build(), scheme, false)
}

// admit sends a create review of field's kind, field set to value, to the
// webhook's handler.
func admit(t *testing.T, v *admission.Validator, eip, field, value string) result {
	obj, kind := crdObject(eip, field, value)
	return admitObject(t, v, obj, kind)
}

// admitObject sends a create review of obj (of kind) to the webhook's
// handler.
func admitObject(t *testing.T, v *admission.Validator, obj client.Object, kind string) result {
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
func reconcile(eip, field, value string) result {
	obj, _ := crdObject(eip, field, value)
	if e, ok := obj.(*v1.IptablesEIP); ok {
		return verdictOf(reconciler.CheckEIP(e))
	}
	spec := ruleEIPs[eip]
	addrs, err := reconciler.EIPAddrs(&v1.IptablesEIP{Spec: spec})
	if err != nil {
		panic(err) // the table's own EIPs
	}
	_, err = reconciler.RuleObject(obj, addrs)
	return verdictOf(err)
}

// wireEIP is the EIP address the agent receives for a rule on eip with
// internal address or CIDR internal: the one of internal's family, else
// (a family mismatch, which reconcile refuses before sending) the other.
func wireEIP(eip, internal string) netip.Addr {
	spec := ruleEIPs[eip]
	v4, v6 := spec.V4ip, spec.V6ip
	want6 := strings.Contains(internal, ":")
	if (want6 && v6 != "") || v4 == "" {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

// compatCLI parses the script call the object's kind corresponds to, and
// validates the objects it would apply as the engine does.
func compatCLI(eip, field, value string) result {
	if eip != eipName || field == "eip.v6address" {
		return result{verdict: na} // noScript
	}
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
func agent(eip, field, value string) result {
	o, ok := agentObjectOK(eip, field, value)
	if !ok {
		return result{verdict: na}
	}
	return verdictOf(o.Validate())
}

// agentObject is the typed object carrying value (see agent).
func agentObject(eip, field, value string) nat.Object {
	o, _ := agentObjectOK(eip, field, value)
	return o
}

func agentObjectOK(eipName, field, value string) (nat.Object, bool) {
	f := values(field, value)
	addr := func(s string) (netip.Addr, bool) {
		if s == "" {
			return netip.Addr{}, true
		}
		a, err := netip.ParseAddr(s)
		return a, err == nil && (a.Is4() || a.String() == s)
	}
	port := func(s string) (uint16, bool) {
		if s == "" {
			return 0, true
		}
		n, err := strconv.ParseUint(s, 10, 16)
		return uint16(n), err == nil && strconv.FormatUint(n, 10) == s
	}
	o := nat.Object{UID: "3f2a7c1e-0000-4000-8000-000000000001"}
	ok := true
	switch kind, _, _ := strings.Cut(field, "."); kind {
	case "dnat":
		d := &nat.DNAT{EIP: wireEIP(eipName, f["dnat.internalIP"]), Protocol: nat.Protocol(f["dnat.protocol"])}
		var ok1, ok2, ok3 bool
		d.ExternalPort, ok1 = port(f["dnat.externalPort"])
		d.InternalIP, ok2 = addr(f["dnat.internalIP"])
		d.InternalPort, ok3 = port(f["dnat.internalPort"])
		ok = ok1 && ok2 && ok3
		o.Kind, o.DNAT = nat.KindDNAT, d
	case "snat":
		p, err := netip.ParsePrefix(f["snat.internalCIDR"])
		ok = err == nil
		o.Kind, o.SNAT = nat.KindSNAT, &nat.SNAT{EIP: wireEIP(eipName, f["snat.internalCIDR"]), InternalCIDR: p}
	case "fip":
		var in netip.Addr
		in, ok = addr(f["fip.internalIP"])
		o.Kind, o.FIP = nat.KindFIP, &nat.FIP{EIP: wireEIP(eipName, f["fip.internalIP"]), InternalIP: in}
	default:
		e := &nat.EIP{PrefixLen: 24}
		var ok6 bool
		e.Address, ok = addr(f["eip.address"])
		e.V6Address, ok6 = addr(f["eip.v6address"])
		ok = ok && ok6
		if e.V6Address.IsValid() {
			e.V6PrefixLen = 64
		}
		o.Kind, o.EIP = nat.KindEIP, e
	}
	return o, ok
}
