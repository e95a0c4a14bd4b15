package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
)

// admissionCases are objects the API server must refuse, with the field
// the refusal must name.
func admissionCases(gw string) []struct {
	obj   client.Object
	field string
} {
	vm := netlab.VMAddr(0)
	eip := func(v4 string) client.Object {
		e := fw.EIP("bad-eip", gw, netlab.EIP(0))
		e.Spec.V4ip = v4
		return e
	}
	fip := func(in string) client.Object {
		f := fw.FIP("bad-fip", "e1", vm)
		f.Spec.InternalIP = in
		return f
	}
	dnat := func(mod func(*v1.IptablesDnatRuleSpec)) client.Object {
		d := fw.DNAT("bad-dnat", "e1", "tcp", 80, vm, 8080)
		mod(&d.Spec)
		return d
	}
	return []struct {
		obj   client.Object
		field string
	}{
		{eip("192.0.2.300"), "spec.v4ip"},
		{eip("2001:db8::1"), "spec.v4ip"},
		{fip("300.1.1.1"), "spec.internalIp"},
		{fip("198.51.100.0/24"), "spec.internalIp"},
		{fip("vm1"), "spec.internalIp"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "0" }), "spec.externalPort"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "65536" }), "spec.externalPort"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.ExternalPort = "http" }), "spec.externalPort"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.InternalPort = "-1" }), "spec.internalPort"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.Protocol = "icmp" }), "spec.protocol"},
		{dnat(func(s *v1.IptablesDnatRuleSpec) { s.InternalIP = "198.51.100.256" }), "spec.internalIp"},
		{fw.SNAT("bad-snat", "e1", "198.51.100.0/33"), "spec.internalCIDR"},
		// An IPv6 CIDR is valid since dual stack: on e1 (IPv4 only) the
		// family rule refuses it in the reconcile and the webhook
		// (TestCrossPathIPv6), not the CRD. An invalid IPv6 prefix is the
		// CRD's to refuse.
		{fw.SNAT("bad-snat", "e1", "2001:db8::/129"), "spec.internalCIDR"},
		{fw.SNAT("bad-snat", "e1", "the-vpc"), "spec.internalCIDR"},
	}
}

// TestBadInput is scenario 5: invalid specs are refused at admission
// naming the field; a second FIP on a used EIP gets EIPInUse while the
// first keeps passing traffic; a rule on a missing EIP waits with a clear
// condition and becomes Ready when the EIP appears.
func TestBadInput(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := fw.New(t, fw.Options{Dataplane: dp})
		g := s.Order[0]

		// Admission.
		cases := admissionCases(g.Name)
		rejected := 0
		for _, tc := range cases {
			err := s.Client.Create(s.Ctx, tc.obj)
			switch {
			case err == nil:
				t.Errorf("%T with invalid %s accepted", tc.obj, tc.field)
				s.Delete(tc.obj)
			case !apierrors.IsInvalid(err):
				t.Errorf("%T with invalid %s: %v, want an Invalid error", tc.obj, tc.field, err)
			case !strings.Contains(err.Error(), tc.field+": "):
				t.Errorf("%T: error %q does not name the field %s", tc.obj, err, tc.field)
			default:
				rejected++
			}
		}
		if uids, err := s.ObjectUIDs(); err != nil || len(uids) > 1 { // the VpcNatGateway
			t.Errorf("objects after refused creates: %v %v", uids, err)
		}

		// A second FIP on a used EIP.
		e1 := fw.EIP("e1", g.Name, netlab.EIP(0))
		fipA := fw.FIP("fip-a", "e1", netlab.VMAddr(0))
		s.Create(e1)
		s.Create(fipA)
		s.WaitReady(e1, fipA)
		s.CheckPaths(20*time.Second, g.ExtTo(fw.TCP, netlab.EIP(0), fw.VMPort, 0))
		st := fw.StartStream(s.Ctx, g.ExtTo(fw.TCP, netlab.EIP(0), fw.VMPort, 0), 2*time.Second)
		fw.Eventually(t, s.Ctx, 20*time.Second, "probes before the second FIP", func() error {
			if n := len(st.Results()); n < 10 {
				return fmt.Errorf("%d probes", n)
			}
			return nil
		})
		fipB := fw.FIP("fip-b", "e1", netlab.VMAddr(1))
		created := time.Now()
		s.Create(fipB)
		inUseIn := s.WaitReason(fipB, v1.ReasonEIPInUse, 30*time.Second)
		inUseMsg := fw.ReadyOf(fipB).Message
		// Keep probing through a few of the controller's retries.
		fw.Eventually(t, s.Ctx, 30*time.Second, "probes after EIPInUse", func() error {
			if n := st.CountSince(created); n < 30 {
				return fmt.Errorf("%d probes", n)
			}
			return nil
		})
		sw := fw.AnalyzeSwitch(st.Stop(), g.VMs[0].NS, g.VMs[1].NS, time.Time{})
		if sw.Failed > 0 || sw.After > 0 || sw.Other > 0 {
			t.Errorf("the first FIP's traffic was disturbed by the second: %+v", sw)
		}
		if err := s.Get(fipA); err != nil || fw.ReadyOf(fipA).Reason != v1.ReasonProgrammed {
			t.Errorf("first FIP no longer Ready: %v %v", fw.ReadyOf(fipA), err)
		}
		k, err := fw.ReadKernel(s.Ctx, g, dp)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(k.Entries[string(fipB.UID)]); n > 0 {
			t.Errorf("refused FIP has %d kernel entries: %v", n, k.Entries[string(fipB.UID)])
		}

		// A rule on a missing EIP.
		dn := fw.DNAT("dnat-later", "e-later", "tcp", 80, netlab.VMAddr(2), fw.VMPort)
		s.Create(dn)
		s.WaitReason(dn, v1.ReasonEIPNotFound, 30*time.Second)
		waitMsg := fw.ReadyOf(dn).Message
		if !strings.Contains(waitMsg, "e-later") {
			t.Errorf("condition of the waiting DNAT does not name the missing EIP: %q", waitMsg)
		}
		eLater := fw.EIP("e-later", g.Name, netlab.EIP(1))
		eipAt := time.Now()
		s.Create(eLater)
		s.WaitReady(dn)
		readyAfterEIP := time.Since(eipAt)
		s.CheckPaths(20*time.Second, g.ExtTo(fw.TCP, netlab.EIP(1), 80, 2))

		fw.Summary(t, "5-bad-input", dp,
			"admission_rejected", fmt.Sprintf("%d/%d", rejected, len(cases)),
			"second_fip_reason", fw.ReadyOf(fipB).Reason, "second_fip_reason_in", inUseIn,
			"first_fip_probes", sw.Probes, "first_fip_failed", sw.Failed, "first_fip_answered_by_second_host", sw.After,
			"missing_eip_reason", v1.ReasonEIPNotFound, "ready_after_eip_created", readyAfterEIP)
		t.Logf("EIPInUse message: %q; waiting DNAT message: %q", inUseMsg, waitMsg)
	})
}
