package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// podGateway is one gateway pod of the cluster, wired (fw.PodGateway).
type podGateway = fw.PodGateway

// newStack returns a framework Stack (its helpers only need the test, a
// context and a client) on the cluster's API server as the admin.
func newStack(t *testing.T, dp string) *fw.Stack {
	t.Helper()
	cfg, err := env.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the storm, not client-go's default 5/s, sets the pace
	cl, err := client.New(cfg, client.Options{Scheme: fw.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fw.Stack{T: t, Ctx: ctx, Dataplane: dp, Client: cl}
}

// gatewayImage is the image of data plane dp's gateways as the CRI finds
// it (clusterstack.GatewayImage).
func gatewayImage(t *testing.T, dp string) string {
	t.Helper()
	img, err := clusterstack.GatewayImage(env.repo, dp)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startGateway creates the VpcNatGateway (with the data plane annotation)
// and its StatefulSet, waits for the pod, and wires it: net1 on the
// external network with an external host, VPC hosts on the pod network
// routed through the pod's eth0, probe servers everywhere. Everything is
// removed by t.Cleanup.
func startGateway(t *testing.T, s *fw.Stack, lab *netlab.Lab, name string, vms int) *podGateway {
	t.Helper()
	return startGatewayImage(t, s, lab, name, vms, gatewayImage(t, s.Dataplane))
}

// startGatewayImage is startGateway with the pod's container running
// image (e.g. one without natgw, whose agent cannot start).
func startGatewayImage(t *testing.T, s *fw.Stack, lab *netlab.Lab, name string, vms int, image string) *podGateway {
	t.Helper()
	cs, err := env.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	g := fw.StartPodGateway(t, s, env.c, cs, lab, name, vms, image)
	s.Create(&v1.VpcNatGateway{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{reconciler.DataplaneAnnotation: s.Dataplane}},
		Spec:       v1.VpcNatGatewaySpec{Vpc: "vpc-" + name, Subnet: "subnet-" + name},
	})
	return g
}

// readyGateway starts a stack on dp and gateway name (a pod of the natgw
// image with vms VPC hosts) and waits until the VpcNatGateway is Ready.
func readyGateway(t *testing.T, dp, name string, vms int) (*fw.Stack, *netlab.Lab, *podGateway) {
	t.Helper()
	s := newStack(t, dp)
	lab := netlab.ForTest(t)
	g := startGateway(t, s, lab, name, vms)
	gw := &v1.VpcNatGateway{}
	gw.Name = name
	s.WaitReady(gw)
	return s, lab, g
}

// createEIPs creates n IptablesEIPs <gateway>-e<i> on gateway with the
// addresses netlab.EIP(first+i).
func createEIPs(s *fw.Stack, gateway string, first, n int) []*v1.IptablesEIP {
	eips := make([]*v1.IptablesEIP, n)
	for i := range eips {
		eips[i] = fw.EIP(fmt.Sprintf("%s-e%d", gateway, i), gateway, netlab.EIP(first+i))
		s.Create(eips[i])
	}
	return eips
}

// deleteAll deletes every object and reports what the gateway pod's
// namespace still holds afterwards (kernel entries plus EIP addresses,
// also as a test error), how long the delete took, and how many objects
// are stuck terminating.
func deleteAll(t *testing.T, s *fw.Stack, g *podGateway, timeout time.Duration) (left int, took time.Duration, stuck int) {
	t.Helper()
	took = s.DeleteAll(timeout)
	k, err := fw.ReadKernel(s.Ctx, g.Topology, s.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	left = k.Count() + len(k.EIPAddrs())
	if left > 0 {
		t.Errorf("after deleting everything: %d entries, EIP addresses %v in the pod's namespace:\n%s", k.Count(), k.EIPAddrs(), k.Dump)
	}
	uids, err := s.ObjectUIDs()
	if err != nil {
		t.Fatal(err)
	}
	return left, took, len(uids)
}
