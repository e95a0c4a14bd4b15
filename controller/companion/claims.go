package companion

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/nat"
)

// Claims says which compat objects the NAT CRs of the cluster would make:
// the UID Kube-OVN's controller produces for each CR when it calls the
// gateway's nat-gateway.sh, computed by gwimage/compat's own parser from the
// rule string Kube-OVN sends (one source of truth with the gateway). An
// object a CR claims is never removed.
type Claims struct {
	byUID map[string][]claim
	// unresolved lists, per object kind, the CRs whose compat UID cannot
	// be computed (no EIP address yet, a field compat refuses): they
	// might claim any object of that kind, so none is removed.
	unresolved map[nat.Kind][]string
	// snats are the SNAT CRs' objects by internal CIDR (see Keep).
	snats map[netip.Prefix][]snatClaim
	// held names CRs that carry natgw-controller's finalizer, which
	// nothing removes in companion mode (their deletion would hang).
	held []string
}

// Held returns the CRs that carry natgw-controller's replace-mode
// finalizer (reconciler.Finalizer): in companion mode nothing removes it.
func (c *Claims) Held() []string { return c.held }

// snatClaim is one SNAT CR's object identity.
type snatClaim struct {
	uid, owner string
	gateways   []string
}

type claim struct {
	owner string // "Kind/name", for logs
	// gateways the CR may be programmed on; nil: any gateway (unknown).
	gateways []string
	// want is the exact object the CR's add makes, when its content
	// decides (a FIP's internal address, a DNAT's internal address and
	// port: a kernel object with the same UID and another content is not
	// the CR's, and it blocks the CR's own add). nil: any content.
	want *nat.Object
}

// Kinds the companion may remove: those Kube-OVN's NAT CRs make through the
// compat path. Routes (subnet-route-add, the default route) are never
// candidates.
var sweptKinds = []nat.Kind{nat.KindEIP, nat.KindFIP, nat.KindDNAT, nat.KindSNAT}

// uidPrefix is the UID prefix of each swept kind's compat objects.
var uidPrefix = map[nat.Kind]string{
	nat.KindEIP:  "compat-eip-",
	nat.KindFIP:  "compat-fip-",
	nat.KindDNAT: "compat-dnat-",
	nat.KindSNAT: "compat-snat-",
}

// Candidate reports whether o is an object the companion may ever remove:
// a kind Kube-OVN's NAT CRs make through the compat path, with that kind's
// compat UID. Objects natgw-controller programmed (Kubernetes UIDs), routes
// and anything else are never touched.
func Candidate(o nat.Object) bool {
	p, ok := uidPrefix[o.Kind]
	return ok && strings.HasPrefix(o.UID, p)
}

// Protects says why o on gateway gw must stay ("" when nothing claims it
// and it may be removed): a CR claims its UID on that gateway (or on an
// unknown gateway) with the same content or an undecided one, or a CR of
// its kind cannot be resolved.
func (c *Claims) Protects(gw string, o nat.Object) string {
	if !Candidate(o) {
		return "not a compat object of a swept kind"
	}
	if u := c.unresolved[o.Kind]; len(u) > 0 {
		return fmt.Sprintf("%d %s CR(s) cannot be resolved to a compat UID (%s)", len(u), o.Kind, strings.Join(u[:min(len(u), 3)], ", "))
	}
	for _, cl := range c.byUID[o.UID] {
		if cl.gateways != nil && !contains(cl.gateways, gw) {
			continue
		}
		if cl.want != nil && !cl.want.Equal(o) {
			continue
		}
		return "claimed by " + cl.owner
	}
	return ""
}

// Keep says why o must stay on gateway gw, whose objects are on (by UID):
// what Protects says, and for an SNAT also a SNAT CR of the same internal
// CIDR whose own SNAT is not on the gateway. The compat layer programs one
// SNAT per CIDR and queues the others in the container (its SNAT queue);
// only its own snat-del promotes the next, so removing the programmed one
// through the agent would leave a live CR's queued SNAT unprogrammed.
func (c *Claims) Keep(gw string, o nat.Object, on map[string]nat.Object) string {
	if why := c.Protects(gw, o); why != "" {
		return why
	}
	if o.Kind != nat.KindSNAT || o.SNAT == nil {
		return ""
	}
	for _, sc := range c.snats[o.SNAT.InternalCIDR] {
		if sc.uid == o.UID || (sc.gateways != nil && !contains(sc.gateways, gw)) {
			continue
		}
		if _, programmed := on[sc.uid]; !programmed {
			return fmt.Sprintf("%s names the same CIDR and its SNAT is not programmed (it may be queued behind this one)", sc.owner)
		}
	}
	return ""
}

// Unresolved returns the CRs that could not be resolved, per kind.
func (c *Claims) Unresolved() map[nat.Kind][]string { return c.unresolved }

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// ListClaims reads the four NAT CR kinds through r (the informer cache for
// a sweep, the API server itself right before a removal) and returns what
// they claim.
func ListClaims(ctx context.Context, r client.Reader) (*Claims, error) {
	var (
		eips  v1.IptablesEIPList
		fips  v1.IptablesFIPRuleList
		dnats v1.IptablesDnatRuleList
		snats v1.IptablesSnatRuleList
	)
	for _, l := range []client.ObjectList{&eips, &fips, &dnats, &snats} {
		if err := r.List(ctx, l); err != nil {
			return nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	return BuildClaims(eips.Items, fips.Items, dnats.Items, snats.Items), nil
}

// eipRef is what an IptablesEIP tells about an EIP name.
type eipRef struct {
	addrs    []string // every address it may have (spec.v4ip, status.ip)
	gateways []string // spec.natGwDp, its gateway label
}

// BuildClaims computes the claims of these CRs. Terminating CRs still claim:
// Kube-OVN's controller deletes their objects itself, and a CR that is
// still there is not a leak.
func BuildClaims(eips []v1.IptablesEIP, fips []v1.IptablesFIPRule, dnats []v1.IptablesDnatRule, snats []v1.IptablesSnatRule) *Claims {
	c := &Claims{byUID: map[string][]claim{}, unresolved: map[nat.Kind][]string{}, snats: map[netip.Prefix][]snatClaim{}}
	hold := func(kind string, m metav1.ObjectMeta) {
		if slices.Contains(m.Finalizers, reconciler.Finalizer) {
			c.held = append(c.held, kind+"/"+m.Name)
		}
	}
	for i := range eips {
		hold("IptablesEIP", eips[i].ObjectMeta)
	}
	for i := range fips {
		hold("IptablesFIPRule", fips[i].ObjectMeta)
	}
	for i := range dnats {
		hold("IptablesDnatRule", dnats[i].ObjectMeta)
	}
	for i := range snats {
		hold("IptablesSnatRule", snats[i].ObjectMeta)
	}
	refs := make(map[string]eipRef, len(eips))
	for i := range eips {
		e := &eips[i]
		ref := eipRef{
			addrs:    nonEmpty(e.Spec.V4ip, e.Status.IP),
			gateways: nonEmpty(e.Spec.NatGwDp, e.Labels[v1.LabelVpcNatGwName]),
		}
		refs[e.Name] = ref
		owner := "IptablesEIP/" + e.Name
		if len(ref.addrs) == 0 {
			c.unresolve(nat.KindEIP, owner, "no address yet")
			continue
		}
		for _, a := range ref.addrs {
			_, _ = c.claimDel(nat.KindEIP, owner, ref.gateways, compat.OpEIPDel, a)
		}
	}
	// rule resolves a rule's EIP: the addresses and gateways its IptablesEIP
	// names, plus what the rule's own status and labels recorded (an EIP
	// deleted before its rules leaves those).
	rule := func(eipName, statusIP, statusGW string, labels map[string]string) eipRef {
		ref := refs[eipName]
		return eipRef{
			addrs:    nonEmpty(append(append([]string{}, ref.addrs...), statusIP, labels[v1.LabelEIPV4IP])...),
			gateways: nonEmpty(append(append([]string{}, ref.gateways...), statusGW, labels[v1.LabelVpcNatGwName])...),
		}
	}
	// claimRule claims one rule's compat objects on each address of its
	// EIP (ref): the EIP's own and the rule's (delOp with the address and
	// fields); claimed gets each of the rule's UIDs with its address. A rule
	// whose EIP has no address is unresolved.
	claimRule := func(kind nat.Kind, owner string, ref eipRef, delOp string, fields []string, claimed func(uid, a string)) {
		if len(ref.addrs) == 0 {
			c.unresolve(kind, owner, "its EIP has no address")
			return
		}
		for _, a := range ref.addrs {
			c.claimEIPOf(owner, ref.gateways, a)
			if uid, ok := c.claimDel(kind, owner, ref.gateways, delOp, append([]string{a}, fields...)...); ok {
				claimed(uid, a)
			}
		}
	}
	for i := range fips {
		f := &fips[i]
		claimRule(nat.KindFIP, "IptablesFIPRule/"+f.Name, rule(f.Spec.EIP, f.Status.V4ip, f.Status.NatGwDp, f.Labels), compat.OpFIPDel, nil, func(uid, a string) {
			c.setWant(uid, compat.OpFIPAdd, a, f.Spec.InternalIP)
		})
	}
	for i := range dnats {
		d := &dnats[i]
		claimRule(nat.KindDNAT, "IptablesDnatRule/"+d.Name, rule(d.Spec.EIP, d.Status.V4ip, d.Status.NatGwDp, d.Labels), compat.OpDNATDel, []string{d.Spec.ExternalPort, d.Spec.Protocol}, func(uid, a string) {
			c.setWant(uid, compat.OpDNATAdd, a, d.Spec.ExternalPort, d.Spec.Protocol, d.Spec.InternalIP, d.Spec.InternalPort)
		})
	}
	for i := range snats {
		s := &snats[i]
		owner := "IptablesSnatRule/" + s.Name
		ref := rule(s.Spec.EIP, s.Status.V4ip, s.Status.NatGwDp, s.Labels)
		claimRule(nat.KindSNAT, owner, ref, compat.OpSNATDel, []string{s.Spec.InternalCIDR}, func(uid, a string) {
			if p, err := parseRule(compat.OpSNATAdd, a, s.Spec.InternalCIDR); err == nil && len(p.Apply) == 1 && p.Apply[0].SNAT != nil {
				cidr := p.Apply[0].SNAT.InternalCIDR
				c.snats[cidr] = append(c.snats[cidr], snatClaim{uid: uid, owner: owner, gateways: ref.gateways})
			}
		})
	}
	for k := range c.unresolved {
		sort.Strings(c.unresolved[k])
	}
	return c
}

// claimEIPOf makes a rule claim its EIP's object too: an EIP address a live
// rule uses stays, whatever became of its IptablesEIP.
func (c *Claims) claimEIPOf(owner string, gateways []string, addr string) {
	_, _ = c.claimDel(nat.KindEIP, owner, gateways, compat.OpEIPDel, addr)
}

// claimDel records the UID that Kube-OVN's "-del" call for these fields
// deletes: the identity of the CR's object, whatever its content. It
// reports false (and marks the kind unresolved) when compat refuses the
// fields, which then could still name an object in some other spelling.
func (c *Claims) claimDel(kind nat.Kind, owner string, gateways []string, op string, fields ...string) (string, bool) {
	uid, err := compatUID(op, fields...)
	if err != nil {
		c.unresolve(kind, owner, err.Error())
		return "", false
	}
	c.byUID[uid] = append(c.byUID[uid], claim{owner: owner, gateways: gateways})
	return uid, true
}

// setWant narrows the claim on uid that claimDel just recorded to the
// object the CR's add makes. When compat refuses the add (a malformed
// internal address) or makes another UID, the claim stays on the UID
// whatever its content.
func (c *Claims) setWant(uid, op string, fields ...string) {
	p, err := parseRule(op, fields...)
	if err != nil || len(p.Apply) != 1 || p.Apply[0].UID != uid {
		return
	}
	o := p.Apply[0]
	cls := c.byUID[uid]
	cls[len(cls)-1].want = &o
}

func (c *Claims) unresolve(kind nat.Kind, owner, why string) {
	c.unresolved[kind] = append(c.unresolved[kind], owner+": "+why)
}

// compatUID is the UID the compat path deletes for this "-del" rule.
func compatUID(op string, fields ...string) (string, error) {
	p, err := parseRule(op, fields...)
	if err != nil {
		return "", err
	}
	if len(p.Delete) != 1 {
		return "", fmt.Errorf("%s %q: compat deletes %d objects, want 1", op, strings.Join(fields, ","), len(p.Delete))
	}
	return p.Delete[0], nil
}

// parseRule runs compat.Parse on one rule made of fields as Kube-OVN's
// controller joins them. A field holding a comma or a blank would be split
// differently by the script: it is refused rather than guessed at.
func parseRule(op string, fields ...string) (compat.Plan, error) {
	for _, f := range fields {
		if f == "" || strings.ContainsAny(f, ", \t\n") {
			return compat.Plan{}, fmt.Errorf("%s: field %q is empty or holds a separator", op, f)
		}
	}
	return compat.Parse(op, []string{strings.Join(fields, ",")})
}

// nonEmpty returns the distinct non-empty strings of s, in order.
func nonEmpty(s ...string) []string {
	var out []string
	for _, v := range s {
		if v != "" && !contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
