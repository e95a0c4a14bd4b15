package kubeovn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/provision"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/objdiff"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/nat"
)

// shapeManifest is one VpcNatGateway that sets every field the
// StatefulSet is built from: docGateway's (external subnet, node selector,
// lanIp) and tolerations, affinity, routes, user annotations (and a second
// subnet in its VPC is routed too). Its placement fits the single node.
var shapeManifest = docGateway + `  tolerations:
  - {key: natgw.test/dedicated, operator: Exists, effect: NoSchedule}
  affinity:
    nodeAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 1
        preference:
          matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]
  routes:
  - {cidr: 172.31.0.0/16, nextHopIP: 10.244.77.1}
  - {cidr: 172.30.0.0/16, nextHopIP: 10.244.77.1}
  annotations:
    natgw.test/note: shape
`

// secondSubnet is another subnet of the gateway's VPC: both controllers
// route it via eth0 in the pod's annotations.
var secondSubnet = fmt.Sprintf(`apiVersion: kubeovn.io/v1
kind: Subnet
metadata:
  name: subnet-%[1]s-b
spec:
  vpc: vpc-%[1]s
  protocol: IPv4
  cidrBlock: 10.245.0.0/24
  gateway: 10.245.0.1
`, gwName)

// shapeIgnored are the paths of a stored StatefulSet that say which
// object it is, not what was asked for.
var shapeIgnored = []string{"metadata.uid", "metadata.resourceVersion", "metadata.generation",
	"metadata.creationTimestamp", "metadata.managedFields", "status"}

// TestReplaceGatewayShape (replace mode's gateway pod): for one VpcNatGateway
// manifest, the StatefulSet and status Kube-OVN v1.16.2's own controller
// makes (its VPC NAT gateway feature on, the natgw image as vpcNatImage)
// and the ones natgw-controller's provisioner makes after Kube-OVN's
// feature is switched off (Kube-OVN then deletes its StatefulSet itself)
// and the VpcNatGateway is created again from the same manifest. Every
// field of Kube-OVN's StatefulSet must be in natgw's with the same value;
// the one intended difference is natgw's owner reference. Then natgw's
// pod runs natgw's image, natgw-controller reaches it through pod exec
// (one sync), a new pod is one more sync (new boot id), and deleting the
// VpcNatGateway garbage-collects the StatefulSet.
func TestReplaceGatewayShape(t *testing.T) {
	e := start(t)
	ctx := e.ctx
	cs, err := e.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}

	// A second subnet in the VPC, validated by Kube-OVN before either
	// controller builds (both route it only once validated).
	e.mustKubectl(secondSubnet, "apply", "-f", "-")
	if err := eventually(ctx, 2*time.Minute, func() error {
		out, err := e.kubectl("", "get", "subnet", "subnet-"+gwName+"-b", "-o", `jsonpath={.status.conditions[?(@.type=="Validated")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("subnet subnet-%s-b: Validated=%q", gwName, out)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// 1. Kube-OVN's StatefulSet and status.
	t0 := time.Now()
	e.mustKubectl(shapeManifest, "apply", "-f", "-")
	upSts, upStatus, err := e.gatewayShape(func(m map[string]any) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	upstreamIn := time.Since(t0)

	// 2. Kube-OVN's feature off: it deletes its gateway StatefulSets
	// (resyncVpcNatGwConfig → cleanUpVpcNatGw, vpc_nat_gateway.go:59-78).
	t0 = time.Now()
	e.mustKubectl("", "-n", ns, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge", "-p", `{"data":{"enable-vpc-nat-gw":"false"}}`)
	if err := e.waitWorkloadGone(ctx, "Kube-OVN's feature went off"); err != nil {
		t.Fatal(err)
	}
	cleanupIn := time.Since(t0)
	// The same manifest again, as a new object with an empty status, once
	// Kube-OVN has handled the deletion (it deletes the StatefulSet by name,
	// vpc_nat_gateway.go:144-163: it must not hit natgw's).
	deletes := e.kubeOVNLogCount(kubeOVNDeleteLine)
	e.mustKubectl("", "delete", "vpc-nat-gw", gwName, "--timeout=2m")
	if err := eventually(ctx, time.Minute, func() error {
		if n := e.kubeOVNLogCount(kubeOVNDeleteLine); n <= deletes {
			return fmt.Errorf("kube-ovn-controller logged %q %d times, want more than %d", kubeOVNDeleteLine, n, deletes)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.mustKubectl(shapeManifest, "apply", "-f", "-")

	// 3. natgw-controller, replace mode with --provision-gateways, as
	// cmd/natgw-controller wires it, in this process.
	bootSyncs := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid"))
	t0 = time.Now()
	e.startReplace(nil) // --network-source=kube-ovn
	var uid string
	ngSts, ngStatus, err := e.gatewayShape(func(m map[string]any) error {
		refs, _ := m["metadata"].(map[string]any)["ownerReferences"].([]any)
		if len(refs) != 1 {
			return fmt.Errorf("StatefulSet %s: owner references %v, want the VpcNatGateway", stsName, refs)
		}
		ref := refs[0].(map[string]any)
		uid = e.mustKubectl("", "get", "vpc-nat-gw", gwName, "-o", "jsonpath={.metadata.uid}")
		if ref["kind"] != "VpcNatGateway" || ref["name"] != gwName || ref["uid"] != uid || ref["controller"] != true || ref["blockOwnerDeletion"] != true {
			return fmt.Errorf("StatefulSet %s: owner reference %v, want the VpcNatGateway %s (uid %s) as controller", stsName, ref, gwName, uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	natgwIn := time.Since(t0)

	// 4. Field by field.
	compared := len(upSts)
	stsDiffs := objdiff.Diff(upSts, ngSts)
	var intended, unexpected []string
	for _, d := range stsDiffs {
		// natgw's owner reference, and its finalizer (held through
		// Kube-OVN's cleanup: provision.StatefulSetFinalizer).
		if p, _, _ := strings.Cut(d.Path, "["); p == "metadata.ownerReferences" || p == "metadata.finalizers" {
			if !slices.Contains(intended, p) {
				intended = append(intended, p)
			}
			continue
		}
		unexpected = append(unexpected, d.String())
	}
	for _, d := range objdiff.Diff(upStatus, ngStatus) {
		// Upstream's patch repeats status.qosPolicy as read, "" where none.
		if d.Path == "status.qosPolicy" && d.A == `""` && d.B == "" {
			intended = append(intended, d.Path)
			continue
		}
		unexpected = append(unexpected, "VpcNatGateway "+d.String())
	}
	if len(unexpected) > 0 {
		t.Errorf("natgw's gateway differs from Kube-OVN's in %d fields:\n%s", len(unexpected), strings.Join(unexpected, "\n"))
	}
	t.Logf("compared %d StatefulSet fields and %d status fields: %s", compared, len(upStatus), strings.Join(objdiff.Paths(upSts), " "))

	// 5. natgw's pod runs natgw's image; natgw-controller reaches it
	// through pod exec: one sync; a new pod: one more (new boot id).
	pod, err := clusterstack.WaitGatewayPod(ctx, cs, gwName, nil, 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if img := pod.Spec.Containers[0].Image; img != e.image {
		t.Errorf("natgw's gateway pod runs %q, want %q", img, e.image)
	}
	podRunningIn := time.Since(t0)
	// Multus's part: net1 on the external network, the external host at
	// its gateway (natgw's default route goes through it).
	if e.ext, err = e.lab.NS("ext"); err != nil {
		t.Fatal(err)
	}
	gp, err := e.waitPod("")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.attach(gp); err != nil {
		t.Fatal(err)
	}
	if err := waitSyncs(ctx, bootSyncs+1); err != nil {
		t.Fatal(err)
	}
	connectedIn := time.Since(t0)
	t0 = time.Now()
	e.mustKubectl("", "-n", ns, "delete", "pod", podName, "--wait=false")
	if _, err := clusterstack.WaitGatewayPod(ctx, cs, gwName, pod, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if gp, err = e.waitPod(gp.uid); err != nil {
		t.Fatal(err)
	}
	if err := e.attach(gp); err != nil {
		t.Fatal(err)
	}
	if err := waitSyncs(ctx, bootSyncs+2); err != nil {
		t.Fatal(err)
	}
	resyncIn := time.Since(t0)
	time.Sleep(3 * time.Second)
	if n := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid")) - bootSyncs; n != 2 {
		t.Errorf("boot-id syncs: %v, want 2 (first pod, new pod)", n)
	}

	// 5b. The network from Kube-OVN's objects (--network-source=kube-ovn).
	net := e.kubeOVNNetwork(gp)

	// 6. Deleting the VpcNatGateway deletes the StatefulSet (owner reference).
	t0 = time.Now()
	e.mustKubectl("", "delete", "vpc-nat-gw", gwName, "--timeout=2m")
	if err := e.waitWorkloadGone(ctx, "the VpcNatGateway was deleted"); err != nil {
		t.Fatal(err)
	}
	gcIn := time.Since(t0)

	sort.Strings(intended)
	testsummary.Scenario(t, "CLUSTER-SUMMARY", "replace-gateway-shape", "nftables",
		"kube_ovn", "v1.16.2",
		"sts_fields_compared", compared, "status_fields_compared", len(upStatus),
		"unexpected_differences", len(unexpected), "intended_differences", strings.Join(intended, ","),
		"same_image", upSts[`spec.template.spec.containers[0].image`] == ngSts[`spec.template.spec.containers[0].image`],
		"kubeovn_sts", upstreamIn, "kubeovn_feature_off_cleanup", cleanupIn, "natgw_sts", natgwIn,
		"natgw_pod_running", podRunningIn, "natgw_exec_synced", connectedIn, "new_pod_one_sync", resyncIn, "gc_after_delete", gcIn,
		"vpc_routes", net.vpcRoutes, "eip_reserved", net.reservedIn, "ipam_refused_reserved", net.refused,
		"other_vips", net.others, "released", net.releasedIn)
}

// kubeOVNDeleteLine is what kube-ovn-controller logs when it handles a
// VpcNatGateway's deletion (handleDelVpcNatGw).
const kubeOVNDeleteLine = "delete vpc nat gw " + stsName

// kubeOVNLogCount counts the lines of kube-ovn-controller's output that
// contain s.
func (e *env) kubeOVNLogCount(s string) int { return e.kubeOVNLogLines(s) }

// gatewayShape waits for the gateway's StatefulSet (check passes on its
// JSON) and the VpcNatGateway's status (status.externalSubnets set, the
// last field either controller writes), and returns both flattened,
// without shapeIgnored's paths.
func (e *env) gatewayShape(check func(map[string]any) error) (sts, status map[string]string, err error) {
	err = eventually(e.ctx, 3*time.Minute, func() error {
		out, err := e.kubectl("", "-n", ns, "get", "sts", stsName, "-o", "json")
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			return err
		}
		if err := check(m); err != nil {
			return err
		}
		gout, err := e.kubectl("", "get", "vpc-nat-gw", gwName, "-o", "json")
		if err != nil {
			return err
		}
		var g map[string]any
		if err := json.Unmarshal([]byte(gout), &g); err != nil {
			return err
		}
		st, _ := g["status"].(map[string]any)
		if st == nil || st["externalSubnets"] == nil {
			return fmt.Errorf("VpcNatGateway %s: status not written yet: %v", gwName, st)
		}
		if sts, err = objdiff.Flatten(m); err != nil {
			return err
		}
		objdiff.Drop(sts, shapeIgnored...)
		status, err = objdiff.Flatten(map[string]any{"status": st})
		return err
	})
	return sts, status, err
}

// startReplace runs natgw-controller in replace mode with
// --provision-gateways in this process, wired as cmd/natgw-controller
// wires it (the gateway StatefulSet cache, the provisioner, the
// reconcilers with the pod-exec transport, no client-side rate limit),
// against the cluster. configNet nil is --network-source=kube-ovn (the
// default with --provision-gateways); else --network-source=config with
// configNet as the gateway config's defaults. stop stops that controller
// (as a killed natgw-controller: nothing cleaned up) and waits for it; the
// test's cleanup calls it too.
func (e *env) startReplace(configNet *gwconfig.Entry) (stop func()) {
	t := e.t
	t.Helper()
	restCfg, err := e.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	restCfg.QPS = -1 // as cmd/natgw-controller without a QPS in the kubeconfig
	gwCfg := &gwconfig.Config{Unlisted: true}
	if configNet != nil {
		gwCfg.Defaults = *configNet
	}
	mgr, cs, log := newManager(t, restCfg, "natgw", cache.Options{ByObject: provision.CacheByObject(ns, nil, e.haGateways)})
	if _, err := provision.Setup(mgr, provision.Options{
		Namespace: ns, Image: e.image, ServiceClusterIPRange: kubeovn.ServiceClusterIPRange, HA: e.haGateways, HALease: e.haLease,
		Log: log.WithName("provision"), SkipNameValidationForTest: true,
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	if _, err := reconciler.Setup(ctx, mgr, reconciler.Config{
		Workers: 2, RemoveUpstreamFinalizer: true, SkipNameValidationForTest: true,
		KubeOVNNetwork: configNet == nil,
		Gateway: gateway.Options{
			Transport:        &transport.Exec{Config: restCfg, Client: cs, Namespace: ns, Command: "/natgw", Log: log.WithName("agent")},
			Config:           gwCfg,
			DefaultDataplane: nat.DataplaneNftables,
			Log:              log.WithName("gateway"),
		},
	}); err != nil {
		cancel()
		t.Fatal(err)
	}
	return runManager(t, ctx, cancel, mgr, "natgw-controller manager")
}

// waitSyncs waits until the gateway's boot-id syncs reach n and its
// session is open.
func waitSyncs(ctx context.Context, n float64) error {
	return eventually(ctx, 2*time.Minute, func() error {
		got := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid"))
		var g dto.Metric
		if err := metrics.GatewayConnected.WithLabelValues(gwName, string(nat.DataplaneNftables)).Write(&g); err != nil {
			return err
		}
		if got < n || g.GetGauge().GetValue() != 1 {
			return fmt.Errorf("gateway %s: %v boot-id syncs (want %v), connected=%v", gwName, got, n, g.GetGauge().GetValue())
		}
		return nil
	})
}
