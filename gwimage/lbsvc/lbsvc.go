// Package lbsvc carries out Kube-OVN's lb-svc.sh: the script its
// LoadBalancer-Service pods (enable-lb-svc, service_lb.go) run as
// `bash /kube-ovn/lb-svc.sh OP RULE...` in a pod of the gateway image:
//
//	init                                   net1 up with ARP off; policy rules iif net1 and iif eth0 -> table 100
//	eip-add "EIP/LEN,GW"                   EIP on net1, its subnet and a default via GW in table 100, ARP on,
//	                                       and GW must answer an ARP request from EIP (arping -f -c 3 -s EIP GW)
//	dnat-add "EIP,PORT,PROTO,IP,PORT,GW"   DNAT EIP:PORT/PROTO -> IP:PORT, IP via GW in table 100, masquerade to IP
//	dnat-del "EIP,PORT,PROTO,IP,PORT"      removes that DNAT
//
// natgw carries these out step by step in the same order as the script
// (addresses, rules and routes over netlink; DNAT and masquerade rules in
// its own nftables table natgw_lbsvc), stopping at the first step that
// fails, and with the script's quirks that the controller sees: a dnat-add
// whose DNAT, or whose masquerade, is already there ends the call with
// success. Every step acts in the calling thread's network namespace.
package lbsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// The names the script's pod uses.
const (
	// RouteTable is the policy routing table of the Service's traffic.
	RouteTable = 100
	// ExternalInterface is the pod's attachment to the external network.
	ExternalInterface = "net1"
	// InternalInterface is the pod's cluster interface.
	InternalInterface = "eth0"
)

// ErrUnknownOp is matched (errors.Is) by the error of NewCall for a
// subcommand the script does not have.
var ErrUnknownOp = errors.New("unknown subcommand")

// errStop ends a call early with success (the script's `exit 0`).
var errStop = errors.New("stop")

// Call is one lb-svc.sh call.
type Call struct {
	// Op is the subcommand: init, eip-add, dnat-add or dnat-del.
	Op string
	// Rules are the call's RULE words, as the script splits them.
	Rules []string
	step  func(fields []string) error
}

// NewCall returns the call `lb-svc.sh op args...`; the rules are the
// blank-separated words of args. It checks only op; Run checks the rules.
func NewCall(op string, args []string) (*Call, error) {
	step, ok := steps[op]
	if !ok {
		return nil, fmt.Errorf("%w %q (want init, eip-add, dnat-add or dnat-del)", ErrUnknownOp, op)
	}
	return &Call{Op: op, Rules: strings.Fields(strings.Join(args, " ")), step: step}, nil
}

// steps are the subcommands and what each does with one rule (init takes
// no rules: Run runs it whole).
var steps = map[string]func(fields []string) error{
	"init":     nil,
	"eip-add":  eipAdd,
	"dnat-add": dnatAdd,
	"dnat-del": dnatDel,
}

// Check checks every rule of c without touching the system; the error
// names the rule (from 1), the field and the value.
func (c *Call) Check() error {
	_, err := c.fields()
	return err
}

func (c *Call) fields() ([][]string, error) {
	split := make([][]string, len(c.Rules))
	for i, rule := range c.Rules {
		for _, f := range strings.Split(rule, ",") {
			if f != "" {
				split[i] = append(split[i], f)
			}
		}
		if err := check(c.Op, split[i]); err != nil {
			return nil, fmt.Errorf("rule %d %q: %w", i+1, rule, err)
		}
	}
	return split, nil
}

// Run carries out c in the calling thread's network namespace. Every rule
// is checked before anything is programmed (a malformed rule changes
// nothing); then the rules are carried out in turn, stopping at the first
// that fails. init ignores its rules, as the script does.
func (c *Call) Run() error {
	if c.Op == "init" {
		return lbsvcInit()
	}
	split, err := c.fields()
	if err != nil {
		return err
	}
	for i, rule := range c.Rules {
		err := c.step(split[i])
		if errors.Is(err, errStop) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("rule %d %q: %w", i+1, rule, err)
		}
	}
	return nil
}

// check checks one rule's fields without touching the system.
func check(op string, f []string) error {
	switch op {
	case "eip-add":
		if len(f) < 2 {
			return errors.New("want EIP/LEN,GATEWAY")
		}
		if _, err := lbsvcPrefix(f[0]); err != nil {
			return err
		}
		_, err := nat.ParseIPv4("gateway", f[1])
		return err
	case "dnat-add":
		if _, err := parseDNATSpec(f); err != nil {
			return err
		}
		if len(f) < 6 {
			return errors.New("want EIP,PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT,GATEWAY")
		}
		_, err := nat.ParseIPv4("gateway", f[5])
		return err
	case "dnat-del":
		_, err := parseDNATSpec(f)
		return err
	}
	return nil
}

func lbsvcLink(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	return l, nil
}

func lbsvcInit() error {
	ext, err := lbsvcLink(ExternalInterface)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(ext); err != nil {
		return fmt.Errorf("set %s up: %w", ExternalInterface, err)
	}
	if err := netlink.LinkSetARPOff(ext); err != nil {
		return fmt.Errorf("set %s arp off: %w", ExternalInterface, err)
	}
	rules, err := netlink.RuleList(unix.AF_INET)
	if err != nil {
		return fmt.Errorf("list policy rules: %w", err)
	}
	for _, iif := range []string{ExternalInterface, InternalInterface} {
		found := false
		for _, r := range rules {
			found = found || r.IifName == iif
		}
		if found {
			continue
		}
		r := netlink.NewRule()
		r.IifName, r.Table, r.Family = iif, RouteTable, unix.AF_INET
		if err := netlink.RuleAdd(r); err != nil {
			return fmt.Errorf("ip rule add iif %s table %d: %w", iif, RouteTable, err)
		}
	}
	return nil
}

// lbsvcPrefix reads the EIP[/LEN] field (a bare address is a /32) with
// nat's parser.
func lbsvcPrefix(s string) (netip.Prefix, error) {
	return nat.ParseIPv4Prefix("eip", s)
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

func eipAdd(f []string) error {
	if len(f) < 2 {
		return errors.New("want EIP/LEN,GATEWAY")
	}
	eip, err := lbsvcPrefix(f[0])
	if err != nil {
		return err
	}
	gw, err := nat.ParseIPv4("gateway", f[1])
	if err != nil {
		return err
	}
	ext, err := lbsvcLink(ExternalInterface)
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(ext, &netlink.Addr{IPNet: ipnet(eip)}); err != nil {
		return fmt.Errorf("ip addr replace %s dev %s: %w", eip, ExternalInterface, err)
	}
	idx := ext.Attrs().Index
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: ipnet(eip.Masked()), Table: RouteTable, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("ip route replace %s dev %s table %d: %w", eip.Masked(), ExternalInterface, RouteTable, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice(), Table: RouteTable}); err != nil {
		return fmt.Errorf("ip route replace default via %s dev %s table %d: %w", gw, ExternalInterface, RouteTable, err)
	}
	if err := netlink.LinkSetARPOn(ext); err != nil {
		return fmt.Errorf("set %s arp on: %w", ExternalInterface, err)
	}
	if err := arpProbe(ext, eip.Addr(), gw, 3, time.Second); err != nil {
		return fmt.Errorf("arping -f -c 3 -s %s %s: %w", eip.Addr(), gw, err)
	}
	return nil
}

// arpProbe sends up to count ARP requests for target from src on l, one per
// interval, and returns when one is answered.
func arpProbe(l netlink.Link, src, target netip.Addr, count int, interval time.Duration) error {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	ifi := l.Attrs().Index
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi}); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	mac := l.Attrs().HardwareAddr
	req := make([]byte, 28)
	binary.BigEndian.PutUint16(req[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(req[2:], 0x0800) // IPv4
	req[4], req[5] = 6, 4
	binary.BigEndian.PutUint16(req[6:], 1) // request
	copy(req[8:14], mac)
	s4, t4 := src.As4(), target.As4()
	copy(req[14:18], s4[:])
	copy(req[24:28], t4[:])
	bcast := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	buf := make([]byte, 128)
	for i := 0; i < count; i++ {
		if err := unix.Sendto(fd, req, 0, bcast); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		deadline := time.Now().Add(interval)
		for {
			left := time.Until(deadline)
			if left <= 0 {
				break
			}
			tv := unix.NsecToTimeval(left.Nanoseconds())
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return fmt.Errorf("timeout: %w", err)
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				return fmt.Errorf("receive: %w", err)
			}
			if n >= 28 && binary.BigEndian.Uint16(buf[6:]) == 2 && [4]byte(buf[14:18]) == t4 {
				return nil
			}
		}
	}
	return fmt.Errorf("no ARP reply from %s after %d requests", target, count)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// dnatSpec is one lb-svc DNAT.
type dnatSpec struct {
	eip, in     netip.Addr
	proto       string
	port, inPrt uint16
}

func (d dnatSpec) tag() string {
	return fmt.Sprintf("natgw lb-svc dnat %s %s %d %s:%d", d.eip, d.proto, d.port, d.in, d.inPrt)
}

func parseDNATSpec(f []string) (dnatSpec, error) {
	var d dnatSpec
	if len(f) < 5 {
		return d, errors.New("want EIP,PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT")
	}
	var err error
	if d.eip, err = nat.ParseIPv4("eip", strings.SplitN(f[0], "/", 2)[0]); err != nil {
		return d, err
	}
	if d.in, err = nat.ParseIPv4("internalIP", f[3]); err != nil {
		return d, err
	}
	if f[2] == "" { // the script has no default protocol
		return d, errors.New("protocol: missing")
	}
	proto, err := nat.ParseProtocol("protocol", f[2])
	if err != nil {
		return d, err
	}
	d.proto = string(proto)
	if d.port, err = nat.ParsePort("port", f[1]); err != nil {
		return d, err
	}
	if d.inPrt, err = nat.ParsePort("internalPort", f[4]); err != nil {
		return d, err
	}
	return d, nil
}

// table is natgw's lb-svc table.
var table = nftconn.Table{Family: nft.TableFamilyIPv4, Name: nftconn.LBSvcTable}

// chainsTx makes the table and its two NAT chains if missing.
func chainsTx() *nftconn.Tx {
	tx := &nftconn.Tx{}
	tx.AddTable(table)
	tx.AddChain(table, nftconn.Chain{Name: nftconn.LBSvcPreroutingChain, Type: nft.ChainTypeNAT, Hook: nft.ChainHookPrerouting, Priority: nft.ChainPriorityNATDest})
	tx.AddChain(table, nftconn.Chain{Name: nftconn.LBSvcPostroutingChain, Type: nft.ChainTypeNAT, Hook: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
	return tx
}

func daddrIs(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func protoNum(p string) byte { return map[string]byte{"tcp": 6, "udp": 17, "sctp": 132}[p] }

// dnatRule is d's rule of the prerouting chain.
func dnatRule(d dnatSpec) nftconn.Rule {
	port := make([]byte, 2)
	binary.BigEndian.PutUint16(port, d.port)
	inPort := make([]byte, 2)
	binary.BigEndian.PutUint16(inPort, d.inPrt)
	exprs := append(daddrIs(d.eip),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNum(d.proto)}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port},
		&expr.Immediate{Register: 1, Data: d.in.AsSlice()},
		&expr.Immediate{Register: 2, Data: inPort},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	)
	return nftconn.Rule{Exprs: exprs, Tag: d.tag(),
		Text: fmt.Sprintf("ip daddr %s %s dport %d dnat to %s:%d", d.eip, d.proto, d.port, d.in, d.inPrt)}
}

// masqRule is the postrouting chain's masquerade of traffic to in.
func masqRule(in netip.Addr) nftconn.Rule {
	return nftconn.Rule{Exprs: append(daddrIs(in), &expr.Masq{}), Tag: "natgw lb-svc masquerade " + in.String(),
		Text: "ip daddr " + in.String() + " masquerade"}
}

// addDNAT makes the table if missing and appends d's DNAT rule, unless
// one is there (added false).
func addDNAT(ctx context.Context, c nftconn.Conn, d dnatSpec) (added bool, err error) {
	if err := c.Apply(ctx, chainsTx()); err != nil {
		return false, fmt.Errorf("nftables: make table %s: %w", table.Name, err)
	}
	added, err = nftconn.AddRuleOnce(ctx, c, table, nftconn.LBSvcPreroutingChain, dnatRule(d), false)
	if err != nil {
		return false, fmt.Errorf("nftables: add DNAT %s: %w", d.tag(), err)
	}
	return added, nil
}

// addMasq inserts the masquerade of traffic to in first in the
// postrouting chain (made by addDNAT), unless one is there (added false).
func addMasq(ctx context.Context, c nftconn.Conn, in netip.Addr) (added bool, err error) {
	added, err = nftconn.AddRuleOnce(ctx, c, table, nftconn.LBSvcPostroutingChain, masqRule(in), true)
	if err != nil {
		return false, fmt.Errorf("nftables: add masquerade to %s: %w", in, err)
	}
	return added, nil
}

// delDNAT deletes d's DNAT rule; no table or no such rule is no error, as
// the script.
func delDNAT(ctx context.Context, c nftconn.Conn, d dnatSpec) error {
	if ok, err := nftconn.HasTable(ctx, c, table); err != nil || !ok {
		return err
	}
	h, found, err := nftconn.FindRule(ctx, c, table, nftconn.LBSvcPreroutingChain, d.tag())
	if err != nil || !found {
		return err
	}
	tx := &nftconn.Tx{}
	tx.DeleteRule(table, nftconn.LBSvcPreroutingChain, h, d.tag())
	if err := c.Apply(ctx, tx); err != nil {
		return fmt.Errorf("nftables: delete DNAT %s: %w", d.tag(), err)
	}
	return nil
}

func dnatAdd(f []string) error {
	d, err := parseDNATSpec(f)
	if err != nil {
		return err
	}
	if len(f) < 6 {
		return errors.New("want EIP,PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT,GATEWAY")
	}
	gw, err := nat.ParseIPv4("gateway", f[5])
	if err != nil {
		return err
	}
	ctx, c := context.Background(), nftconn.Current()
	if added, err := addDNAT(ctx, c, d); err != nil || !added {
		if err == nil {
			err = errStop // already there: the script ends the call with success
		}
		return err
	}
	if err := netlink.RouteReplace(&netlink.Route{Dst: ipnet(netip.PrefixFrom(d.in, 32)), Gw: gw.AsSlice(), Table: RouteTable}); err != nil {
		return fmt.Errorf("ip route replace %s via %s table %d: %w", d.in, gw, RouteTable, err)
	}
	if added, err := addMasq(ctx, c, d.in); err != nil || !added {
		if err == nil {
			err = errStop
		}
		return err
	}
	return nil
}

func dnatDel(f []string) error {
	d, err := parseDNATSpec(f)
	if err != nil {
		return err
	}
	return delDNAT(context.Background(), nftconn.Current(), d)
}
