package main

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// TestCompatExecForms: each Kube-OVN version's exec form and call formats,
// in a gateway of its own: v1.13's `bash -c` with its five-field deletes,
// v1.16's `bash -c` with the identity deletes, master's argv exec (no -c,
// vpc_nat_gateway.go:955) with v1.16's deletes (floating-ip-del EIP at
// vpc_nat_gw_nat.go:2069, dnat-del EIP,PORT,PROTO at :2128) and share DNAT
// (nft-dnat-map-add/-del, nft_dnat.go:99-100,125). Every call exits 0 with
// nothing on stderr (the controller's success test) and leaves the objects
// the row says. Master's row runs on both data planes (share DNAT on
// iptables-legacy as statistic-ranked rules, nat/README.md).
func TestCompatExecForms(t *testing.T) {
	a := netip.MustParseAddr
	eip := func(s string) nat.Object {
		return nat.Object{UID: "compat-eip-" + s, Kind: nat.KindEIP, EIP: &nat.EIP{Address: a(s), PrefixLen: 24}}
	}
	defRoute, err := compat.DefaultRouteObject("192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	base := []nat.Object{eip("192.0.2.10"), eip("192.0.2.11"), defRoute}
	fip := nat.Object{UID: "compat-fip-192.0.2.10", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("198.51.100.10")}}
	dnat := nat.Object{UID: "compat-dnat-192.0.2.11-tcp-8080", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.11"), Protocol: nat.TCP, ExternalPort: 8080, InternalIP: a("198.51.100.11"), InternalPort: 80}}
	id := compat.ShareIdentity{EIP: a("192.0.2.11"), Protocol: nat.TCP, Port: 443}
	share := func(in string) nat.Object {
		return nat.Object{UID: compat.ShareUID(id, a(in), 8443), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: id.EIP, Protocol: nat.TCP, ExternalPort: 443, InternalIP: a(in), InternalPort: 8443, Type: nat.DNATShare}}
	}
	with := func(objs ...nat.Object) []nat.Object { return append(append([]nat.Object(nil), base...), objs...) }
	type call struct {
		op    string
		rules []string
		want  []nat.Object // objects after the call
	}
	setup := []call{
		{"init", []string{""}, nil},
		{"eip-add", []string{"192.0.2.10/24", "192.0.2.11/24"}, base},
		{"floating-ip-add", []string{"192.0.2.10,198.51.100.10"}, with(fip)},
		{"dnat-add", []string{"192.0.2.11,8080,tcp,198.51.100.11,80"}, with(fip, dnat)},
	}
	masterCalls := append(setup[:4:4],
		call{"floating-ip-del", []string{"192.0.2.10"}, with(dnat)},
		call{"dnat-del", []string{"192.0.2.11,8080,tcp"}, base},
		call{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:8443@198.51.100.12:8443"}, with(share("198.51.100.11"), share("198.51.100.12"))},
		// A backend added: the controller sends the whole set.
		call{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:8443@198.51.100.12:8443@198.51.100.13:8443"}, with(share("198.51.100.11"), share("198.51.100.12"), share("198.51.100.13"))},
		// One removed (nft_dnat.go:252: the remaining backends).
		call{"nft-dnat-map-add", []string{"192.0.2.11,443,TCP,198.51.100.11:8443@198.51.100.13:8443"}, with(share("198.51.100.11"), share("198.51.100.13"))},
		call{"nft-dnat-map-del", []string{"192.0.2.11,443,tcp"}, base},
		// Deleting an identity that is not there succeeds, as the script.
		call{"nft-dnat-map-del", []string{"192.0.2.11,443,tcp"}, base},
	)
	rows := []struct {
		version string
		form    execForm
		calls   []call
		dp      string // data plane; "" is nftables
	}{
		{"v1.13", formBashC, append(setup[:4:4],
			call{"floating-ip-del", []string{"192.0.2.10,198.51.100.10"}, with(dnat)},
			call{"dnat-del", []string{"192.0.2.11,8080,tcp,198.51.100.11,80"}, base},
		), ""},
		{"v1.16", formBashC, append(setup[:4:4],
			call{"floating-ip-del", []string{"192.0.2.10"}, with(dnat)},
			call{"dnat-del", []string{"192.0.2.11,8080,tcp"}, base},
		), ""},
		{"master", formArgv, masterCalls, ""},
		{"master-ipt", formArgv, masterCalls, "iptables"},
	}
	lab := netlab.ForTest(t)
	for _, row := range rows {
		t.Run(row.version, func(t *testing.T) {
			gw, err := lab.Gateway(netlab.GatewayOptions{Name: strings.ReplaceAll(row.version, ".", ""), VMs: 1})
			if err != nil {
				t.Fatal(err)
			}
			dp := row.dp
			if dp == "" {
				dp = "nftables"
			}
			for _, c := range row.calls {
				compatExec(t, gw.GW, dp, row.form, c.op, c.rules...)
				if c.want != nil {
					sameObjects(t, c.op+" "+strings.Join(c.rules, " "), listJSON(t, gw.GW, "--dataplane", dp), c.want)
				}
			}
		})
	}
}

// TestCompatShareRefusals: master's share DNAT calls that natgw refuses
// exit non-zero with the reason on stderr and change nothing: a share
// identity held by an exclusive dnat-add (upstream would let its nft table
// shadow the iptables rule), on both data planes.
func TestCompatShareRefusals(t *testing.T) {
	lab := netlab.ForTest(t)
	for _, dp := range dataplanes() {
		gw, err := lab.Gateway(netlab.GatewayOptions{Name: dp, VMs: 1})
		if err != nil {
			t.Fatal(err)
		}
		compatExec(t, gw.GW, dp, formArgv, "eip-add", "192.0.2.11/24")
		compatExec(t, gw.GW, dp, formArgv, "dnat-add", "192.0.2.11,8080,tcp,198.51.100.11,80")
		before := kernelState(t, gw.GW, dp)
		tests := []struct {
			rule, msg string
		}{
			{"192.0.2.11,8080,tcp,198.51.100.12:80", "dnat.type"},
		}
		for _, tc := range tests {
			cmd := exec.Command(filepath.Join(binDir, "bash"), "/kube-ovn/nat-gateway.sh", "nft-dnat-map-add", tc.rule)
			cmd.Env = append(os.Environ(), "NATGW_NETNS="+gw.GW, "NATGW_DATAPLANE="+dp, "NATGW_STATE_DIR_FOR_TEST="+stateDirFor(t, gw.GW))
			_, errb, code := runCmd(t, cmd)
			if code != 1 || !strings.Contains(errb, tc.msg) {
				t.Errorf("%s: nft-dnat-map-add %s: exit %d stderr %q, want exit 1 mentioning %q", dp, tc.rule, code, errb, tc.msg)
			}
		}
		if after := kernelState(t, gw.GW, dp); after != before {
			t.Errorf("%s: refused calls changed the state\nbefore:\n%s\nafter:\n%s", dp, before, after)
		}
	}
}
