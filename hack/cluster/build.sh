#!/usr/bin/env bash
# Builds the node side of the test cluster (internal/cluster) from the Go
# module proxy into a git-ignored cache, once, like hack/envtest/build.sh:
#
#   kubelet, kube-controller-manager, kube-scheduler, kubectl   k8s.io/kubernetes v1.37.2
#   containerd, containerd-shim-runc-v2, ctr                    containerd v2.4.2
#   bridge, host-local, loopback, portmap                       CNI plugins v1.10.0
#
# kube-apiserver and etcd are the envtest assets (hack/envtest/build.sh); runc
# is Debian's package (mk/cluster.mk installs it); the pause image is built by
# internal/cluster/cmd/mkimage.
#
#   hack/cluster/build.sh                 build if missing or stale, print the bin dir
#   CLUSTER_FORCE=1 hack/cluster/build.sh rebuild unconditionally
#
# Output: $CLUSTER_BIN (default <repo>/.cache/cluster/bin), cni plugins in
# $CLUSTER_BIN/cni, and a .stamp recording what they were built from. The last
# line printed is CLUSTER_BIN=<dir>.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${CLUSTER_BIN:-$root/.cache/cluster/bin}"

KUBE_VERSION=v1.37.2
KUBE_MAJOR=1
KUBE_MINOR=37
CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.10.0

kube_mod="$here/kubernetes"
ctrd_mod="$here/containerd"
cni_mod="$here/cni"
kube_tags="selinux,notest,grpcnotrace"
ctrd_tags="urfave_cli_no_docs,no_btrfs,no_devmapper,no_zfs"
shim_tags="urfave_cli_no_docs,no_grpc"

kube_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION"
	kube_ldflags+=" -X $pkg.gitMajor=$KUBE_MAJOR"
	kube_ldflags+=" -X $pkg.gitMinor=$KUBE_MINOR"
	kube_ldflags+=" -X $pkg.gitTreeState=clean"
done
kube_ldflags="${kube_ldflags# }"
ctrd_ldflags="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"

kube_bins=(kubelet kube-controller-manager kube-scheduler kubectl)
ctrd_bins=(containerd ctr containerd-shim-runc-v2)
cni_bins=(bridge host-local loopback portmap)

hash_files() { cat "$@" | sha256sum | cut -d' ' -f1; }

stamp_content() {
	echo "kubernetes $KUBE_VERSION $(hash_files "$kube_mod/go.mod" "$kube_mod/go.sum") tags $kube_tags"
	echo "kube ldflags $kube_ldflags"
	echo "containerd $CONTAINERD_VERSION $(hash_files "$ctrd_mod/go.mod" "$ctrd_mod/go.sum") tags $ctrd_tags / $shim_tags"
	echo "containerd ldflags $ctrd_ldflags"
	echo "cni $CNI_VERSION $(hash_files "$cni_mod/go.mod" "$cni_mod/go.sum")"
	echo "go $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
}

all_present() {
	local b
	for b in "${kube_bins[@]}" "${ctrd_bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
	for b in "${cni_bins[@]}"; do [[ -x "$out/cni/$b" ]] || return 1; done
}

want="$(stamp_content)"
stamp="$out/.stamp"
if [[ "${CLUSTER_FORCE:-}" != 1 && -f "$stamp" ]] && all_present &&
	[[ "$(cat "$stamp")" == "$want" ]]; then
	echo "cluster binaries up to date in $out (kubernetes $KUBE_VERSION, containerd $CONTAINERD_VERSION, cni $CNI_VERSION)" >&2
	echo "CLUSTER_BIN=$out"
	exit 0
fi

mkdir -p "$out/cni"
rm -f "$stamp"
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# build MODULE TAGS LDFLAGS OUTDIR PKG NAME: one binary, timed, moved into place
# only when complete. One build at a time: each go build uses every core.
build() {
	local mod=$1 tags=$2 ldflags=$3 dir=$4 pkg=$5 name=$6 t0=$SECONDS
	echo "building $name ..." >&2
	go build -C "$mod" -tags "$tags" -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg"
	mv -f "$dir/$name.tmp" "$dir/$name"
	echo "$name built in $((SECONDS - t0))s" >&2
}

t0=$SECONDS
for b in "${kube_bins[@]}"; do
	build "$kube_mod" "$kube_tags" "$kube_ldflags" "$out" "k8s.io/kubernetes/cmd/$b" "$b"
done
build "$ctrd_mod" "$ctrd_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/containerd containerd
build "$ctrd_mod" "$ctrd_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/ctr ctr
build "$ctrd_mod" "$shim_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 containerd-shim-runc-v2
build "$cni_mod" "" "" "$out/cni" github.com/containernetworking/plugins/plugins/ipam/host-local host-local
for b in bridge loopback; do
	build "$cni_mod" "" "" "$out/cni" "github.com/containernetworking/plugins/plugins/main/$b" "$b"
done
build "$cni_mod" "" "" "$out/cni" github.com/containernetworking/plugins/plugins/meta/portmap portmap

# Sanity: the binaries report the pinned versions.
v=$("$out/kubelet" --version)
grep -qx "Kubernetes $KUBE_VERSION" <<<"$v" || { echo "kubelet reports $v, want $KUBE_VERSION" >&2; exit 1; }
v=$("$out/containerd" --version)
grep -q " $CONTAINERD_VERSION" <<<"$v" || { echo "containerd reports $v, want $CONTAINERD_VERSION" >&2; exit 1; }

printf '%s\n' "$want" >"$stamp"
echo "cluster binaries built in $((SECONDS - t0))s into $out" >&2
echo "CLUSTER_BIN=$out"
