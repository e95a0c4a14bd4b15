package scenario

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/upstream"
	"github.com/natgw/natgw/nat/netns"
)

// upstreamProgrammer runs Kube-OVN's own nat-gateway.sh (v1.16.2, from the
// Go module proxy through internal/upstream) the way kube-ovn-controller
// does: one `/bin/bash -c "bash nat-gateway.sh OP RULE"` per rule, in the
// gateway's namespace, judged as the controller judges it (a non-zero exit,
// or any standard error line that does not start with "Warning:", is a
// failure). The script picks iptables-legacy itself (it probes
// `iptables-legacy -t nat -S INPUT 1`), as in upstream's image.
type upstreamProgrammer struct {
	ns     *netns.NS
	script string
	vpc    string // the gateway's VPC interface, marked as upstream's init does
}

func openUpstream(ctx context.Context, _ *Env, gw *netlab.Gateway) (Programmer, error) {
	script, err := upstream.Path(ctx, upstream.NatGatewayScript)
	if err != nil {
		return nil, err
	}
	ns, err := netns.Open(gw.GW)
	if err != nil {
		return nil, err
	}
	return &upstreamProgrammer{ns: ns, script: script, vpc: gw.InternalInterface}, nil
}

// upstreamInitLayout is the chain layout upstream's `init` makes (v1.16.2
// nat-gateway.sh: nat chains DNAT_FILTER → EXCLUSIVE_DNAT, SHARED_DNAT;
// SNAT_FILTER → EXCLUSIVE_SNAT, SHARED_SNAT, HAIRPIN_SNAT; mangle VPC_MARK
// marking what enters from the VPC interface), loaded with one restore
// instead of running `init`, which also writes /etc/kube-ovn on the host.
// The script's own check (`check_inited`) accepts it.
func upstreamInitLayout(vpcIface string) string {
	return "*mangle\n:VPC_MARK - [0:0]\n-A PREROUTING -j VPC_MARK\n" +
		"-A VPC_MARK -i " + vpcIface + " -j MARK --set-xmark 0x1/0x1\nCOMMIT\n" +
		"*nat\n:DNAT_FILTER - [0:0]\n:SNAT_FILTER - [0:0]\n:EXCLUSIVE_DNAT - [0:0]\n:EXCLUSIVE_SNAT - [0:0]\n" +
		":SHARED_DNAT - [0:0]\n:SHARED_SNAT - [0:0]\n:HAIRPIN_SNAT - [0:0]\n" +
		"-A PREROUTING -j DNAT_FILTER\n-A DNAT_FILTER -j EXCLUSIVE_DNAT\n-A DNAT_FILTER -j SHARED_DNAT\n" +
		"-A POSTROUTING -j SNAT_FILTER\n-A SNAT_FILTER -j EXCLUSIVE_SNAT\n-A SNAT_FILTER -j SHARED_SNAT\n-A SNAT_FILTER -j HAIRPIN_SNAT\n"
}

// Preload installs upstream's init layout and fips (in the rule form
// upstream's floating-ip-add appends) with one iptables-legacy-restore.
func (p *upstreamProgrammer) Preload(ctx context.Context, fips []FIP) error {
	var b bytes.Buffer
	b.WriteString(upstreamInitLayout(p.vpc))
	writeFIPChains(&b, fips)
	b.WriteString("COMMIT\n")
	if _, err := run(ctx, p.ns, &b, nil, legacyScript.restore, "-w"); err != nil {
		return fmt.Errorf("preload %d fips: %w", len(fips), err)
	}
	return nil
}

// Add is v1.16.2's `floating-ip-add EIP,INTERNAL_IP`.
func (p *upstreamProgrammer) Add(ctx context.Context, f FIP) error {
	return p.call(ctx, "floating-ip-add", f.EIP.String()+","+f.Internal.String())
}

// Delete is v1.16.2's `floating-ip-del EIP` (it also runs
// `conntrack -D -d EIP`).
func (p *upstreamProgrammer) Delete(ctx context.Context, f FIP) error {
	return p.call(ctx, "floating-ip-del", f.EIP.String())
}

func (p *upstreamProgrammer) call(ctx context.Context, op, rule string) error {
	_, stderr, err := runOutputs(ctx, p.ns, nil, nil, "/bin/bash", "-c", "bash "+p.script+" "+op+" "+rule)
	if err != nil {
		return err
	}
	return controllerVerdict(op, stderr)
}

// controllerVerdict fails a call whose standard error has a line that does
// not start with "Warning:", as kube-ovn-controller v1.16.2 does
// (vpc_nat_gateway.go).
func controllerVerdict(op string, stderr []byte) error {
	for _, line := range strings.Split(strings.TrimSpace(string(stderr)), "\n") {
		if line != "" && !strings.HasPrefix(line, "Warning:") {
			return fmt.Errorf("%s: exit 0 with standard error %q (the controller counts it as a failure)", op, line)
		}
	}
	return nil
}

func (p *upstreamProgrammer) Close() error { return p.ns.Close() }
