// Package iptables is natgw's iptables-legacy data plane: the feature-flag
// fallback and the benchmark baseline. It has the semantics of the nftables
// backend behind the same nat.Dataplane (the shared engine plans every call;
// this package renders it), and the rule shapes of Kube-OVN's gateway script
// (nat-gateway.sh). It is built to be correct, not fast: iptables-legacy
// copies a whole table out of and back into the kernel on every change.
//
// # Execution
//
// Every kernel access is one exec of iptables-legacy-save or
// iptables-legacy-restore, entered into the gateway's namespace with
// `nsenter --net=/proc/self/fd/3`, fd 3 being a duplicate of the namespace
// fd opened once by NewBackend (so names, paths and "" behave alike, and a
// re-bound name cannot redirect us). Each exec runs under ExecTimeout and the
// caller's context; restore waits up to 30 s for the host-wide xtables lock.
//
// # Chains
//
// The only rules natgw adds to built-in chains are its hooks, one jump each
// (two in nat, two in mangle), inserted at position 1 once; Load restores a
// missing hook and removes duplicates. Table nat:
//
//	PREROUTING   -j NATGW_DNAT_FILTER
//	POSTROUTING  -j NATGW_SNAT_FILTER
//
//	NATGW_DNAT_FILTER     (ordered)
//	  -i <internal> -j MARK --set-xmark 0x20000/0x20000   hairpin mark, new connections from the VPC
//	  -j NATGW_EXCLUSIVE_DNAT                             FIP before port DNAT
//	  -j NATGW_SHARED_DNAT
//	NATGW_SNAT_FILTER     (ordered)
//	  -j NATGW_EXCLUSIVE_SNAT                             FIP-SNAT before CIDR-SNAT before hairpin
//	  -j NATGW_SHARED_SNAT
//	  -j NATGW_HAIRPIN_SNAT
//	NATGW_EXCLUSIVE_DNAT  per FIP:  -d EIP/32 -m comment --comment C -j DNAT --to-destination IN
//	NATGW_SHARED_DNAT     per DNAT: -d EIP/32 -p P -m P --dport X -m comment --comment C -j DNAT --to-destination IN:Y
//	                      per share DNAT identity of N backends: N contiguous rules, rank i (backends in UID order)
//	                      -d EIP/32 -p P -m P --dport X -m statistic --mode random --probability 1/(N-i)
//	                      -m comment --comment C -j DNAT --to-destination IN:Y, the last rank without the statistic match
//	NATGW_EXCLUSIVE_SNAT  per FIP:  -s IN/32 -o <external> -m comment --comment C -j SNAT --to-source EIP
//	NATGW_SHARED_SNAT     per SNAT: [-s CIDR] -o <external> -m comment --comment C -j SNAT --to-source EIP [--random-fully]
//	                      ordered longest prefix first (then by address), so the longest prefix wins
//	NATGW_HAIRPIN_SNAT    per FIP and per DNAT:
//	                      -o <internal> -m comment --comment C -m mark --mark 0x20000/0x20000
//	                      -m conntrack --ctstate DNAT --ctorigdst EIP -j SNAT --to-source EIP
//	NATGW_OBJECTS         never jumped to; storage only:
//	                      -m comment --comment "@natgw-boot <16 hex>" -j RETURN   the boot id
//	                      per EIP and per Route: -m comment --comment C -j RETURN
//
// Table mangle (QoS per EIP, like upstream's `tc ... police ... drop`):
//
//	PREROUTING   -j NATGW_QOS_INGRESS
//	POSTROUTING  -j NATGW_QOS_EGRESS
//
//	NATGW_QOS_INGRESS  per EIP with an ingress rate, before DNAT:
//	                   -d EIP/32 -i <external> -m comment --comment C -m hashlimit
//	                   --hashlimit-above R b/s [--hashlimit-burst B b] --hashlimit-name N -j DROP
//	NATGW_QOS_EGRESS   per EIP with an egress rate; mangle POSTROUTING runs before SNAT,
//	                   so the EIP is found through conntrack, two rules sharing bucket N:
//	                   -o <external> -m comment --comment C -m conntrack --ctorigdst EIP ... -j DROP   (replies of FIP/DNAT flows)
//	                   -o <external> -m comment --comment C -m conntrack --ctrepldst EIP ... -j DROP   (SNATed flows)
//
// hashlimit runs in byte mode with one bucket per rule name (no
// --hashlimit-mode). In byte mode an entry starts with one second of credit
// and --hashlimit-burst only buys whole extra seconds, so the burst is
// rendered as ceil(burst / rate) seconds, at least one (see hashlimitArgs);
// a tc-style burst below one second of rate cannot be expressed. The name is
// "ngw" + 12 hex digits of a digest of direction, EIP, rate and burst,
// because rules that reuse a name share the kernel's first configuration.
// The kernel rounds the rate, so chains are compared without the rate and
// burst values (the name covers them). The first packet of a new outbound
// flow passes the egress policer (its conntrack reply tuple is rewritten only
// by SNAT, after mangle).
//
// # Comments: the objects live in the kernel
//
// Every rule of an object carries the comment C = "<uid> <kind> key=value...",
// the object's whole spec, e.g.
//
//	"3f2c... fip eip=192.0.2.10 in=198.51.100.10"
//	"3f2c... dnat eip=192.0.2.11 proto=tcp port=80 to=198.51.100.11:8080"
//	"3f2c... dnat eip=192.0.2.11 proto=tcp port=80 to=198.51.100.11:8080 type=share"
//	"3f2c... snat eip=192.0.2.12 cidr=198.51.100.0/24 random-fully=1"
//	"3f2c... eip addr=192.0.2.10/24 qos=100/10/50/5"
//	"3f2c... route dst=10.0.0.0/8 via=198.51.100.254 dev=internal"
//
// (at most ~150 characters; iptables allows 255). Load reads one
// iptables-legacy-save, decodes the objects from the comments, re-renders
// them and compares with what the chains hold. The nat table is
// authoritative: an object's comment there wins over its mangle (QoS) rules.
// Rules that do not decode, UIDs whose rules disagree within one table and
// objects that conflict are logged and dropped;
// if anything differs (first start, a missing rule, a stray rule, a lost
// hook) our chains of that table are flushed and rewritten in one restore.
// A missing boot rule means the chains are new or were wiped: Load makes a
// new boot id and starts empty, which tells the controller to resync.
//
// iptables-legacy has no transaction spanning a save and a restore, so Load
// and Commit hold an exclusive flock on the gateway's network namespace file
// from the save to the restore (netns.NS.Lock): two openers of one gateway
// (an agent starting while `natgw list` runs) cannot both find no boot rule
// and write different boot ids, nor rewrite chains from a stale save.
//
// # Transactions
//
// Commit is one `iptables-legacy-restore -w 30 --noflush` run. Within it,
// the nat section comes first, then mangle (only tables with changes are
// listed); iptables-legacy replaces each table atomically at its COMMIT, so a
// call is atomic per table. The nat section deletes the removed objects'
// rules by exact spec (-D), then appends the added ones (-A; an update is old
// out, new in) and, if any SNAT changed, flushes NATGW_SHARED_SNAT and
// rewrites it whole in longest-prefix order; a share DNAT identity whose
// backends change has its old rules deleted (-D) and its new ones appended
// (-A) in rank order, since each rank's probability depends on the others.
// If the restore fails in the
// mangle section after nat was committed (or is killed), the error wraps
// nat.ErrUnknownState and the engine re-reads the kernel: Load then takes the
// committed nat records and rewrites the QoS rules to match them. A Sync (Full)
// reads the kernel back and rewrites every chain of ours that differs from
// the desired state (the same path as Load's repair).
//
// # Share DNAT
//
// Rank i of N matches with probability 1/(N-i), so every backend gets 1/N
// of new connections; conntrack pins each connection to the backend its
// first packet got. The kernel keeps a probability as round(p × 2^31) and
// iptables-legacy-save prints it with 11 decimals (1/3 as 0.33333333349):
// rules are rendered in that form and compared after the same
// quantization (Rule.key). Rules of different identities never match the
// same packet, so NATGW_SHARED_DNAT is compared without order except
// within an identity (chainsMatch). Removing a backend deletes, by tuple,
// only its own conntrack entries (ForgetDNATFlows); the other backends'
// connections stay.
//
// # IPv6
//
// This data plane is IPv4 only: Commit refuses an object with an IPv6
// address (an EIP's v6Address, a FIP/DNAT/SNAT of an IPv6 EIP) before
// anything runs, with a *nat.FieldError naming the field and the value
// and the reason "IPv6 is not supported by the iptables-legacy data plane
// (natgw does not drive ip6tables-legacy); use the nftables data plane".
// Why refusal rather than ip6tables-legacy: this backend is the fallback
// and the benchmark baseline of upstream's script, which has no ip6tables
// either (Kube-OVN's gateway never translated IPv6); a second family here
// would double every exec (ip6tables-legacy-save/-restore are separate
// programs with their own tables, so one operation could no longer be one
// restore, i.e. one kernel transaction, for a dual-stack EIP), and the
// nftables data plane does both families in one table and one
// transaction.
//
// # Cost
//
// A FIP is three rules, each with a comment match (the kernel keeps 256
// bytes per comment), against upstream's two uncommented rules; every
// change copies the whole nat table out and back. Measured on the 2-vCPU
// test machine while loaded (load average ~20), one-rule restore against
// 10,000 FIPs: upstream's shape (20,000 rules) 0.1 s CPU; with the hairpin
// rules (30,000) 0.25 s; with comments on all of them, this layout, 0.5 s.
//
// ForgetFlows deletes, with one ctnetlink dump in the namespace
// (nat/conntrack), every conntrack entry whose original or reply tuple holds
// one of the EIPs: upstream's `conntrack -D -d EIP` plus SNATed flows.
package iptables
