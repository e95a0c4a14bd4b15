// Package provision is natgw-controller's gateway provisioner in replace
// mode (--mode=replace): each VpcNatGateway becomes the gateway
// StatefulSet that Kube-OVN v1.16.2's controller would create for it (its
// name, namespace, labels, selector, pod annotations for the external
// network attachment and the VPC subnet and lanIp, routes, placement,
// privileged container with upstream's command and hook) with natgw's
// image, owned by the VpcNatGateway so that it is garbage-collected with
// it, written by server-side apply; the VpcNatGateway's status is written
// as upstream writes it (status subresource, merge patch).
//
// Build is the pure part (the StatefulSet from a VpcNatGateway and the
// Subnets it names); Setup registers the reconciler. The comments cite
// Kube-OVN v1.16.2's source (module github.com/kubeovn/kube-ovn@v1.16.2)
// by file:line; no upstream code is copied.
package provision

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"

	"github.com/natgw/natgw/agentapi"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// Names and keys of upstream's gateway workload (Kube-OVN v1.16.2).
const (
	// GatewayAnnotation on the pod template names the gateway
	// (pkg/util/const.go:37).
	GatewayAnnotation = "ovn.kubernetes.io/vpc_nat_gw"
	// NetworksAnnotation is Multus's attachment list (nadv1.NetworkAttachmentAnnot).
	NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"
	// DefaultNetworkAnnotation is Multus's default-network override
	// (pkg/util/const.go:211).
	DefaultNetworkAnnotation = "v1.multus-cni.io/default-network"
	// MaxStatefulSetName is the longest gateway StatefulSet name: the
	// StatefulSet controller appends an 11-character hash to the
	// controller-revision-hash label (63 characters at most;
	// pkg/util/vpc_nat_gateway.go:23-28, :61-69).
	MaxStatefulSetName = 63 - 11
	// ipForward is upstream's PostStart hook (vpc_nat_gateway.go:1080-1086).
	ipForward = "sysctl -w net.ipv4.ip_forward=1"
)

// Per-provider pod annotation keys (pkg/util/const.go:71-79).
func logicalSwitchKey(provider string) string { return provider + ".kubernetes.io/logical_switch" }
func ipAddressKey(provider string) string     { return provider + ".kubernetes.io/ip_address" }
func routesKey(provider string) string        { return provider + ".kubernetes.io/routes" }
func allocatedKey(provider string) string     { return provider + ".kubernetes.io/allocated" }

// StatefulSetName is the gateway's StatefulSet (and the pod's app label):
// vpc-nat-gw-<name> (pkg/util/vpc_nat_gateway.go:31-43; upstream's
// configurable prefix, ConfigMap ovn-vpc-nat-config key natGwNamePrefix,
// is not supported: natgw's exec transport finds pods by this name).
func StatefulSetName(gateway string) string { return transport.GatewayAppPrefix + gateway }

// Labels are the StatefulSet's, its selector's and its pods' labels
// (pkg/util/vpc_nat_gateway.go:79-85): what natgw's exec transport and
// upstream's getNatGwPod (vpc_nat_gateway.go:1173-1174) select by.
func Labels(gateway string) map[string]string {
	return map[string]string{"app": StatefulSetName(gateway), transport.GatewayPodLabel: "true"}
}

// Inputs is what Build reads.
type Inputs struct {
	Gateway *v1.VpcNatGateway
	// Subnets are the cluster's Subnets by name (the gateway's, its
	// external one and the other subnets of its VPC are read).
	Subnets map[string]kubeovn.Subnet
	// Namespace is natgw's configured gateway namespace (upstream:
	// kube-ovn-controller's own pod namespace, c.config.PodNamespace,
	// kube-system): the StatefulSet's when the gateway has no
	// spec.namespace (GatewayNamespace decides), and the namespace of the
	// external network's NetworkAttachmentDefinition when its provider
	// names none (master too: getExternalSubnetNad).
	Namespace string
	// Image is natgw's gateway image (upstream: ConfigMap
	// ovn-vpc-nat-config, key image; vpc_nat.go:37-44).
	Image string
	// ServiceClusterIPRange is the cluster's service CIDR(s), as
	// kube-ovn-controller's --service-cluster-ip-range ("" for none).
	ServiceClusterIPRange string
	// Replicas is the number of gateway pods: 1 (0 counts as 1), today's
	// single gateway, or 2, an active/standby pair (see haPod). The
	// caller decides it (Replicas, ReplicasChange).
	Replicas int32
	// HALease, when positive, is a two-replica gateway's fence lease
	// (`natgw ha --lease`); 0 leaves natgw ha's default ((misses+2) ×
	// interval, 250 ms), which is also the failover gap after a kill.
	HALease time.Duration
}

// route is upstream's pod route annotation entry (pkg/request/cniserver.go:17-20).
type route struct {
	Destination string `json:"dst,omitempty"`
	Gateway     string `json:"gw,omitempty"`
}

// externalNAD returns the namespace and name of the external network's
// NetworkAttachmentDefinition: parsed from the external subnet's provider
// (<name>.<namespace>[.ovn]), else the subnet's own name in ns
// (getExternalSubnetNad, vpc_nat_gateway.go:1137-1159;
// util.GetNadBySubnetProvider, pkg/util/subnet.go:15-24).
func externalNAD(ext kubeovn.Subnet, ns string) (string, string) {
	f := strings.Split(ext.Provider, ".")
	switch {
	case len(f) == 3 && f[2] == kubeovn.OvnProvider, len(f) == 2:
		return f[1], f[0]
	}
	return ns, ext.Name
}

// nodeSelector turns spec.selector ("key: value" entries) into a node
// selector; entries without exactly one colon are skipped
// (util.GenNatGwSelectors, pkg/util/vpc_nat_gateway.go:87-101).
func nodeSelector(sel []string) map[string]string {
	out := make(map[string]string, len(sel))
	for _, v := range sel {
		p := strings.Split(strings.TrimSpace(v), ":")
		if len(p) != 2 {
			continue
		}
		out[strings.TrimSpace(p[0])] = strings.TrimSpace(p[1])
	}
	return out
}

// convert copies a typed API value into its apply configuration (the same
// JSON), for the spec fields users write whole (tolerations, affinity).
func convert[T any](in any) (*T, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Build returns the gateway's StatefulSet as Kube-OVN v1.16.2's
// genNatGwStatefulSet (pkg/controller/vpc_nat_gateway.go:913-1134) makes
// it, with in.Image, an owner reference to the VpcNatGateway (upstream sets
// none and deletes the StatefulSet itself, vpc_nat_gateway.go:144-163) and
// the route entries of the VPC's other subnets sorted by subnet name
// (upstream takes the informer's order). Not built (refused with an
// error): a gateway whose StatefulSet name would be too long, whose subnet
// is missing or not an OVN subnet, whose external subnet is missing, or
// whose custom provider is malformed — upstream's refusals too. The BGP
// speaker sidecar (spec.bgpSpeaker.enabled) is not built; the caller
// reports it (BGPUnsupported).
func Build(in Inputs) (*appsv1ac.StatefulSetApplyConfiguration, error) {
	g := in.Gateway
	name := StatefulSetName(g.Name)
	if len(name) > MaxStatefulSetName {
		// util.ValidateNatGwStatefulSetNameLength, pkg/util/vpc_nat_gateway.go:60-69.
		return nil, fmt.Errorf("StatefulSet name %q is %d characters, at most %d: choose a shorter VpcNatGateway name", name, len(name), MaxStatefulSetName)
	}
	// The external network: its NAD, its gateway (vpc_nat_gateway.go:914-918, :1025-1039).
	extName := kubeovn.GatewayExternalSubnet(g)
	ext, ok := in.Subnets[extName]
	if !ok {
		return nil, fmt.Errorf("external subnet %q not found", extName)
	}
	nadNS, nadName := externalNAD(ext, in.Namespace)
	// The VPC subnet must be an OVN subnet; its provider keys the eth0
	// annotations (GetSubnetProvider, vpc_nat_gateway.go:901-911, :920-924).
	sub, ok := in.Subnets[g.Spec.Subnet]
	if !ok {
		return nil, fmt.Errorf("subnet %q not found", g.Spec.Subnet)
	}
	if !kubeovn.IsOvnProvider(sub.Provider) {
		return nil, fmt.Errorf("subnet %q is not an OVN subnet (provider %q)", sub.Name, sub.Provider)
	}
	replicas := in.Replicas
	if replicas == 0 {
		replicas = 1
	}
	if replicas < 1 || replicas > MaxReplicas {
		return nil, fmt.Errorf("replicas %d: %s", replicas, replicasWant)
	}
	ann, err := podAnnotations(g, sub.Provider, nadNS, nadName)
	if err != nil {
		return nil, err
	}
	if replicas == 1 {
		// natgw's own key: only a two-replica template carries it.
		delete(ann, ReplicasAnnotation)
	}

	// eth0's routes (vpc_nat_gateway.go:958-1023): the service CIDR, the
	// VPC's other validated OVN subnets (not VLAN ones unless u2o) and
	// spec.routes ("gateway" as next hop: the subnet's gateway of the
	// route's family), all via the gateway subnet's gateway.
	gw4, gw6 := kubeovn.SplitIP(sub.Gateway)
	var routes []route
	svc4, svc6 := kubeovn.SplitIP(in.ServiceClusterIPRange)
	if gw4 != "" && svc4 != "" {
		routes = append(routes, route{svc4, gw4})
	}
	if gw6 != "" && svc6 != "" {
		routes = append(routes, route{svc6, gw6})
	}
	for _, s := range kubeovn.VPCSubnets(g.Spec.Vpc, in.Subnets) {
		if s.Name == g.Spec.Subnet {
			continue
		}
		c4, c6 := kubeovn.SplitIP(s.CIDRBlock)
		if c4 != "" && gw4 != "" {
			routes = append(routes, route{c4, gw4})
		}
		if c6 != "" && gw6 != "" {
			routes = append(routes, route{c6, gw6})
		}
	}
	for _, r := range g.Spec.Routes {
		hop := r.NextHopIP
		if hop == "gateway" {
			if c4, _ := kubeovn.SplitIP(r.CIDR); c4 != "" {
				hop = gw4
			} else {
				hop = gw6
			}
		}
		routes = append(routes, route{r.CIDR, hop})
	}
	// Upstream keys eth0's routes by the subnet's provider as written
	// (vpc_nat_gateway.go:1020); Kube-OVN defaults an empty provider to
	// "ovn" before any gateway reads it, so the defaulted one is the same.
	if err := setRoutes(ann, providerOrOvn(sub.Provider), routes); err != nil {
		return nil, err
	}

	// net1's default routes, or no IPAM when noDefaultEIP (vpc_nat_gateway.go:1032-1051).
	ext4, ext6 := kubeovn.SplitIP(ext.Gateway)
	var extRoutes []route
	if ext4 != "" {
		extRoutes = append(extRoutes, route{"0.0.0.0/0", ext4})
	}
	if ext6 != "" {
		extRoutes = append(extRoutes, route{"::/0", ext6})
	}
	if !g.Spec.NoDefaultEIP {
		if err := setRoutes(ann, ext.Provider, extRoutes); err != nil {
			return nil, err
		}
	} else {
		ann[allocatedKey(ext.Provider)] = "true"
	}

	labels := Labels(g.Name)
	c := corev1ac.Container().
		WithName(transport.GatewayContainer).
		WithImage(in.Image).
		// Upstream's command and hook; the natgw image serves both
		// (vpc_nat_gateway.go:1076-1101; the pod spec :1073-1107).
		WithCommand("sleep", "infinity").
		WithLifecycle(corev1ac.Lifecycle().WithPostStart(corev1ac.LifecycleHandler().
			WithExec(corev1ac.ExecAction().WithCommand("sh", "-c", ipForward)))).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		// The external gateway, for nat-gateway.sh's default route (both
		// always set, possibly empty).
		WithEnv(envVar("GATEWAY_V4", ext4), envVar("GATEWAY_V6", ext6)).
		WithSecurityContext(corev1ac.SecurityContext().WithPrivileged(true).WithAllowPrivilegeEscalation(true))
	if replicas == 2 {
		c.WithVolumeMounts(syncMarkMount()).WithReadinessProbe(syncedProbe())
	}
	pod := corev1ac.PodSpec().
		WithTerminationGracePeriodSeconds(0).
		WithContainers(c).
		WithNodeSelector(nodeSelector(g.Spec.Selector))
	for i := range g.Spec.Tolerations {
		t, err := convert[corev1ac.TolerationApplyConfiguration](&g.Spec.Tolerations[i])
		if err != nil {
			return nil, fmt.Errorf("spec.tolerations[%d]: %w", i, err)
		}
		pod.WithTolerations(t)
	}
	// Upstream always sets the affinity, empty when the spec has none
	// (Affinity: &gw.Spec.Affinity, a struct there).
	aff := &corev1ac.AffinityApplyConfiguration{}
	if g.Spec.Affinity != nil {
		if aff, err = convert[corev1ac.AffinityApplyConfiguration](g.Spec.Affinity); err != nil {
			return nil, fmt.Errorf("spec.affinity: %w", err)
		}
	}
	pod.WithAffinity(aff)
	if replicas == 2 {
		lan, err := lanPrefix(g.Spec.LanIP, sub)
		if err != nil {
			return nil, err
		}
		haPod(ann, providerOrOvn(sub.Provider), pod, g.Name)
		pod.WithContainers(haContainer(in.Image, GatewayNamespace(g, in.Namespace), g.Name, lan, in.HALease))
		pod.WithVolumes(corev1ac.Volume().WithName(SyncMarkVolume).WithEmptyDir(corev1ac.EmptyDirVolumeSource()))
	}

	sts := appsv1ac.StatefulSet(name, GatewayNamespace(g, in.Namespace)).
		WithLabels(labels).
		WithFinalizers(StatefulSetFinalizer).
		WithOwnerReferences(metav1ac.OwnerReference().
			WithAPIVersion(v1.GroupVersion.String()).WithKind("VpcNatGateway").
			WithName(g.Name).WithUID(g.UID).
			WithController(true).WithBlockOwnerDeletion(true)).
		WithSpec(appsv1ac.StatefulSetSpec().
			WithReplicas(replicas).
			WithSelector(metav1ac.LabelSelector().WithMatchLabels(labels)).
			WithTemplate(corev1ac.PodTemplateSpec().
				WithLabels(labels).
				WithAnnotations(ann).
				WithSpec(pod)).
			WithUpdateStrategy(appsv1ac.StatefulSetUpdateStrategy().WithType("RollingUpdate")))
	return sts, nil
}

// haPod turns a single gateway's pod template into a two-replica one's
// (--ha-gateways; controller/docs/operations.md, "Two-replica gateways"):
//   - no static eth0 address (the provider's ip_address annotation is
//     dropped): both pods get their own from the subnet and the lanIp
//     floats to the active replica, as Kube-OVN master's HA gateway does
//     (GenNatGwPodAnnotations sets no static address in HA mode,
//     pkg/util/vpc_nat_gateway.go:127-130 at commit 1533681d7);
//   - ReplicasAnnotation "2", which tells the provisioner what the
//     template was built for (ProvisionedReplicas);
//   - pod anti-affinity by hostname, preferred (weight 100) so that a
//     one-node cluster still runs both pods: the term of master's
//     genGatewayPodAntiAffinity (pkg/controller/vpc_gateway_common.go:178-194
//     at 1533681d7: the gateway's labels, topology kubernetes.io/hostname);
//     master's NAT gateway asks for it as required
//     (pkg/controller/vpc_nat_gateway.go:1484-1487), its egress gateway
//     lets the user choose. As master's mergeGatewayAffinity
//     (vpc_gateway_common.go:213-234), the user's own
//     spec.affinity.podAntiAffinity, when set, replaces it;
//   - the ServiceAccount GatewayServiceAccount, which may hold the
//     gateway's Lease (LeaseName; controller/config/ha);
//   - AAPsAnnotation naming the lanIp's Vip (LanVipName, made by the
//     provisioner: NewLanVip), so that Kube-OVN lets both pods answer
//     for the lanIp and OVN follows the one that announced it last.
func haPod(ann map[string]string, provider string, pod *corev1ac.PodSpecApplyConfiguration, gateway string) {
	labels := Labels(gateway)
	delete(ann, ipAddressKey(provider))
	ann[AAPsAnnotation] = LanVipName(gateway)
	ann[ReplicasAnnotation] = strconv.Itoa(MaxReplicas)
	if pod.Affinity.PodAntiAffinity == nil {
		pod.Affinity.WithPodAntiAffinity(corev1ac.PodAntiAffinity().WithPreferredDuringSchedulingIgnoredDuringExecution(
			corev1ac.WeightedPodAffinityTerm().WithWeight(100).WithPodAffinityTerm(corev1ac.PodAffinityTerm().
				WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(labels)).
				WithTopologyKey(corev1.LabelHostname))))
	}
	pod.WithServiceAccountName(GatewayServiceAccount)
}

// HAContainer is the container of a two-replica gateway's pod that runs
// `natgw ha` (haContainer); HAPort is its heartbeat (UDP) and conntrack
// replication (TCP) port on the pod's own eth0 address.
const (
	HAContainer = "natgw-ha"
	HAPort      = 7460
)

// lanPrefix is the lanIp with the gateway subnet's IPv4 prefix length, the
// floating address of `natgw ha --lan-ip`.
func lanPrefix(lanIP string, sub kubeovn.Subnet) (netip.Prefix, error) {
	a, err := nat.ParseIPv4("spec.lanIp", lanIP)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("a two-replica gateway needs an IPv4 lanIp: %w", err)
	}
	c, err := sub.V4CIDR()
	if err != nil {
		return netip.Prefix{}, err
	}
	if !c.Contains(a) {
		return netip.Prefix{}, fmt.Errorf("spec.lanIp %q: not in subnet %q (IPv4 CIDR %s)", lanIP, sub.Name, c)
	}
	return netip.PrefixFrom(a, c.Bits()), nil
}

// haContainer is the second container of a two-replica gateway's pod
// (an HA gateway): `natgw ha` in the pod's network namespace, the HA pair's
// replica. The two pods are each other's peer (--peer-sibling: the other
// ordinal's address, read from the API server, as a replica that starts
// first cannot know it); the Lease LeaseName is the fence; the EIPs
// floating to the active on net1 are the EIP objects that the controller
// programs into each pod's agent (`natgw serve --rules-only`), the lanIp
// floats on eth0; each takeover is announced with gratuitous ARP. A
// container of its own, not a process the controller starts: kubelet
// restarts it, `kubectl logs -c natgw-ha` shows its role changes, and a
// controller that is restarted or gone stops neither the heartbeats nor
// the fence. Privileged like the gateway container: it adds and removes
// addresses and writes the namespace's conntrack sysctl.
func haContainer(image, namespace, gateway string, lan netip.Prefix, lease time.Duration) *corev1ac.ContainerApplyConfiguration {
	field := func(name, path string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
			WithFieldRef(corev1ac.ObjectFieldSelector().WithFieldPath(path)))
	}
	cmd := []string{"/natgw", "ha",
		"--id", "$(POD_NAME)",
		"--local", "$(POD_IP):" + strconv.Itoa(HAPort),
		"--peer-sibling", "$(POD_NAMESPACE)",
		"--eips-from-dataplane",
		"--lan-ip", lan.String(),
		"--fence-lease", namespace + "/" + LeaseName(gateway),
		"--rules-synced-file", agentapi.RulesSyncedFile}
	if lease > 0 {
		cmd = append(cmd, "--lease", lease.String())
	}
	return corev1ac.Container().
		WithName(HAContainer).
		WithImage(image).
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand(cmd...).
		WithVolumeMounts(syncMarkMount()).
		WithEnv(field("POD_NAME", "metadata.name"), field("POD_NAMESPACE", "metadata.namespace"), field("POD_IP", "status.podIP")).
		WithSecurityContext(corev1ac.SecurityContext().WithPrivileged(true).WithAllowPrivilegeEscalation(true))
}

// SyncMarkVolume is the emptyDir of a two-replica gateway's pod that both
// containers mount at agentapi.RulesSyncedFile's directory: the agent the
// controller runs in the gateway container (`serve --rules-only
// --synced-file`) leaves its sync mark there, and the natgw-ha container
// does not let its replica lead before the mark is there
// (--rules-synced-file). Gone with the pod, so a new pod's replica waits
// for the controller's first sync.
const SyncMarkVolume = "natgw-run"

func syncMarkMount() *corev1ac.VolumeMountApplyConfiguration {
	return corev1ac.VolumeMount().WithName(SyncMarkVolume).WithMountPath(path.Dir(agentapi.RulesSyncedFile))
}

// SyncedProbePeriod is how often (seconds) the readiness probe of a
// two-replica gateway's gateway container looks for the sync mark.
const SyncedProbePeriod = 2

// syncedProbe is the gateway container's readiness probe of a two-replica
// gateway: `/natgw synced` (the image has no shell), ready once the agent
// left its sync mark, i.e. once the controller synced the pod (the mark
// stays for the pod's life). With the StatefulSet's OrderedReady start,
// pod -1 is created once pod -0 was synced, and a rolling update deletes
// the next pod only once the new one was synced, so the active is not
// taken down while its peer could not lead. No deadlock: the exec
// transport reaches a gateway container that runs without being Ready
// (transport.Exec), so the controller syncs a pod before it is Ready. All
// fields are set (the API server's defaults would otherwise differ from
// what is applied).
func syncedProbe() *corev1ac.ProbeApplyConfiguration {
	return corev1ac.Probe().
		WithExec(corev1ac.ExecAction().WithCommand("/natgw", "synced", "--file", agentapi.RulesSyncedFile)).
		WithPeriodSeconds(SyncedProbePeriod).WithTimeoutSeconds(1).WithSuccessThreshold(1).WithFailureThreshold(3)
}

// envVar is name=value; an empty value is left out, as the typed
// EnvVar upstream sends encodes it (omitempty).
func envVar(name, value string) *corev1ac.EnvVarApplyConfiguration {
	e := corev1ac.EnvVar().WithName(name)
	if value != "" {
		e.WithValue(value)
	}
	return e
}

func providerOrOvn(p string) string {
	if p == "" {
		return kubeovn.OvnProvider
	}
	return p
}

// podAnnotations are the pod template's annotations: spec.annotations,
// then upstream's own on top (util.GenNatGwPodAnnotations,
// pkg/util/vpc_nat_gateway.go:107-148, Kube-OVN as the primary CNI): the
// external network attachment for Multus, the gateway's name, the VPC
// subnet and lanIp (the pod's eth0 address) under the subnet's provider,
// and for a custom provider <name>.<namespace>.ovn the default network
// override <namespace>/<name>.
func podAnnotations(g *v1.VpcNatGateway, provider, nadNS, nadName string) (map[string]string, error) {
	p := providerOrOvn(provider)
	out := make(map[string]string, len(g.Spec.Annotations)+6)
	for k, v := range g.Spec.Annotations {
		out[k] = v
	}
	out[NetworksAnnotation] = nadNS + "/" + nadName
	out[GatewayAnnotation] = g.Name
	out[logicalSwitchKey(p)] = g.Spec.Subnet
	out[ipAddressKey(p)] = g.Spec.LanIP
	if p != kubeovn.OvnProvider {
		f := strings.Split(provider, ".")
		if len(f) != 3 || f[2] != kubeovn.OvnProvider {
			return nil, fmt.Errorf("subnet %q: provider must be <name>.<namespace>.ovn, got %q", g.Spec.Subnet, provider)
		}
		out[DefaultNetworkAnnotation] = f[1] + "/" + f[0]
	}
	return out, nil
}

// setRoutes sets (or, with no routes, removes) provider's routes
// annotation (setPodRoutesAnnotation, pkg/controller/pod.go:2935-2951).
func setRoutes(ann map[string]string, provider string, routes []route) error {
	key := routesKey(provider)
	if len(routes) == 0 {
		delete(ann, key)
		return nil
	}
	b, err := json.Marshal(routes)
	if err != nil {
		return fmt.Errorf("encode routes: %w", err)
	}
	ann[key] = string(b)
	return nil
}

// BGPUnsupported says whether the gateway asks for upstream's BGP speaker
// sidecar, which natgw does not build (vpc_nat_gateway.go:1115-1131).
func BGPUnsupported(g *v1.VpcNatGateway) bool {
	return g.Spec.BgpSpeaker != nil && g.Spec.BgpSpeaker.Enabled
}
