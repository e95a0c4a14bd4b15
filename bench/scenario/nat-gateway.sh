#!/bin/bash
# The upstream way, for the benchmark baseline: shaped like Kube-OVN's VPC NAT
# gateway script (`nat-gateway.sh <op> <rule>...`, each rule a comma-joined
# field list, one iptables exec per rule), written here from that
# description (not copied). IPTABLES and IPTABLES_SAVE pick the variant:
# iptables-legacy (the upstream default) or iptables-nft.
#
#   nat-gateway.sh add_floating_ip EIP,INTERNAL_IP ...
#   nat-gateway.sh del_floating_ip EIP,INTERNAL_IP ...
set -e
IPTABLES=${IPTABLES:-iptables-legacy}
IPTABLES_SAVE=${IPTABLES_SAVE:-iptables-legacy-save}

add_floating_ip() {
    for rule in "$@"; do
        IFS=, read -r eip internal <<<"$rule"
        # One FIP per EIP: refuse an EIP that already has an exclusive DNAT.
        if $IPTABLES_SAVE -t nat | grep -q -- "-A EXCLUSIVE_DNAT -d $eip/32 "; then
            echo "EIP $eip already has a floating IP" >&2
            exit 1
        fi
        $IPTABLES -w -t nat -A EXCLUSIVE_DNAT -d "$eip" -j DNAT --to-destination "$internal"
        $IPTABLES -w -t nat -A EXCLUSIVE_SNAT -s "$internal" -j SNAT --to-source "$eip"
    done
}

del_floating_ip() {
    for rule in "$@"; do
        IFS=, read -r eip internal <<<"$rule"
        if $IPTABLES_SAVE -t nat | grep -q -- "-A EXCLUSIVE_DNAT -d $eip/32 -j DNAT --to-destination $internal"; then
            $IPTABLES -w -t nat -D EXCLUSIVE_DNAT -d "$eip" -j DNAT --to-destination "$internal"
            $IPTABLES -w -t nat -D EXCLUSIVE_SNAT -s "$internal" -j SNAT --to-source "$eip"
        fi
        # Forget the EIP's flows, like upstream.
        conntrack -D -d "$eip" >/dev/null 2>&1 || true
    done
}

op=$1
shift || true
case "$op" in
add_floating_ip | del_floating_ip) "$op" "$@" ;;
*)
    echo "usage: $0 add_floating_ip|del_floating_ip EIP,INTERNAL_IP..." >&2
    exit 2
    ;;
esac
