#!/usr/bin/env bash
# Installs the Debian packages natgw's tests, demo and benchmarks use, unless
# they are already present. Needs root (it is a no-op when all are present).
set -euo pipefail
need=()
for pair in nft:nftables iptables-legacy:iptables conntrack:conntrack ip:iproute2 arping:iputils-arping bash:bash lsmod:kmod ipcalc-ng:ipcalc-ng; do
  bin=${pair%%:*} pkg=${pair#*:}
  command -v "$bin" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v go >/dev/null 2>&1 || { echo "install-deps: go not found on PATH (need Go 1.26)" >&2; exit 1; }
