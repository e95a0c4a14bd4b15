package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
	"github.com/natgw/natgw/nat/shape"
)

// compatCLI runs one nat-gateway.sh invocation the way the image offers it:
// through the nat-gateway.sh name, or (shim) through the bash name with the
// exact command line Kube-OVN's controller execs. Configuration comes from
// the environment, as in the image. It checks the controller's success
// criteria: exit 0 and nothing on stderr.
func compatCLI(t *testing.T, ns, dp string, shim bool, op string, rules ...string) string {
	t.Helper()
	form := formScript
	if shim {
		form = formBashC
	}
	return compatExec(t, ns, dp, form, op, rules...)
}

// execForm is how a controller runs the script in the gateway container.
type execForm int

const (
	formScript execForm = iota // nat-gateway.sh OP RULE... (the script's own name)
	formBashC                  // bash -c "bash /kube-ovn/nat-gateway.sh OP RULE..." (Kube-OVN v1.13 to v1.16)
	formArgv                   // bash /kube-ovn/nat-gateway.sh OP RULE... as argv, no -c (Kube-OVN master, vpc_nat_gateway.go:955)
)

// compatExec is compatCLI in the given exec form.
func compatExec(t *testing.T, ns, dp string, form execForm, op string, rules ...string) string {
	t.Helper()
	var cmd *exec.Cmd
	switch form {
	case formBashC:
		line := strings.Join(append([]string{"bash", "/kube-ovn/nat-gateway.sh", op}, rules...), " ")
		cmd = exec.Command(filepath.Join(binDir, "bash"), "-c", line)
	case formArgv:
		cmd = exec.Command(filepath.Join(binDir, "bash"), append([]string{"/kube-ovn/nat-gateway.sh", op}, rules...)...)
	default:
		cmd = exec.Command(filepath.Join(binDir, "nat-gateway.sh"), append([]string{op}, rules...)...)
	}
	cmd.Env = append(os.Environ(), "NATGW_NETNS="+ns, "NATGW_DATAPLANE="+dp, "GATEWAY_V4=192.0.2.1", "NATGW_STATE_DIR_FOR_TEST="+stateDirFor(t, ns))
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || errb.Len() > 0 {
		t.Fatalf("nat-gateway.sh %s %q (exec form %d): %v\nstdout: %s\nstderr: %s", op, rules, form, err, out.String(), errb.String())
	}
	return out.String()
}

// stateDirFor returns the directory the compat calls on ns keep init's
// record in (the image's /etc/natgw), one per gateway and test.
func stateDirFor(t *testing.T, ns string) string {
	t.Helper()
	stateDirsMu.Lock()
	defer stateDirsMu.Unlock()
	key := t.Name() + "/" + ns
	if d, ok := stateDirs[key]; ok {
		return d
	}
	d := t.TempDir()
	stateDirs[key] = d
	return d
}

var (
	stateDirsMu sync.Mutex
	stateDirs   = map[string]string{}
)

// kernelState is the data plane's own kernel state in canonical form.
func kernelState(t *testing.T, ns, dp string) string {
	t.Helper()
	if dp == "nftables" {
		return nftState(t, ns)
	}
	out, err := netlab.IptablesSave(context.Background(), ns, true)
	if err != nil {
		t.Fatal(err)
	}
	out = regexp.MustCompile(`@natgw-boot [0-9a-f]+`).ReplaceAllString(out, "@natgw-boot BOOT")
	lines := strings.Split(out, "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// linkState is the gateway's addresses and routes.
func linkState(t *testing.T, ns string) string {
	t.Helper()
	addrs, err := netlab.Addrs(ns, "net1")
	if err != nil {
		t.Fatal(err)
	}
	routes, err := netlab.Routes(ns)
	if err != nil {
		t.Fatal(err)
	}
	rs := make([]string, len(routes))
	for i, r := range routes {
		rs[i] = r.String()
	}
	sort.Strings(rs)
	return fmt.Sprintf("addrs %v\nroutes %s", addrs, strings.Join(rs, "\n"))
}

// compatSteps is a Kube-OVN-shaped session: init, EIPs, every rule kind,
// QoS; then the objects it must leave, with their derived UIDs.
var compatSteps = []struct {
	op    string
	rules []string
	shim  bool
}{
	{"init", []string{""}, true},
	{"eip-add", []string{"192.0.2.10/24", "192.0.2.11/24"}, false},
	{"eip-add", []string{"192.0.2.12/24"}, true},
	{"floating-ip-add", []string{"192.0.2.10,198.51.100.10"}, false},
	{"dnat-add", []string{"192.0.2.11,8080,tcp,198.51.100.11,80", "192.0.2.11,5353,udp,198.51.100.12,53"}, true},
	{"snat-add", []string{"192.0.2.12,198.51.100.0/24,--random-fully"}, false},
	{"subnet-route-add", []string{"10.30.0.0/16,198.51.100.254"}, false},
	{"eip-ingress-qos-add", []string{"192.0.2.10,1,100,10"}, false},
	{"eip-egress-qos-add", []string{"192.0.2.11,1,50,5"}, true},
}

func compatWant() []nat.Object {
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	eip := func(s string, q *nat.QoS) nat.Object {
		return nat.Object{UID: "compat-eip-" + s, Kind: nat.KindEIP, EIP: &nat.EIP{Address: a(s), PrefixLen: 24, QoS: q}}
	}
	return []nat.Object{
		// EIP QoS is in the gateway QoS table (natgw_gwqos), as upstream
		// makes it per EIP on the device: not on the EIP objects.
		eip("192.0.2.10", nil),
		eip("192.0.2.11", nil),
		eip("192.0.2.12", nil),
		{UID: "compat-route-0.0.0.0-0", Kind: nat.KindRoute, Route: &nat.Route{Destination: p("0.0.0.0/0"), NextHop: a("192.0.2.1"), Device: nat.DeviceExternal}},
		{UID: "compat-route-10.30.0.0-16", Kind: nat.KindRoute, Route: &nat.Route{Destination: p("10.30.0.0/16"), NextHop: a("198.51.100.254"), Device: nat.DeviceInternal}},
		{UID: "compat-fip-192.0.2.10", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("198.51.100.10")}},
		{UID: "compat-dnat-192.0.2.11-tcp-8080", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.11"), Protocol: nat.TCP, ExternalPort: 8080, InternalIP: a("198.51.100.11"), InternalPort: 80}},
		{UID: "compat-dnat-192.0.2.11-udp-5353", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.11"), Protocol: nat.UDP, ExternalPort: 5353, InternalIP: a("198.51.100.12"), InternalPort: 53}},
		{UID: "compat-snat-192.0.2.12-198.51.100.0-24", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("192.0.2.12"), InternalCIDR: p("198.51.100.0/24"), RandomFully: true}},
	}
}

// compatWantListed is what `natgw list` shows after compatSteps: on the
// nftables data plane EIP QoS is shaped (nat/shape), and list shows the
// shaping on the EIP objects (nat.QoS: whole Mbit/s, burst in Mbit of
// 125,000 bytes: 10 MB is 84 Mbit, 5 MB 42); policed (iptables) it is
// in natgw_gwqos and not on the objects.
func compatWantListed(dp string) []nat.Object {
	want := compatWant()
	if dp != "nftables" {
		return want
	}
	for i, q := range map[int]*nat.QoS{0: {IngressRateMbps: 100, IngressBurstMbit: 84}, 1: {EgressRateMbps: 50, EgressBurstMbit: 42}} {
		e := *want[i].EIP
		e.QoS = q
		want[i].EIP = &e
	}
	return want
}

// checkCompatEIPQoS checks where compatSteps' EIP QoS is, in upstream's
// units: HTB classes of nat/shape on nftables (rate Mbit/s, burst MB, as
// given), rules of natgw_gwqos on iptables (policed).
func checkCompatEIPQoS(t *testing.T, ns, dp string) {
	t.Helper()
	shaped, err := shape.Get(t.Context(), nat.Config{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	policed, err := gwqos.List(t.Context(), nat.Config{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	var wantShaped []shape.EIP
	var wantPoliced []gwqos.Rule
	if dp == "nftables" {
		wantShaped = []shape.EIP{
			{Address: a("192.0.2.10"), Ingress: shape.Limit{RateMbps: 100, BurstMB: 10}},
			{Address: a("192.0.2.11"), Egress: shape.Limit{RateMbps: 50, BurstMB: 5}},
		}
	} else {
		wantPoliced = []gwqos.Rule{
			{Direction: gwqos.Ingress, Iface: "net1", Priority: 1, Classifier: gwqos.U32, MatchDir: "dst", CIDR: netip.MustParsePrefix("192.0.2.10/32"), RateMbps: 100, BurstMB: 10, Police: true},
			{Direction: gwqos.Egress, Iface: "net1", Priority: 1, Classifier: gwqos.U32, MatchDir: "src", CIDR: netip.MustParsePrefix("192.0.2.11/32"), RateMbps: 50, BurstMB: 5, Police: true},
		}
	}
	if !reflect.DeepEqual(shaped, wantShaped) || !reflect.DeepEqual(policed, wantPoliced) {
		t.Fatalf("%s: EIP QoS shaped %v policed %v, want shaped %v policed %v", dp, shaped, policed, wantShaped, wantPoliced)
	}
}

// TestCompatMatchesKeyed: a Kube-OVN-shaped session of nat-gateway.sh
// subcommands on gateway A leaves the same objects, the same packet-filter
// state and the same addresses/routes as `natgw apply` of those objects on
// gateway B; the -del subcommands then find every rule by its derived UID.
func TestCompatMatchesKeyed(t *testing.T) {
	for _, dp := range dataplanes() {
		t.Run(dp, func(t *testing.T) {
			lab := netlab.ForTest(t)
			ga, err := lab.Gateway(netlab.GatewayOptions{Name: "a", VMs: 1})
			if err != nil {
				t.Fatal(err)
			}
			gb, err := lab.Gateway(netlab.GatewayOptions{Name: "b", VMs: 1})
			if err != nil {
				t.Fatal(err)
			}
			ver := compatCLI(t, ga.GW, dp, true, "get-iptables-version")
			if m := regexp.MustCompile(`v([0-9]+(\.[0-9]+)+)`).FindStringSubmatch(ver); m == nil || !versionAtLeast(m[1], 1, 6, 2) {
				t.Fatalf("get-iptables-version = %q: the controller would not use --random-fully", ver)
			}
			for _, s := range compatSteps {
				compatCLI(t, ga.GW, dp, s.shim, s.op, s.rules...)
			}
			want := compatWant()
			sameObjects(t, "objects made by compat", listJSON(t, ga.GW, "--dataplane", dp), compatWantListed(dp))
			checkCompatEIPQoS(t, ga.GW, dp)

			file := filepath.Join(t.TempDir(), "objects.yaml")
			b, err := yaml.Marshal(map[string]any{"objects": want})
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, b, 0o644); err != nil {
				t.Fatal(err)
			}
			mustCLI(t, "natgw", "--netns", gb.GW, "--dataplane", dp, "apply", "-f", file)
			sameObjects(t, "objects made by apply", listJSON(t, gb.GW, "--dataplane", dp), want)
			if sa, sb := kernelState(t, ga.GW, dp), kernelState(t, gb.GW, dp); sa != sb {
				t.Fatalf("%s state differs\ncompat:\n%s\nkeyed:\n%s", dp, sa, sb)
			}
			if la, lb := linkState(t, ga.GW), linkState(t, gb.GW); la != lb {
				t.Fatalf("addresses/routes differ\ncompat:\n%s\nkeyed:\n%s", la, lb)
			}

			// Repeating an add is a no-op, as with the script.
			compatCLI(t, ga.GW, dp, false, "floating-ip-add", "192.0.2.10,198.51.100.10")
			// Delete the compat way on A, by UID on B.
			for _, d := range []struct {
				op    string
				rules []string
			}{
				{"floating-ip-del", []string{"192.0.2.10"}},
				{"dnat-del", []string{"192.0.2.11,8080,tcp", "192.0.2.11,5353,udp,198.51.100.12,53"}},
				{"snat-del", []string{"192.0.2.12,198.51.100.0/24"}},
				{"subnet-route-del", []string{"10.30.0.0/16"}},
				{"eip-ingress-qos-del", []string{"192.0.2.10"}},
				{"eip-egress-qos-del", []string{"192.0.2.11"}},
				{"eip-del", []string{"192.0.2.10/24", "192.0.2.11/24", "192.0.2.12/24"}},
			} {
				compatCLI(t, ga.GW, dp, false, d.op, d.rules...)
			}
			left := want[3:4] // the default route stays, as upstream
			sameObjects(t, "after compat deletes", listJSON(t, ga.GW, "--dataplane", dp), left)
			if eips, err := shape.Get(t.Context(), nat.Config{NetNS: ga.GW}); err != nil || len(eips) > 0 {
				t.Fatalf("after the QoS deletes the gateway still shapes %v (%v)", eips, err)
			}
			if rules, err := gwqos.List(t.Context(), nat.Config{NetNS: ga.GW}); err != nil || len(rules) > 0 {
				t.Fatalf("after the QoS deletes the gateway still polices %v (%v)", rules, err)
			}
			var uids []string
			for _, o := range want {
				if o.Kind != nat.KindRoute || o.UID == "compat-route-10.30.0.0-16" {
					uids = append(uids, o.UID)
				}
			}
			mustCLI(t, "natgw", append([]string{"--netns", gb.GW, "--dataplane", dp, "delete"}, uids...)...)
			if sa, sb := kernelState(t, ga.GW, dp), kernelState(t, gb.GW, dp); sa != sb {
				t.Fatalf("%s state differs after deletes\ncompat:\n%s\nkeyed:\n%s", dp, sa, sb)
			}
			if la, lb := linkState(t, ga.GW), linkState(t, gb.GW); la != lb {
				t.Fatalf("addresses/routes differ after deletes\ncompat:\n%s\nkeyed:\n%s", la, lb)
			}
		})
	}
}

// TestCompatFailures: a refused subcommand exits non-zero with the reason
// on stderr (which the controller reports) and changes nothing.
func TestCompatFailures(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	compatCLI(t, gw.GW, "nftables", false, "floating-ip-add", "192.0.2.10,198.51.100.10")
	before := nftState(t, gw.GW)
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"floating-ip-add", "192.0.2.10,198.51.100.10"}, 0, ""},                   // a repeated add
		{[]string{"floating-ip-add", "192.0.2.10,198.51.100.11"}, 1, "already programmed"}, // v1.16's script: the EIP is bound elsewhere
		{[]string{"init", "eth0,nosuch0"}, 1, `interface "nosuch0" not found`},
		{[]string{"init", "eth0"}, 2, "two interface names"},
		{[]string{"subnet-route-del", "10.99.0.0/16"}, 1, "not programmed"},
		{[]string{"dnat-add", "192.0.2.10,80,tcp,198.51.100.11,80"}, 1, "EIP is used by a floating IP"},
		{[]string{"floating-ip-add", "192.0.2.20,300.1.1.1"}, 2, "not an IPv4 address"},
		{[]string{"qos-add", "ingress,net1,1,matchall"}, 2, "want 9"},
		{[]string{"ext-subnet-route-add", "192.0.2.0/24,192.0.2.1"}, 2, "unknown subcommand"},
		{[]string{"eip-ingress-qos-add", "192.0.2.99,1,10,1"}, 0, ""}, // as the script: a rule for the address, EIP or not
		{[]string{"eip-ingress-qos-add", "192.0.2.99,1,0,1"}, 2, "above 0"},
	} {
		cmd := exec.Command(filepath.Join(binDir, "nat-gateway.sh"), tc.args...)
		cmd.Env = append(os.Environ(), "NATGW_NETNS="+gw.GW, "NATGW_STATE_DIR_FOR_TEST="+stateDirFor(t, gw.GW))
		_, errb, code := runCmd(t, cmd)
		if code != tc.code || !strings.Contains(errb, tc.msg) || (tc.code != 0) != (errb != "") {
			t.Errorf("%q: exit %d stderr %q, want exit %d mentioning %q", tc.args, code, errb, tc.code, tc.msg)
		}
	}
	if after := nftState(t, gw.GW); after != before {
		t.Fatalf("failed subcommands changed the table\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// The shim is not a shell.
	for _, line := range []string{"nat-gateway.sh eip-del 192.0.2.10; rm -rf /", "ls /", "bash -i"} {
		cmd := exec.Command(filepath.Join(binDir, "bash"), "-c", line)
		cmd.Env = append(os.Environ(), "NATGW_NETNS="+gw.GW)
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "not a shell") {
			t.Errorf("bash shim ran %q: %v %s", line, err, out)
		}
	}
}

// versionAtLeast compares a dotted version with want, numerically.
func versionAtLeast(v string, want ...int) bool {
	parts := strings.Split(v, ".")
	for i, w := range want {
		n := 0
		if i < len(parts) {
			n, _ = strconv.Atoi(parts[i])
		}
		if n != w {
			return n > w
		}
	}
	return true
}

// TestCompatInitInterfaces: init with VPC_IFACE,EXT_IFACE (Kube-OVN v1.16's
// non-primary CNI mode) is honoured by the calls after it: the EIP goes on
// the named external interface; init without rules goes back to net1.
func TestCompatInitInterfaces(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Stub(gw.GW, "ext2"); err != nil {
		t.Fatal(err)
	}
	has := func(dev, addr string) bool {
		t.Helper()
		addrs, err := netlab.Addrs(gw.GW, dev)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if a.Addr().String() == addr {
				return true
			}
		}
		return false
	}
	compatCLI(t, gw.GW, "nftables", true, "init", "eth0,ext2")
	compatCLI(t, gw.GW, "nftables", true, "eip-add", "192.0.2.50/24")
	if !has("ext2", "192.0.2.50") || has("net1", "192.0.2.50") {
		t.Fatal("after init eth0,ext2 the EIP is not on ext2 only")
	}
	compatCLI(t, gw.GW, "nftables", true, "eip-del", "192.0.2.50/24")
	if has("ext2", "192.0.2.50") {
		t.Fatal("eip-del left the EIP on ext2")
	}
	compatCLI(t, gw.GW, "nftables", true, "init", "")
	compatCLI(t, gw.GW, "nftables", true, "eip-add", "192.0.2.51/24")
	if !has("net1", "192.0.2.51") || has("ext2", "192.0.2.51") {
		t.Fatal("after init without rules the EIP is not on net1")
	}
}
