// Package kubeovn_test drives natgw's gateway image with Kube-OVN's own,
// unmodified kube-ovn-controller v1.16.2 in a real single-node cluster
// (internal/cluster): the natgw image is Kube-OVN's vpcNatImage, the
// controller creates the gateway's StatefulSet and execs its nat-gateway.sh
// calls into the pod; the test attaches net1 as Multus would (with the
// address Kube-OVN's annotation names) and sends real TCP through the pod.
package kubeovn_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
)

// The managers these tests start each get their own logger (the test's);
// controller-runtime's global one is set once so that it does not print
// "log.SetLogger(...) was never called" with a stack trace in every run.
func init() { ctrl.SetLogger(logr.Discard()) }

// RequireEnv set to 1 turns missing assets into a failure instead of a skip.
const RequireEnv = "NATGW_KUBEOVN_REQUIRED"

const (
	gwName   = "kovn"
	ns       = "kube-system"
	stsName  = "vpc-nat-gw-" + gwName
	podName  = stsName + "-0"
	extPort  = 7001
	vmPort   = 7002
	dnatPort = 7080
)

var (
	eipFIP  = netip.MustParseAddr("192.0.2.10")
	eipNAT  = netip.MustParseAddr("192.0.2.11")
	lanIP   = "10.244.77.253"
	extHost = netlab.ExtAddr // 192.0.2.1: the external subnet's gateway
	// extHost6 is the external host's IPv6 address, the dual-stack
	// external subnet's IPv6 gateway.
	extHost6 = netlab.ExtAddr6
)

type env struct {
	t   *testing.T
	ctx context.Context
	c   *cluster.Cluster
	k   *kubeovn.KubeOVN
	lab *netlab.Lab
	ext string // external namespace (192.0.2.1, net1's peer)
	vms []netlab.Host
	// extNet is the external subnet (netlab.ExtNet unless the scenario
	// needs more addresses); its gateway is extHost.
	extNet netip.Prefix
	// extNet6, when valid, makes the lab dual-stack: the external subnet
	// gets this IPv6 CIDR (gateway extHost6), the external host, net1,
	// the gateway pod's eth0 (netlab.GWVPCAddr6) and the VPC hosts
	// (netlab.VMAddr6) IPv6 addresses, and the servers listen in both
	// families.
	extNet6 netip.Prefix

	// haGateways is startReplace's --ha-gateways.
	haGateways bool
	// haLease is startReplace's --ha-lease (provision.Options.HALease).
	haLease time.Duration

	// What setup learnt and measured.
	repo, image, podCIDR      string
	pod                       gwPod // the gateway pod, net1 attached
	upIn, controllerIn, podIn time.Duration
}

func (e *env) kubectl(stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	var in io.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	return e.c.Kubectl(ctx, in, args...)
}

func (e *env) mustKubectl(stdin string, args ...string) string {
	e.t.Helper()
	out, err := e.kubectl(stdin, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// errStop in an error ends eventually at once.
var errStop = errors.New("giving up")

// eventually polls f every 250 ms until it returns nil or limit passes.
func eventually(ctx context.Context, limit time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var err error
	for {
		if err = f(); err == nil {
			return nil
		}
		if errors.Is(err, errStop) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %v: %w", limit, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

type gwPod struct {
	uid, ip, netns, extIP string
}

// waitPod waits for a Running gateway pod other than old whose container
// runs, with Kube-OVN's external address annotation.
func (e *env) waitPod(oldUID string) (gwPod, error) {
	var p gwPod
	err := eventually(e.ctx, 3*time.Minute, func() error {
		pod, err := e.getPod(podName)
		if err != nil {
			return err
		}
		if string(pod.UID) == oldUID || pod.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s still the old one", podName)
		}
		if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" || len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("pod %s not running: phase %s", podName, pod.Status.Phase)
		}
		ext := pod.Annotations[kubeovn.ExternalIPAnnotation]
		if ext == "" {
			return fmt.Errorf("pod %s has no %s annotation", podName, kubeovn.ExternalIPAnnotation)
		}
		id := pod.Status.ContainerStatuses[0].ContainerID
		tasks, err := e.c.Ctr(e.ctx, "tasks", "ls")
		if err != nil {
			return err
		}
		pid := clusterstack.TaskPID(tasks, id, false)
		if pid == 0 {
			return fmt.Errorf("container %s has no task", strings.TrimPrefix(id, "containerd://"))
		}
		p = gwPod{uid: string(pod.UID), ip: pod.Status.PodIP, netns: fmt.Sprintf("/proc/%d/ns/net", pid), extIP: ext}
		return nil
	})
	return p, err
}

// attach does Multus's part for the pod: a veth whose pod end is net1 with
// the addresses Kube-OVN's annotation names ("v4" or, dual-stack,
// "v4,v6"), its peer the external host; and points the VPC hosts' default
// route at the pod's eth0 (dual-stack: the IPv6 one at the pod's
// netlab.GWVPCAddr6, put on its eth0 here as the VPC subnet's CNI would).
func (e *env) attach(p gwPod) error {
	var podAddrs []netip.Prefix
	for _, s := range strings.Split(p.extIP, ",") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("annotation %s=%q: %w", kubeovn.ExternalIPAnnotation, p.extIP, err)
		}
		bits := e.extNet.Bits()
		if a.Is6() {
			bits = e.extNet6.Bits()
		}
		podAddrs = append(podAddrs, netip.PrefixFrom(a, bits))
	}
	hostAddrs := []netip.Prefix{netip.PrefixFrom(extHost, e.extNet.Bits())}
	if e.extNet6.IsValid() {
		if len(podAddrs) != 2 || !podAddrs[1].Addr().Is6() {
			return fmt.Errorf("annotation %s=%q: want an IPv4 and an IPv6 address on the dual-stack external subnet", kubeovn.ExternalIPAnnotation, p.extIP)
		}
		hostAddrs = append(hostAddrs, netip.PrefixFrom(extHost6, e.extNet6.Bits()))
	}
	if ok, err := netlab.LinkExists(e.ext, "eth0"); err != nil {
		return err
	} else if ok {
		if _, err := netlab.Exec(e.ctx, e.ext, "", "ip", "link", "del", "eth0"); err != nil {
			return err
		}
	}
	if err := netlab.Veth(
		netlab.End{NS: p.netns, Name: "net1", Addrs: podAddrs},
		netlab.End{NS: e.ext, Name: "eth0", Addrs: hostAddrs},
	); err != nil {
		return err
	}
	if e.extNet6.IsValid() {
		if err := netlab.AddAddr(p.netns, "eth0", netip.PrefixFrom(netlab.GWVPCAddr6, netlab.VPCNet6.Bits())); err != nil {
			return err
		}
	}
	for _, vm := range e.vms {
		if _, err := netlab.Exec(e.ctx, vm.NS, "", "ip", "route", "replace", "default", "via", p.ip, "dev", "eth0"); err != nil {
			return err
		}
		if e.extNet6.IsValid() {
			if _, err := netlab.Exec(e.ctx, vm.NS, "", "ip", "-6", "route", "replace", "default", "via", netlab.GWVPCAddr6.String(), "dev", "eth0"); err != nil {
				return err
			}
		}
	}
	return nil
}

// serveTCP starts a TCP probe server on port in namespace ns: on IPv4,
// and on IPv6 too when the lab is dual-stack.
func (e *env) serveTCP(ns string, port int) error {
	hosts := []string{"0.0.0.0"}
	if e.extNet6.IsValid() {
		hosts = append(hosts, "::")
	}
	for _, h := range hosts {
		if _, err := e.lab.ServeTCP(e.ctx, ns, net.JoinHostPort(h, strconv.Itoa(port))); err != nil {
			return err
		}
	}
	return nil
}

// addExtHost creates the external namespace (its addresses come with
// attach) with a TCP server on extPort.
func (e *env) addExtHost() error {
	var err error
	if e.ext, err = e.lab.NS("ext"); err != nil {
		return err
	}
	return e.serveTCP(e.ext, extPort)
}

// addVMs creates n VPC hosts on the pod bridge (it exists once a pod
// runs), namespaces <name>0.. with host-side veths <host>0.., each with a
// TCP server on vmPort (dual-stack: netlab.VMAddr6 too), and appends
// them to e.vms.
func (e *env) addVMs(name, host string, n int) error {
	for i := 0; i < n; i++ {
		addr, err := e.c.HostAddr(cluster.PodRangeEnd + 1 + i)
		if err != nil {
			return err
		}
		vns, err := e.lab.NS(fmt.Sprintf("%s%d", name, i))
		if err != nil {
			return err
		}
		addrs := []netip.Prefix{netip.PrefixFrom(addr, 24)}
		if e.extNet6.IsValid() {
			addrs = append(addrs, netip.PrefixFrom(netlab.VMAddr6(i), netlab.VPCNet6.Bits()))
		}
		h := fmt.Sprintf("%s%d", host, i)
		if err := netlab.Veth(netlab.End{NS: vns, Name: "eth0", Addrs: addrs}, netlab.End{NS: "", Name: h}); err != nil {
			return err
		}
		if err := netlab.Enslave("", h, cluster.BridgeName); err != nil {
			return err
		}
		if err := e.serveTCP(vns, vmPort); err != nil {
			return err
		}
		e.vms = append(e.vms, netlab.Host{NS: vns, Addr: addr})
	}
	return nil
}

// ready waits for status.ready of a Kube-OVN object.
func (e *env) ready(kind, name string) (time.Duration, error) {
	t0 := time.Now()
	err := eventually(e.ctx, 2*time.Minute, func() error {
		out, err := e.kubectl("", "get", kind, name, "-o", "jsonpath={.status.ready}")
		if err != nil {
			return err
		}
		if out != "true" {
			return fmt.Errorf("%s %s: status.ready=%q", kind, name, out)
		}
		return nil
	})
	return time.Since(t0), err
}

// probe is one expected path: from namespace from to addr, answered by a
// server in namespace server, which saw source src.
type probe struct {
	name, from, addr, server string
	src                      netip.Addr
}

func (e *env) check(p probe) error { return e.checkWithin(p, 2*time.Second) }

// fipProbes are the two paths of a FIP from eip to the VPC host vm (named
// vmName), in eip's family: inbound from the external host to eip (the
// host sees the external host's address of that family) and outbound to
// the external host (it sees eip).
func (e *env) fipProbes(vmName string, vm string, eip netip.Addr) []probe {
	ext, family := extHost, ""
	if eip.Is6() {
		ext, family = extHost6, " IPv6"
	}
	return []probe{
		{"ext->FIP" + family, e.ext, net.JoinHostPort(eip.String(), strconv.Itoa(vmPort)), vm, ext},
		{"FIP " + vmName + "->ext" + family, vm, net.JoinHostPort(ext.String(), strconv.Itoa(extPort)), e.ext, eip},
	}
}

// fipManifest is an IptablesFIPRule from eip to internal.
func fipManifest(name, eip string, internal netip.Addr) string {
	return fmt.Sprintf("kind: IptablesFIPRule\napiVersion: kubeovn.io/v1\nmetadata:\n  name: %s\nspec:\n  eip: %s\n  internalIp: %s\n", name, eip, internal)
}

// checkWithin is check with the dial bounded by timeout.
func (e *env) checkWithin(p probe, timeout time.Duration) error {
	r, err := netlab.Dial(e.ctx, p.from, p.addr, timeout)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	if !strings.Contains(r.Server, p.server) {
		return fmt.Errorf("%s: answered by %s, want a server in %s", p.name, r.Server, p.server)
	}
	if r.Client.Addr() != p.src {
		return fmt.Errorf("%s: server saw source %s, want %s", p.name, r.Client.Addr(), p.src)
	}
	return nil
}

func (e *env) blocked(p probe) error {
	if r, err := netlab.Dial(e.ctx, p.from, p.addr, netlab.FailTimeout); err == nil {
		return fmt.Errorf("%s: still answered (by %s, source %s)", p.name, r.Server, r.Client)
	}
	return nil
}

// start brings up the cluster with the natgw image imported, Kube-OVN's
// CRDs and prerequisites (its VPC NAT gateway feature on, the natgw image as
// vpcNatImage, netlab.ExtNet the external subnet) and its unmodified
// controller. Missing assets skip (fail with NATGW_KUBEOVN_REQUIRED=1).
// Everything is torn down when the test ends.
func start(t *testing.T) *env { return startWith(t, netlab.ExtNet, netip.Prefix{}) }

// startWith is start with extNet as the external subnet (it must hold
// extHost, its gateway) and, when extNet6 is valid, extNet6 as its IPv6
// CIDR (a dual-stack external subnet; it must hold extHost6).
func startWith(t *testing.T, extNet, extNet6 netip.Prefix) *env {
	required := os.Getenv(RequireEnv) == "1"
	skip := func(why string) {
		if required {
			t.Fatalf("%s, but %s=1", why, RequireEnv)
		}
		t.Skip(why)
	}
	repo, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(repo, "gwimage/out/natgw-image.tar")
	ccfg := cluster.Defaults(cluster.Config{Images: []string{archive}, Log: os.Stderr}, repo)
	kovn := clusterstack.KubeOVNSetup{Repo: repo, Cluster: ccfg}
	if why := cluster.Missing(ccfg); why != "" {
		skip(why)
	}
	if why := kubeovn.Missing(kovn.KubeOVNConfig(nil)); why != "" {
		skip(why)
	}
	if why := netlab.Unavailable(); why != "" {
		skip(why)
	}
	if _, err := os.Stat(archive); err != nil {
		skip(archive + " missing (run `make image`)")
	}
	image, err := imagebuild.ArchiveName(archive)
	if err != nil {
		t.Fatal(err)
	}
	image = cluster.QualifiedImage(image)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	c, err := cluster.Up(ctx, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer dcancel()
		if err := c.Down(dctx); err != nil {
			t.Error(err)
		}
	})
	upIn := c.Startup() // not the wait for another run's cluster
	lab := netlab.ForTest(t)
	e := &env{t: t, ctx: ctx, c: c, lab: lab, repo: repo, image: image, podCIDR: ccfg.PodCIDR, upIn: upIn, extNet: extNet, extNet6: extNet6}

	// Kube-OVN's CRDs, the NAD CRD, then the objects the controller needs.
	extNetwork := kubeovn.Network{
		ExternalCIDR: extNet.String(), ExternalGateway: extHost.String(),
		ExternalExclude: []string{extHost.String()},
		VPC:             "vpc-" + gwName, VPCSubnet: "subnet-" + gwName,
		VPCCIDR: ccfg.PodCIDR, VPCGateway: "10.244.77.1",
		// Kube-OVN's IPAM hands out only the top of the pod CIDR (the
		// lab's bridge CNI gives the real addresses from the bottom):
		// .252-.254, the lanIp and the two pods of a two-replica gateway
		// (TestHAGatewayPods; with .253-.254 only, its second pod got
		// NoAvailableAddress once the lanIp was reserved in the Vip).
		VPCExclude: []string{"10.244.77.1..10.244.77.251"},
	}
	if extNet6.IsValid() {
		extNetwork.ExternalCIDR6, extNetwork.ExternalGateway6 = extNet6.String(), extHost6.String()
		extNetwork.ExternalExclude = append(extNetwork.ExternalExclude, extHost6.String())
	}
	kovn.Image, kovn.Network = image, extNetwork
	if err := clusterstack.InstallKubeOVN(ctx, c, kovn); err != nil {
		t.Fatal(err)
	}

	// The controller runs (it validates the subnets on its own; the
	// gateway's pod below is the proof that it works).
	t0 := time.Now()
	k, err := clusterstack.RunKubeOVN(ctx, c, kovn)
	if k != nil {
		e.k = k
		t.Cleanup(func() {
			if t.Failed() {
				if b, err := os.ReadFile(k.OutputPath()); err == nil {
					s := string(b)
					if len(s) > 20000 {
						s = s[len(s)-20000:]
					}
					t.Logf("kube-ovn-controller output (tail):\n%s", s)
				}
				out, _ := e.kubectl("", "get", "pods,sts,vpc-nat-gw,iptables-eip,iptables-fip-rule,iptables-dnat-rule,iptables-snat-rule,subnet,vpc", "-A", "-o", "wide")
				t.Logf("objects:\n%s", out)
			}
			sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer scancel()
			if err := k.Stop(sctx); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	e.controllerIn = time.Since(t0)
	return e
}

// setup brings up what every scenario here runs on: start's cluster and
// Kube-OVN, the VpcNatGateway and its pod (net1 attached as Multus would),
// the external host and three VPC hosts with servers.
func setup(t *testing.T) *env { return setupWith(t, netlab.ExtNet) }

// setupWith is setup with extNet as the external subnet.
func setupWith(t *testing.T, extNet netip.Prefix) *env {
	e := startWith(t, extNet, netip.Prefix{})
	image := e.image

	// The VpcNatGateway: Kube-OVN creates the StatefulSet with the natgw image.
	t0 := time.Now()
	e.mustKubectl(fmt.Sprintf(`apiVersion: kubeovn.io/v1
kind: VpcNatGateway
metadata:
  name: %s
spec:
  vpc: vpc-%[1]s
  subnet: subnet-%[1]s
  lanIp: %s
`, gwName, lanIP), "apply", "-f", "-")
	pod, err := e.waitPod("")
	if err != nil {
		t.Fatal(err)
	}
	e.podIn = time.Since(t0)
	img := e.mustKubectl("", "-n", ns, "get", "pod", podName, "-o", "jsonpath={.spec.containers[0].image}")
	if img != image {
		t.Fatalf("gateway pod runs image %q, want natgw's %q", img, image)
	}
	// External host and VPC hosts (the pod bridge exists once a pod
	// runs); vm2: TestCompanion's leaked FIP (vm0 and vm1 have FIPs).
	if err := e.addExtHost(); err != nil {
		t.Fatal(err)
	}
	if err := e.addVMs("vm", "ngwkovm", 3); err != nil {
		t.Fatal(err)
	}

	if err := e.attach(pod); err != nil {
		t.Fatal(err)
	}
	e.pod = pod
	return e
}

// baseObjects creates Kube-OVN's documentation-shaped objects (two EIPs, a
// FIP to vm0, a DNAT to vm1, an SNAT of the VPC), waits until Kube-OVN's
// controller reports them Ready, and returns how long that took and the
// probes that must pass through them.
func (e *env) baseObjects() (time.Duration, []probe) {
	t := e.t
	t.Helper()
	t0 := time.Now()
	vm0, vm1 := e.vms[0], e.vms[1]
	e.mustKubectl(fmt.Sprintf(`apiVersion: kubeovn.io/v1
kind: IptablesEIP
metadata:
  name: eip-fip
spec:
  natGwDp: %[1]s
  v4ip: %[2]s
---
apiVersion: kubeovn.io/v1
kind: IptablesEIP
metadata:
  name: eip-nat
spec:
  natGwDp: %[1]s
  v4ip: %[3]s
---
apiVersion: kubeovn.io/v1
kind: IptablesFIPRule
metadata:
  name: fip0
spec:
  eip: eip-fip
  internalIp: %[4]s
---
apiVersion: kubeovn.io/v1
kind: IptablesDnatRule
metadata:
  name: dnat1
spec:
  eip: eip-nat
  externalPort: "%[6]d"
  internalIp: %[5]s
  internalPort: "%[7]d"
  protocol: tcp
---
apiVersion: kubeovn.io/v1
kind: IptablesSnatRule
metadata:
  name: snat1
spec:
  eip: eip-nat
  internalCIDR: %[8]s
`, gwName, eipFIP, eipNAT, vm0.Addr, vm1.Addr, dnatPort, vmPort, e.podCIDR), "apply", "-f", "-")
	for _, o := range [][2]string{{"iptables-eip", "eip-fip"}, {"iptables-eip", "eip-nat"}, {"iptables-fip-rule", "fip0"}, {"iptables-dnat-rule", "dnat1"}, {"iptables-snat-rule", "snat1"}} {
		if _, err := e.ready(o[0], o[1]); err != nil {
			t.Fatal(err)
		}
	}
	readyIn := time.Since(t0)

	probes := append(e.fipProbes("vm0", vm0.NS, eipFIP), []probe{
		{"ext->DNAT", e.ext, net.JoinHostPort(eipNAT.String(), strconv.Itoa(dnatPort)), vm1.NS, extHost},
		{"SNAT vm1->ext", vm1.NS, net.JoinHostPort(extHost.String(), strconv.Itoa(extPort)), e.ext, eipNAT},
	}...)
	if err := e.checkAll(probes, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return readyIn, probes
}

// checkAll waits up to limit for each probe to pass.
func (e *env) checkAll(probes []probe, limit time.Duration) error {
	for _, p := range probes {
		if err := eventually(e.ctx, limit, func() error { return e.check(p) }); err != nil {
			return err
		}
	}
	return nil
}

func TestKubeOVNDrivesNatgw(t *testing.T) {
	e := setup(t)
	ctx, k, image := e.ctx, e.k, e.image
	pod := e.pod
	vm0, vm1 := e.vms[0], e.vms[1]
	readyIn, probes := e.baseObjects()
	checkAll := func(limit time.Duration) error { return e.checkAll(probes, limit) }

	// Pod deleted: the StatefulSet makes a new one, Kube-OVN replays init
	// and every rule into it.
	t0 := time.Now()
	e.mustKubectl("", "-n", ns, "delete", "pod", podName, "--wait=false")
	pod2, err := e.waitPod(pod.uid)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.attach(pod2); err != nil {
		t.Fatal(err)
	}
	if err := checkAll(2 * time.Minute); err != nil {
		t.Fatalf("after the pod was replaced: %v", err)
	}
	replayIn := time.Since(t0)

	// Delete every rule and EIP: traffic stops, nothing left in the pod.
	t0 = time.Now()
	e.mustKubectl("", "delete", "iptables-fip-rule/fip0", "iptables-dnat-rule/dnat1", "iptables-snat-rule/snat1", "--timeout=2m")
	e.mustKubectl("", "delete", "iptables-eip/eip-fip", "iptables-eip/eip-nat", "--timeout=2m")
	for _, p := range probes {
		if err := eventually(ctx, 30*time.Second, func() error { return e.blocked(p) }); err != nil {
			t.Fatal(err)
		}
	}
	var leftover string
	if err := eventually(ctx, 30*time.Second, func() error {
		list, err := e.kubectl("", "-n", ns, "exec", podName, "--", "/natgw", "list")
		if err != nil {
			return err
		}
		ruleset, err := netlab.NftRuleset(ctx, pod2.netns)
		if err != nil {
			return err
		}
		addrs, err := netlab.Addrs(pod2.netns, "net1")
		if err != nil {
			return err
		}
		leftover = ""
		for _, a := range []netip.Addr{eipFIP, eipNAT, vm0.Addr, vm1.Addr} {
			if strings.Contains(list, a.String()) {
				leftover += fmt.Sprintf("natgw list names %s:\n%s\n", a, list)
			}
			if strings.Contains(ruleset, a.String()) {
				leftover += fmt.Sprintf("nft ruleset names %s\n", a)
			}
		}
		for _, p := range addrs {
			if p.Addr() == eipFIP || p.Addr() == eipNAT {
				leftover += fmt.Sprintf("net1 still has %s\n", p)
			}
		}
		if leftover != "" {
			return fmt.Errorf("gateway not empty:\n%s", leftover)
		}
		return nil
	}); err != nil {
		t.Logf("nft ruleset in the pod:\n%s", func() string { s, _ := netlab.NftRuleset(ctx, pod2.netns); return s }())
		t.Fatal(err)
	}
	deleteIn := time.Since(t0)
	if err := k.Alive(); err != nil {
		t.Fatal(err)
	}
	// The pod Kube-OVN made runs upstream's own command and hook on the
	// natgw image and stayed Running (no container restart) throughout.
	cmd := e.mustKubectl("", "-n", ns, "get", "pod", podName, "-o", "jsonpath={.spec.containers[0].command} {.spec.containers[0].lifecycle.postStart.exec.command}")
	if !strings.Contains(cmd, `"sleep","infinity"`) {
		t.Errorf("gateway container command/hook %s: not upstream's sleep infinity", cmd)
	}
	state := e.mustKubectl("", "-n", ns, "get", "pod", podName, "-o", "jsonpath={.metadata.uid} {.status.phase} {.status.containerStatuses[0].restartCount}")
	if want := pod2.uid + " Running 0"; state != want {
		t.Errorf("gateway pod: uid/phase/restarts %q, want %q", state, want)
	}

	testsummary.Record(t, fmt.Sprintf("CLUSTER-SUMMARY scenario=kube-ovn-drives-natgw kube_ovn=%s image=%s cluster_up=%v controller_ready=%v gw_pod_running=%v objects_ready=%v probes=%d replay_after_pod_delete=%v delete_to_empty=%v gw_cmd=%q result=ok",
		"v1.16.2", image, e.upIn.Round(time.Millisecond), e.controllerIn.Round(time.Millisecond), e.podIn.Round(time.Millisecond), readyIn.Round(time.Millisecond),
		len(probes), replayIn.Round(time.Millisecond), deleteIn.Round(time.Millisecond), cmd))
}
