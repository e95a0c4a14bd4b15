#!/usr/bin/env bash
# Installs the Debian packages natgw's tests, demo and benchmarks use, unless
# they are already present. Needs root (it is a no-op when all are present).
# conntrackd is only a baseline (bench scenario 8 and nat/ha/ctsync's figures
# compare ctsync with it, in namespaces of their own): its package must not
# start a daemon on this host, so without a policy-rc.d of the machine's own
# one that refuses every start is in place for the install and removed after
# it (also one a killed run left: it carries the marker below).
set -euo pipefail
marker="# natgw install-deps: temporary, refuses service starts"
policy=/usr/sbin/policy-rc.d
if [[ -f $policy ]] && grep -qxF "$marker" "$policy"; then
  rm -f "$policy"
fi
need=()
for pair in nft:nftables iptables-legacy:iptables conntrack:conntrack conntrackd:conntrackd ip:iproute2 arping:iputils-arping bash:bash lsmod:kmod ipcalc-ng:ipcalc-ng; do
  bin=${pair%%:*} pkg=${pair#*:}
  command -v "$bin" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "install-deps: installing ${need[*]}"
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\n%s\nexit 101\n' "$marker" >"$policy"
    chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v go >/dev/null 2>&1 || { echo "install-deps: go not found on PATH (need Go 1.26)" >&2; exit 1; }
