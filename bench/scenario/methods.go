package scenario

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
)

// Programmer is one way of programming FIPs on a gateway.
type Programmer interface {
	// Preload installs fips as fast as the method allows (untimed set-up).
	Preload(ctx context.Context, fips []FIP) error
	// Add programs one FIP; Delete removes it (with its conntrack
	// entries when the method does that).
	Add(ctx context.Context, f FIP) error
	Delete(ctx context.Context, f FIP) error
	Close() error
}

// EIPHolder is a Programmer that also takes EIP objects: natgw's data
// planes, to which natgw-controller sends an EIP object for every EIP a
// FIP uses (the nftables data plane gives an IPv6 EIP object a conntrack
// mark id, nat/README.md "Conntrack"). The other methods have no EIP
// object.
type EIPHolder interface {
	HoldEIP(ctx context.Context, uid string, eip netip.Prefix) error
}

// eipObject is the EIP object of address eip (either family).
func eipObject(uid string, eip netip.Prefix) nat.Object {
	e := &nat.EIP{Address: eip.Addr(), PrefixLen: eip.Bits()}
	if eip.Addr().Is6() {
		e = &nat.EIP{V6Address: eip.Addr(), V6PrefixLen: eip.Bits()}
	}
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: e}
}

// Method names a Programmer for the report and opens it on a gateway.
type Method struct {
	Key   string // "a", "a1", "b".."f"
	Label string
	// Exec marks methods that exec processes per operation (their cost
	// grows with the table; they get fewer repetitions at big sizes).
	Exec bool
	// Ours marks natgw's own methods.
	Ours bool
	// CleansConntrack: Delete also deletes the EIP's conntrack entries;
	// scenario 1 then makes live flows before every delete.
	CleansConntrack bool
	// IPv6 marks methods that program IPv6 FIPs too: scenario 1 measures
	// them in both families in the same rounds (the IPv6 figures under
	// the key Key+"6", see ipv6Method).
	IPv6 bool
	Open func(ctx context.Context, e *Env, gw *netlab.Gateway) (Programmer, error)
}

// ipv6Method is the report's row of m's IPv6 measurements: key "d6" for
// (d), the label marked IPv6.
func ipv6Method(m Method) Method {
	m.Key, m.Label, m.IPv6 = m.Key+"6", m.Label+", IPv6", false
	return m
}

// Name is "(a) label".
func (m Method) Name() string { return fmt.Sprintf("(%s) %s", m.Key, m.Label) }

//go:embed nat-gateway.sh
var gatewayScript []byte

// scriptVariant is the upstream-shaped script on one iptables flavour.
type scriptVariant struct {
	iptables, save, restore string
}

var (
	legacyScript = scriptVariant{"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore"}
	nftScript    = scriptVariant{"iptables-nft", "iptables-nft-save", "iptables-nft-restore"}
)

// scriptProgrammer runs nat-gateway.sh once per operation, like upstream's
// controller does through pod exec.
type scriptProgrammer struct {
	v      scriptVariant
	ns     *netns.NS
	dir    string
	script string
}

func openScript(v scriptVariant) func(context.Context, *Env, *netlab.Gateway) (Programmer, error) {
	return func(ctx context.Context, _ *Env, gw *netlab.Gateway) (Programmer, error) {
		ns, err := netns.Open(gw.GW)
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "natgw-bench-script-")
		if err != nil {
			ns.Close()
			return nil, err
		}
		p := &scriptProgrammer{v: v, ns: ns, dir: dir, script: filepath.Join(dir, "nat-gateway.sh")}
		if err := os.WriteFile(p.script, gatewayScript, 0o755); err != nil {
			p.Close()
			return nil, err
		}
		return p, nil
	}
}

// Preload installs the chains (hooked like the upstream gateway's init) and
// fips with one iptables-restore.
func (p *scriptProgrammer) Preload(ctx context.Context, fips []FIP) error {
	var b bytes.Buffer
	b.WriteString("*nat\n:EXCLUSIVE_DNAT - [0:0]\n:EXCLUSIVE_SNAT - [0:0]\n")
	b.WriteString("-A PREROUTING -j EXCLUSIVE_DNAT\n-A POSTROUTING -j EXCLUSIVE_SNAT\n")
	writeFIPChains(&b, fips)
	b.WriteString("COMMIT\n")
	if _, err := run(ctx, p.ns, &b, nil, p.v.restore, "-w"); err != nil {
		return fmt.Errorf("preload %d fips: %w", len(fips), err)
	}
	return nil
}

// writeFIPChains writes fips as iptables-restore lines of the
// EXCLUSIVE_DNAT and EXCLUSIVE_SNAT chains, in the form upstream's script
// appends them.
func writeFIPChains(b *bytes.Buffer, fips []FIP) {
	b.Grow(len(fips) * 110)
	for _, f := range fips {
		fmt.Fprintf(b, "-A EXCLUSIVE_DNAT -d %s/32 -j DNAT --to-destination %s\n", f.EIP, f.Internal)
	}
	for _, f := range fips {
		fmt.Fprintf(b, "-A EXCLUSIVE_SNAT -s %s/32 -j SNAT --to-source %s\n", f.Internal, f.EIP)
	}
}

func (p *scriptProgrammer) op(ctx context.Context, op string, f FIP) error {
	_, err := run(ctx, p.ns, nil, []string{"IPTABLES=" + p.v.iptables, "IPTABLES_SAVE=" + p.v.save},
		"/bin/bash", p.script, op, f.EIP.String()+","+f.Internal.String())
	return err
}

func (p *scriptProgrammer) Add(ctx context.Context, f FIP) error {
	return p.op(ctx, "add_floating_ip", f)
}

func (p *scriptProgrammer) Delete(ctx context.Context, f FIP) error {
	return p.op(ctx, "del_floating_ip", f)
}

func (p *scriptProgrammer) Close() error {
	os.RemoveAll(p.dir)
	return p.ns.Close()
}

// nftCLIProgrammer execs `nft -f` once per operation, adding or deleting
// one element pair in maps like natgw's (nat/README.md), each element with
// the 36-character UID as comment.
type nftCLIProgrammer struct {
	ns  *netns.NS
	dir string
}

const nftCLITable = `table ip bench {
	map fip_dnat { type ipv4_addr : ipv4_addr; }
	map fip_snat { type ipv4_addr : ipv4_addr; }
	chain prerouting { type nat hook prerouting priority dstnat; policy accept; dnat to ip daddr map @fip_dnat; }
	chain postrouting { type nat hook postrouting priority srcnat; policy accept; snat to ip saddr map @fip_snat; }
}
`

func openNftCLI(ctx context.Context, _ *Env, gw *netlab.Gateway) (Programmer, error) {
	ns, err := netns.Open(gw.GW)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "natgw-bench-nft-")
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &nftCLIProgrammer{ns: ns, dir: dir}, nil
}

// nftElements writes "add element" (or "delete element") lines for fips,
// at most chunk FIPs per line.
func nftElements(b *bytes.Buffer, verb string, fips []FIP, chunk int) {
	for start := 0; start < len(fips); start += chunk {
		part := fips[start:min(start+chunk, len(fips))]
		for _, m := range []string{"fip_dnat", "fip_snat"} {
			fmt.Fprintf(b, "%s element ip bench %s { ", verb, m)
			for i, f := range part {
				if i > 0 {
					b.WriteString(", ")
				}
				key, val := f.EIP, f.Internal
				if m == "fip_snat" {
					key, val = f.Internal, f.EIP
				}
				if verb == "delete" {
					fmt.Fprintf(b, "%s", key)
				} else {
					fmt.Fprintf(b, "%s comment %q : %s", key, f.UID, val)
				}
			}
			b.WriteString(" }\n")
		}
	}
}

func (p *nftCLIProgrammer) file(name string, write func(*bytes.Buffer)) (string, error) {
	var b bytes.Buffer
	write(&b)
	path := filepath.Join(p.dir, name)
	return path, os.WriteFile(path, b.Bytes(), 0o644)
}

func (p *nftCLIProgrammer) Preload(ctx context.Context, fips []FIP) error {
	path, err := p.file("preload.nft", func(b *bytes.Buffer) {
		b.WriteString(nftCLITable)
		nftElements(b, "add", fips, 5000)
	})
	if err != nil {
		return err
	}
	if _, err := run(ctx, p.ns, nil, nil, "nft", "-f", path); err != nil {
		return fmt.Errorf("preload %d fips: %w", len(fips), err)
	}
	return nil
}

// op writes the one-FIP nft file and execs `nft -f` on it; the caller times
// both, as any caller of the CLI has to do both.
func (p *nftCLIProgrammer) op(ctx context.Context, verb string, f FIP) error {
	path, err := p.file(verb+".nft", func(b *bytes.Buffer) { nftElements(b, verb, []FIP{f}, 1) })
	if err != nil {
		return err
	}
	_, err = run(ctx, p.ns, nil, nil, "nft", "-f", path)
	return err
}

func (p *nftCLIProgrammer) Add(ctx context.Context, f FIP) error    { return p.op(ctx, "add", f) }
func (p *nftCLIProgrammer) Delete(ctx context.Context, f FIP) error { return p.op(ctx, "delete", f) }
func (p *nftCLIProgrammer) Close() error {
	os.RemoveAll(p.dir)
	return p.ns.Close()
}

// Opener opens a natgw data plane (the signature nat/nattest uses).
type Opener func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error)

// dataplaneProgrammer drives a nat.Dataplane in-process.
type dataplaneProgrammer struct{ dp nat.Dataplane }

func openDataplane(open Opener) func(context.Context, *Env, *netlab.Gateway) (Programmer, error) {
	return func(ctx context.Context, _ *Env, gw *netlab.Gateway) (Programmer, error) {
		dp, err := open(ctx, gw.Config())
		if err != nil {
			return nil, err
		}
		return &dataplaneProgrammer{dp: dp}, nil
	}
}

// HoldEIP implements EIPHolder.
func (p *dataplaneProgrammer) HoldEIP(ctx context.Context, uid string, eip netip.Prefix) error {
	if err := p.dp.Apply(ctx, eipObject(uid, eip)); err != nil {
		return fmt.Errorf("eip %s: %w", eip, err)
	}
	return nil
}

func (p *dataplaneProgrammer) Preload(ctx context.Context, fips []FIP) error {
	if err := p.dp.Sync(ctx, Objects(fips)); err != nil {
		return fmt.Errorf("preload %d fips: %w", len(fips), err)
	}
	return nil
}

func (p *dataplaneProgrammer) Add(ctx context.Context, f FIP) error {
	return p.dp.Apply(ctx, f.Object())
}

func (p *dataplaneProgrammer) Delete(ctx context.Context, f FIP) error {
	return p.dp.Delete(ctx, f.UID)
}

func (p *dataplaneProgrammer) Close() error { return p.dp.Close() }

// s1Methods lists scenario 1's methods in report order; natgw's own appear
// when their backends are linked in (see backends.go).
func s1Methods(e *Env) []Method {
	ms := []Method{
		{Key: "a", Label: "Kube-OVN v1.16.2 nat-gateway.sh, iptables-legacy", Exec: true, CleansConntrack: true, Open: openUpstream},
		{Key: "a1", Label: "upstream-shaped script, iptables-legacy", Exec: true, CleansConntrack: true, Open: openScript(legacyScript)},
		{Key: "b", Label: "upstream-shaped script, iptables-nft", Exec: true, CleansConntrack: true, Open: openScript(nftScript)},
		{Key: "c", Label: "`nft -f` exec per op (map element pair)", Exec: true, Open: openNftCLI},
	}
	ms = append(ms, natgwMethods(e)...)
	return ms
}

// methodLabel is a short label for plots.
func methodLabel(m Method) string {
	l := m.Label
	l = strings.ReplaceAll(l, "`", "")
	return "(" + m.Key + ") " + l
}
