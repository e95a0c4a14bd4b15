package kubeovn

import (
	"context"
	"fmt"
	"strings"

	"github.com/natgw/natgw/internal/upstream"
)

// Names of the objects Objects creates.
const (
	// ExternalNetwork is the external subnet and its NetworkAttachmentDefinition
	// (kube-system), the name kube-ovn-controller uses when a VpcNatGateway
	// names no external subnet.
	ExternalNetwork = "ovn-vpc-external-network"
	// ExternalProvider is the external subnet's provider (NAD name.namespace).
	ExternalProvider = ExternalNetwork + ".kube-system"
	// ExternalIPAnnotation is the pod annotation kube-ovn-controller writes
	// with the gateway's address on the external network (what Multus would
	// hand the pod's net1).
	ExternalIPAnnotation = ExternalProvider + ".kubernetes.io/ip_address"
)

// Network is the addressing of the objects: the external subnet (net1's)
// and the VPC subnet behind the gateway (eth0's).
type Network struct {
	ExternalCIDR, ExternalGateway string
	// ExternalCIDR6 and ExternalGateway6, when set, make the external
	// subnet dual-stack (protocol Dual, cidrBlock "v4cidr,v6cidr",
	// gateway "v4gw,v6gw", as Kube-OVN writes a dual-stack subnet).
	ExternalCIDR6, ExternalGateway6 string
	// ExternalExclude are external addresses kube-ovn must not hand out.
	ExternalExclude                     []string
	VPC, VPCSubnet, VPCCIDR, VPCGateway string
	// VPCExclude are VPC addresses kube-ovn must not hand out (e.g. the pod
	// range of the cluster's bridge CNI, which shares the CIDR).
	VPCExclude []string
}

// CRDs returns Kube-OVN v1.16.2's CRDs (from its module tree) as YAML.
func CRDs(ctx context.Context) (string, error) {
	b, err := upstream.ReadFile(ctx, upstream.CRDs)
	if err != nil {
		return "", fmt.Errorf("kubeovn: %w", err)
	}
	return string(b), nil
}

// nadCRD is a bare NetworkAttachmentDefinition CRD: kube-ovn-controller
// watches NADs; without Multus nothing else reads them.
const nadCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: network-attachment-definitions.k8s.cni.cncf.io
spec:
  group: k8s.cni.cncf.io
  scope: Namespaced
  names:
    plural: network-attachment-definitions
    singular: network-attachment-definition
    kind: NetworkAttachmentDefinition
    shortNames: [net-attach-def]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

// Prerequisites returns what must exist before the controller starts: the
// NAD CRD (Kube-OVN's CRDs come from CRDs).
func Prerequisites() string { return nadCRD }

func list(ips []string) string {
	if len(ips) == 0 {
		return "[]"
	}
	return `["` + strings.Join(ips, `", "`) + `"]`
}

// Objects returns the objects kube-ovn-controller needs to run a VPC NAT
// gateway with image: its two ConfigMaps, the external NAD and subnet, the
// VPC and its subnet.
func Objects(image string, n Network) string {
	protocol, cidr, gw := "IPv4", n.ExternalCIDR, n.ExternalGateway
	if n.ExternalCIDR6 != "" {
		protocol, cidr, gw = "Dual", cidr+","+n.ExternalCIDR6, gw+","+n.ExternalGateway6
	}
	return fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: ovn-vpc-nat-config
  namespace: kube-system
data:
  image: %[1]s
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: ovn-vpc-nat-gw-config
  namespace: kube-system
data:
  enable-vpc-nat-gw: "true"
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: %[2]s
  namespace: kube-system
spec:
  config: '{"cniVersion":"0.3.0","type":"macvlan","master":"eth1","mode":"bridge","ipam":{"type":"kube-ovn","provider":"%[3]s"}}'
---
apiVersion: kubeovn.io/v1
kind: Subnet
metadata:
  name: %[2]s
spec:
  protocol: %[12]s
  provider: %[3]s
  cidrBlock: %[4]s
  gateway: %[5]s
  excludeIps: %[6]s
---
apiVersion: kubeovn.io/v1
kind: Vpc
metadata:
  name: %[7]s
spec: {}
---
apiVersion: kubeovn.io/v1
kind: Subnet
metadata:
  name: %[8]s
spec:
  vpc: %[7]s
  protocol: IPv4
  cidrBlock: %[9]s
  gateway: %[10]s
  excludeIps: %[11]s
`, image, ExternalNetwork, ExternalProvider, cidr, gw, list(n.ExternalExclude),
		n.VPC, n.VPCSubnet, n.VPCCIDR, n.VPCGateway, list(n.VPCExclude), protocol)
}
