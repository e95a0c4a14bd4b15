package framework

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
)

// Ports of the probe servers every topology runs.
const (
	// VMPort is the TCP and UDP port of the probe servers on every VPC host.
	VMPort = 8080
	// ExtPort is the TCP and UDP port of the probe servers on the external host.
	ExtPort = 9090
)

// Scheme knows the core and natgw kinds.
var Scheme = mustScheme()

func mustScheme() *runtime.Scheme {
	s, err := v1.NewScheme()
	if err != nil {
		panic(err)
	}
	return s
}

func init() {
	// envtest logs through controller-runtime's logger; the controller's
	// own logs are in its log file.
	ctrllog.SetLogger(logr.Discard())
}

// GatewaySpec asks for one gateway topology.
type GatewaySpec struct {
	// Name is the gateway's name (VpcNatGateway and gateway config).
	Name string
	// VMs is the number of VPC hosts (default 3).
	VMs int
}

// Options shape a Stack.
type Options struct {
	// Dataplane is the controller's --dataplane.
	Dataplane string
	// Gateways to build (default: one named "gw1").
	Gateways []GatewaySpec
	// NoController leaves the controller to StartController.
	NoController bool
	// NoGatewayObjects creates no VpcNatGateway objects.
	NoGatewayObjects bool
	// Controller options (Dataplane is filled in).
	Controller ControllerOptions
	// CRDs is the CRD set of the API server (default natgw's).
	CRDs crdtest.Set
	// IPv6 makes every topology dual-stack (netlab.GatewayOptions.IPv6):
	// probe servers on IPv6 too, the controller's gateway config with the
	// IPv6 prefix length and default route.
	IPv6 bool
	// NoAdmission leaves out controller/config/admission (the policy that
	// puts natgw's finalizer on NAT objects at creation), which the Stack
	// otherwise installs as a user would, next to the CRDs.
	NoAdmission bool
}

// Stack is one test's whole world: an API server, the gateway topologies
// with their probe servers, and the controller.
type Stack struct {
	T         *testing.T
	Ctx       context.Context
	Dataplane string
	// CRDs is the API server's CRD set.
	CRDs crdtest.Set
	Bin  Binaries
	API  *APIServer
	// Client talks to the API server directly (no cache).
	Client client.Client
	Lab    *netlab.Lab
	GWs    map[string]*Topology
	// Order is the gateways in the order they were asked for.
	Order []*Topology
	Ctrl  *Controller

	opts Options
}

// Topology is one gateway's netlab topology (ext, gw, the VPC hosts) as a
// Stack holds it: the netlab.Gateway under the name the API knows, with its
// probe paths.
type Topology struct {
	*netlab.Gateway
	Name string
}

// New builds a Stack; t.Cleanup tears everything down.
func New(t *testing.T, o Options) *Stack {
	t.Helper()
	bin := Require(t)
	if o.Dataplane == "" {
		o.Dataplane = "nftables"
	}
	if len(o.Gateways) == 0 {
		o.Gateways = []GatewaySpec{{Name: "gw1"}}
	}
	o.Controller.Dataplane = o.Dataplane
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &Stack{T: t, Ctx: ctx, Dataplane: o.Dataplane, Bin: bin, GWs: map[string]*Topology{}, opts: o}
	start := time.Now()
	if o.CRDs == "" {
		o.CRDs = crdtest.Natgw
	}
	s.CRDs = o.CRDs
	s.API = StartAPIServerWith(t, o.CRDs)
	if !o.NoAdmission {
		if err := apitest.InstallAdmission(ctx, s.API.Config, apitest.AdmissionOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	apiUp := time.Since(start)
	c, err := client.New(s.API.Config, client.Options{Scheme: Scheme})
	if err != nil {
		t.Fatal(err)
	}
	s.Client = c
	s.Lab = netlab.ForTest(t)
	labStart := time.Now()
	for _, spec := range o.Gateways {
		g, err := s.Lab.Gateway(netlab.GatewayOptions{Name: spec.Name, VMs: spec.VMs, IPv6: o.IPv6})
		if err != nil {
			t.Fatal(err)
		}
		gw := &Topology{Gateway: g, Name: spec.Name}
		s.GWs[spec.Name] = gw
		s.Order = append(s.Order, gw)
		s.serveProbes(gw)
		if !o.NoGatewayObjects {
			s.Create(&v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: spec.Name}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc-" + spec.Name, Subnet: "subnet-" + spec.Name}})
		}
	}
	labUp := time.Since(labStart)
	if !o.NoController {
		s.StartController()
	}
	t.Logf("stack up in %v (API server %v, topologies %v; dataplane %s, %d gateway(s), %s CRDs, admission policy %v)", time.Since(start).Round(time.Millisecond),
		apiUp.Round(time.Millisecond), labUp.Round(time.Millisecond), o.Dataplane, len(o.Gateways), o.CRDs, !o.NoAdmission)
	return s
}

// serveProbes starts TCP and UDP probe servers on every VPC host (VMPort)
// and on the external host (ExtPort).
func (s *Stack) serveProbes(g *Topology) {
	hosts := append([]netlab.Host{g.Ext}, g.VMs...)
	for i, h := range hosts {
		port := VMPort
		if i == 0 {
			port = ExtPort
		}
		addrs := []string{"0.0.0.0:" + strconv.Itoa(port)}
		if s.opts.IPv6 {
			addrs = append(addrs, "[::]:"+strconv.Itoa(port))
		}
		for _, addr := range addrs {
			if _, err := s.Lab.ServeTCP(s.Ctx, h.NS, addr); err != nil {
				s.T.Fatal(err)
			}
			if _, err := s.Lab.ServeUDP(s.Ctx, h.NS, addr); err != nil {
				s.T.Fatal(err)
			}
		}
	}
}

// GatewayConfigs is the controller's gateway configuration for the Stack.
func (s *Stack) GatewayConfigs() []gwconfig.Entry {
	var out []gwconfig.Entry
	for _, g := range s.Order {
		e := gwconfig.Entry{Name: g.Name, NetNS: g.GW, ExternalGateway: netlab.ExtAddr.String(),
			ExternalInterface: g.ExternalInterface, InternalInterface: g.InternalInterface}
		if s.opts.IPv6 {
			e.ExternalGatewayV6, e.ExternalV6PrefixLen = netlab.ExtAddr6.String(), netlab.ExtNet6.Bits()
		}
		out = append(out, e)
	}
	return out
}

// StartController starts the natgw-controller process.
func (s *Stack) StartController() *Controller {
	s.T.Helper()
	s.Ctrl = StartController(s.T, s.Bin, s.API, s.GatewayConfigs(), s.opts.Controller)
	return s.Ctrl
}

// Create creates obj, failing the test on error.
func (s *Stack) Create(obj client.Object) {
	s.T.Helper()
	if err := s.Client.Create(s.Ctx, obj); err != nil {
		s.T.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// Delete deletes obj (NotFound is fine).
func (s *Stack) Delete(obj client.Object) {
	s.T.Helper()
	if err := s.Client.Delete(s.Ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		s.T.Fatalf("delete %T %s: %v", obj, obj.GetName(), err)
	}
}

// EIP returns an IptablesEIP on gateway gw with address addr (spec.v4ip,
// or spec.v6ip for an IPv6 address: an IPv6-only EIP).
func EIP(name, gw string, addr netip.Addr) *v1.IptablesEIP {
	e := &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.IptablesEIPSpec{NatGwDp: gw}}
	if addr.Is6() {
		e.Spec.V6ip = addr.String()
	} else {
		e.Spec.V4ip = addr.String()
	}
	return e
}

// Family is an address family of a scenario's objects: the same scenario
// runs with IPv4 objects and with IPv6 ones on a dual-stack topology.
type Family int

// The families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string { return "ipv" + strconv.Itoa(int(f)) }

// EIP is netlab's i-th EIP address of the family.
func (f Family) EIP(i int) netip.Addr {
	if f == IPv6 {
		return netlab.EIP6(i)
	}
	return netlab.EIP(i)
}

// VMAddr is the family's address of VPC host i.
func (f Family) VMAddr(i int) netip.Addr {
	if f == IPv6 {
		return netlab.VMAddr6(i)
	}
	return netlab.VMAddr(i)
}

// VPCNet is the family's VPC subnet.
func (f Family) VPCNet() netip.Prefix {
	if f == IPv6 {
		return netlab.VPCNet6
	}
	return netlab.VPCNet
}

// ExtAddr is the family's address of the external host.
func (f Family) ExtAddr() netip.Addr {
	if f == IPv6 {
		return netlab.ExtAddr6
	}
	return netlab.ExtAddr
}

// FIP returns an IptablesFIPRule.
func FIP(name, eip string, internal netip.Addr) *v1.IptablesFIPRule {
	return &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.IptablesFIPRuleSpec{EIP: eip, InternalIP: internal.String()}}
}

// DNAT returns an IptablesDnatRule.
func DNAT(name, eip, proto string, extPort int, internal netip.Addr, inPort int) *v1.IptablesDnatRule {
	return &v1.IptablesDnatRule{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.IptablesDnatRuleSpec{
		EIP: eip, Protocol: proto, ExternalPort: strconv.Itoa(extPort), InternalIP: internal.String(), InternalPort: strconv.Itoa(inPort)}}
}

// SNAT returns an IptablesSnatRule.
func SNAT(name, eip, cidr string) *v1.IptablesSnatRule {
	return &v1.IptablesSnatRule{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.IptablesSnatRuleSpec{EIP: eip, InternalCIDR: cidr}}
}

// Ready reports obj's Ready condition as the API server has it: status,
// reason, message, and whether the status describes the current generation.
type Ready struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
	Current bool
}

func (r Ready) String() string {
	return fmt.Sprintf("Ready=%s reason=%s current=%v message=%q", r.Status, r.Reason, r.Current, r.Message)
}

// ReadyOf returns obj's Ready condition.
func ReadyOf(obj client.Object) Ready {
	st, _ := v1.SummaryOf(obj)
	c := st.ReadyCondition()
	if c == nil {
		return Ready{Status: metav1.ConditionUnknown}
	}
	return Ready{Status: c.Status, Reason: c.Reason, Message: c.Message,
		Current: st.ObservedGeneration == obj.GetGeneration() && c.ObservedGeneration == obj.GetGeneration()}
}

// Get refreshes obj from the API server.
func (s *Stack) Get(obj client.Object) error {
	return s.Client.Get(s.Ctx, client.ObjectKeyFromObject(obj), obj)
}

// WaitReason waits until obj's Ready condition for its current generation
// has reason (Programmed means Ready=True) and returns how long it took.
func (s *Stack) WaitReason(obj client.Object, reason string, timeout time.Duration) time.Duration {
	s.T.Helper()
	return Eventually(s.T, s.Ctx, timeout, fmt.Sprintf("%T %s reason %s", obj, obj.GetName(), reason), func() error {
		if err := s.Get(obj); err != nil {
			return err
		}
		r := ReadyOf(obj)
		if !r.Current || r.Reason != reason {
			return fmt.Errorf("%s", r)
		}
		if reason == v1.ReasonProgrammed && r.Status != metav1.ConditionTrue {
			return fmt.Errorf("%s", r)
		}
		return nil
	})
}

// WaitReady waits until every obj is Ready (60 s each at most).
func (s *Stack) WaitReady(objs ...client.Object) time.Duration {
	s.T.Helper()
	start := time.Now()
	for _, o := range objs {
		s.WaitReason(o, v1.ReasonProgrammed, 60*time.Second)
	}
	return time.Since(start)
}

// WaitGone waits until every obj is gone from the API server.
func (s *Stack) WaitGone(timeout time.Duration, objs ...client.Object) time.Duration {
	s.T.Helper()
	return Eventually(s.T, s.Ctx, timeout, "objects gone", func() error {
		for _, o := range objs {
			err := s.Client.Get(s.Ctx, client.ObjectKeyFromObject(o), o.DeepCopyObject().(client.Object))
			if err == nil {
				return fmt.Errorf("%T %s still there", o, o.GetName())
			}
			if !apierrors.IsNotFound(err) {
				return err
			}
		}
		return nil
	})
}

// ObjectUIDs returns the UIDs of every natgw object in the API server, by
// UID, with "Kind/name" (terminating ones included).
func (s *Stack) ObjectUIDs() (map[string]string, error) {
	out := map[string]string{}
	lists := []struct {
		kind string
		list client.ObjectList
	}{
		{"IptablesEIP", &v1.IptablesEIPList{}},
		{"IptablesFIPRule", &v1.IptablesFIPRuleList{}},
		{"IptablesDnatRule", &v1.IptablesDnatRuleList{}},
		{"IptablesSnatRule", &v1.IptablesSnatRuleList{}},
		{"VpcNatGateway", &v1.VpcNatGatewayList{}},
	}
	for _, l := range lists {
		if err := s.Client.List(s.Ctx, l.list); err != nil {
			return nil, err
		}
		err := meta.EachListItem(l.list, func(o runtime.Object) error {
			m, err := meta.Accessor(o)
			if err != nil {
				return err
			}
			out[string(m.GetUID())] = l.kind + "/" + m.GetName()
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", l.kind, err)
		}
	}
	return out, nil
}

// DeleteAll deletes every natgw object (rules first, then EIPs, then
// gateways) and waits until they are gone.
func (s *Stack) DeleteAll(timeout time.Duration) time.Duration {
	s.T.Helper()
	start := time.Now()
	for _, l := range [][]client.Object{
		{&v1.IptablesFIPRule{}, &v1.IptablesDnatRule{}, &v1.IptablesSnatRule{}},
		{&v1.IptablesEIP{}},
		{&v1.VpcNatGateway{}},
	} {
		for _, o := range l {
			if err := s.Client.DeleteAllOf(s.Ctx, o); err != nil {
				s.T.Fatalf("delete all %T: %v", o, err)
			}
		}
	}
	Eventually(s.T, s.Ctx, timeout, "every natgw object gone", func() error {
		uids, err := s.ObjectUIDs()
		if err != nil {
			return err
		}
		if len(uids) > 0 {
			return fmt.Errorf("%d left, e.g. %v", len(uids), sample(uids))
		}
		return nil
	})
	return time.Since(start)
}

func sample(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, v+"("+k+")")
		if len(out) == 3 {
			break
		}
	}
	return out
}
