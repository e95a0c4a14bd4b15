package reconciler

import (
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// TestRuleStatusAddresses: a rule's status.v4ip and status.v6ip follow its
// EIP's addresses at every reconcile, whatever they held before (here the
// addresses of an earlier EIP): a rule whose EIP lost its IPv6 address, or
// changed family, keeps no stale address; a rule refused for its family
// (its EIP no longer has an address of the rule's family) has neither.
// Each row runs for the three rule kinds, through their builders and
// status writers as the reconcile calls them.
func TestRuleStatusAddresses(t *testing.T) {
	const (
		v4, v6       = "192.0.2.10", "2001:db8::10"
		old4, old6   = "192.0.2.99", "2001:db8::99"
		in4, in6     = "10.0.1.5", "fd00::5"
		cidr4, cidr6 = "10.0.1.0/24", "fd00::/64"
	)
	a := netip.MustParseAddr
	v4only := nat.EIP{Address: a(v4)}
	dual := nat.EIP{Address: a(v4), V6Address: a(v6)}
	v6only := nat.EIP{V6Address: a(v6)}
	type row struct {
		name             string
		rule6            bool // the rule's internal address or CIDR is IPv6
		eip              nat.EIP
		ready            bool
		wantV4, wantV6   string
		oldV4ip, oldV6ip string
	}
	rows := []row{
		{"IPv4 rule, the EIP lost its IPv6 address", false, v4only, true, v4, "", old4, old6},
		{"IPv4 rule on a dual-stack EIP", false, dual, true, v4, v6, old4, old6},
		{"IPv6 rule on a dual-stack EIP", true, dual, true, v4, v6, old4, old6},
		{"IPv6 rule, the EIP became IPv6 only", true, v6only, true, "", v6, v4, old6},
		{"IPv6 rule, the EIP lost its IPv6 address", true, v4only, false, "", "", v4, v6},
		{"IPv4 rule, the EIP became IPv6 only", false, v6only, false, "", "", v4, v6},
		{"IPv4 rule, unchanged", false, v4only, true, v4, "", v4, ""},
	}
	pick := func(r row, s4, s6 string) string {
		if r.rule6 {
			return s6
		}
		return s4
	}
	type status struct {
		ready      bool
		v4ip, v6ip string
	}
	kinds := []struct {
		name string
		run  func(r row) status
	}{
		{"fip", func(r row) status {
			o := &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: "f", UID: "u-f"}, Spec: v1.IptablesFIPRuleSpec{InternalIP: pick(r, in4, in6)}}
			o.Status.V4ip, o.Status.V6ip = r.oldV4ip, r.oldV6ip
			reconcileStatus(t, fipKind, o, r.eip)
			return status{o.Status.Ready, o.Status.V4ip, o.Status.V6ip}
		}},
		{"dnat", func(r row) status {
			o := &v1.IptablesDnatRule{ObjectMeta: metav1.ObjectMeta{Name: "d", UID: "u-d"}, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "8080", InternalIP: pick(r, in4, in6), InternalPort: "80"}}
			o.Status.V4ip, o.Status.V6ip = r.oldV4ip, r.oldV6ip
			reconcileStatus(t, dnatKind, o, r.eip)
			return status{o.Status.Ready, o.Status.V4ip, o.Status.V6ip}
		}},
		{"snat", func(r row) status {
			o := &v1.IptablesSnatRule{ObjectMeta: metav1.ObjectMeta{Name: "s", UID: "u-s"}, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: pick(r, cidr4, cidr6)}}
			o.Status.V4ip, o.Status.V6ip = r.oldV4ip, r.oldV6ip
			reconcileStatus(t, snatKind, o, r.eip)
			return status{o.Status.Ready, o.Status.V4ip, o.Status.V6ip}
		}},
	}
	for _, r := range rows {
		for _, k := range kinds {
			t.Run(r.name+"/"+k.name, func(t *testing.T) {
				got := k.run(r)
				if want := (status{r.ready, r.wantV4, r.wantV6}); got != want {
					t.Errorf("status ready=%v v4ip=%q v6ip=%q, want ready=%v v4ip=%q v6ip=%q (before: v4ip=%q v6ip=%q)",
						got.ready, got.v4ip, got.v6ip, want.ready, want.v4ip, want.v6ip, r.oldV4ip, r.oldV6ip)
				}
			})
		}
	}
}

// reconcileStatus writes the status the rule reconcile writes for obj on an
// EIP with the addresses eip: programmed when its builder takes it, else
// refused as Invalid (ruleReconciler.Reconcile, finish).
func reconcileStatus[T client.Object](t *testing.T, k ruleKind[T], obj T, eip nat.EIP) {
	t.Helper()
	if _, err := k.build(obj, eip); err != nil {
		k.setStatus(obj, ruleStatus{cond: fail(v1.ReasonInvalid, "%v", err).condition()})
		return
	}
	k.setStatus(obj, programmedStatus(eip, "gw"))
}

// TestRuleStatusFollowsEIP (root, envtest, the agent in a namespace): an
// IPv6 FIP on a dual-stack EIP is Ready with both of the EIP's addresses
// in its status; moved to an IPv4 address on an IPv4-only EIP, its
// status.v6ip is emptied (before, a rule kept the IPv6 address of its
// IPv6 days) and status.v4ip is the new EIP's; a rule refused for its
// family keeps neither.
func TestRuleStatusFollowsEIP(t *testing.T) {
	e := newEnv(t, envOptions{dataplane: nat.DataplaneNftables})
	g := e.gatewayObj()
	e.create(g)
	e.waitReady(g)
	dual := e.eip("dual", netlab.EIP(0))
	dual.Spec.V6ip = netlab.EIP6(0).String()
	v4 := e.eip("v4", netlab.EIP(1))
	e.create(dual)
	e.create(v4)
	e.waitReady(dual)
	e.waitReady(v4)

	f := e.fip("fip", "dual", netip.MustParseAddr("fd00:10::5"))
	e.create(f)
	e.waitReady(f)
	want := func(what, v4ip, v6ip string) {
		t.Helper()
		if f.Status.V4ip != v4ip || f.Status.V6ip != v6ip {
			t.Errorf("%s: status.v4ip %q, status.v6ip %q; want %q, %q", what, f.Status.V4ip, f.Status.V6ip, v4ip, v6ip)
		}
	}
	want("IPv6 FIP on the dual-stack EIP", netlab.EIP(0).String(), netlab.EIP6(0).String())

	e.update(f, func() { f.Spec.EIP, f.Spec.InternalIP = v4.Name, e.gw.VMs[0].Addr.String() })
	e.waitReady(f)
	want("IPv4 FIP moved to the IPv4-only EIP", netlab.EIP(1).String(), "")

	// Back to an IPv6 address on the IPv4-only EIP: refused naming the
	// field, and the status holds no address.
	e.update(f, func() { f.Spec.InternalIP = "fd00:10::5" })
	e.waitReason(f, v1.ReasonInvalid, 60*time.Second)
	want("IPv6 FIP refused on the IPv4-only EIP", "", "")
}
