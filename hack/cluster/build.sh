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
# gwimage/cmd/mkimage.
#
#   hack/cluster/build.sh                 build if missing or stale, print the bin dir
#   CLUSTER_FORCE=1 hack/cluster/build.sh rebuild unconditionally
#
# Output: $CLUSTER_BIN (default <repo>/.cache/cluster/bin), cni plugins in
# $CLUSTER_BIN/cni, and a .stamp recording what they were built from. The last
# line printed is CLUSTER_BIN=<dir>.
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
out="${CLUSTER_BIN:-$root/.cache/cluster/bin}"

CONTAINERD_VERSION=v2.4.2
CNI_VERSION=v1.10.0

kube_mod="$here/kubernetes"
ctrd_mod="$here/containerd"
cni_mod="$here/cni"
kube_tags="selinux,notest,grpcnotrace"
ctrd_tags="urfave_cli_no_docs,no_btrfs,no_devmapper,no_zfs"
shim_tags="urfave_cli_no_docs,no_grpc"

kube_ldflags="$(kube_ldflags)"
ctrd_ldflags="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"

kube_bins=(kubelet kube-controller-manager kube-scheduler kubectl)
ctrd_bins=(containerd ctr containerd-shim-runc-v2)
cni_bins=(bridge host-local loopback portmap)

stamp_content() {
	echo "kubernetes $KUBE_VERSION $(hash_files "$kube_mod/go.mod" "$kube_mod/go.sum") tags $kube_tags"
	echo "kube ldflags $kube_ldflags"
	echo "containerd $CONTAINERD_VERSION $(hash_files "$ctrd_mod/go.mod" "$ctrd_mod/go.sum") tags $ctrd_tags / $shim_tags"
	echo "containerd ldflags $ctrd_ldflags"
	echo "cni $CNI_VERSION $(hash_files "$cni_mod/go.mod" "$cni_mod/go.sum")"
	go_stamp
}

# every binary, for up_to_date
binaries() {
	local b
	for b in "${kube_bins[@]}" "${ctrd_bins[@]}"; do echo "$out/$b"; done
	for b in "${cni_bins[@]}"; do echo "$out/cni/$b"; done
}

want="$(stamp_content)"
mapfile -t bins < <(binaries)
begin_build "$out" "$want" "${CLUSTER_FORCE:-}" "cluster binaries (kubernetes $KUBE_VERSION, containerd $CONTAINERD_VERSION, cni $CNI_VERSION)" "CLUSTER_BIN=$out" "${bins[@]}"
mkdir -p "$out/cni"
go_isolate
for b in "${kube_bins[@]}"; do
	go_build "$kube_mod" "$kube_tags" "$kube_ldflags" "$out" "k8s.io/kubernetes/cmd/$b" "$b"
done
go_build "$ctrd_mod" "$ctrd_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/containerd containerd
go_build "$ctrd_mod" "$ctrd_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/ctr ctr
go_build "$ctrd_mod" "$shim_tags" "$ctrd_ldflags" "$out" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 containerd-shim-runc-v2
go_build "$cni_mod" "" "" "$out/cni" github.com/containernetworking/plugins/plugins/ipam/host-local host-local
for b in bridge loopback; do
	go_build "$cni_mod" "" "" "$out/cni" "github.com/containernetworking/plugins/plugins/main/$b" "$b"
done
go_build "$cni_mod" "" "" "$out/cni" github.com/containernetworking/plugins/plugins/meta/portmap portmap

# Sanity: the binaries report the pinned versions.
v=$("$out/kubelet" --version)
grep -qx "Kubernetes $KUBE_VERSION" <<<"$v" || { echo "kubelet reports $v, want $KUBE_VERSION" >&2; exit 1; }
v=$("$out/containerd" --version)
grep -q " $CONTAINERD_VERSION" <<<"$v" || { echo "containerd reports $v, want $CONTAINERD_VERSION" >&2; exit 1; }

end_build "$out" "$want" "cluster binaries" "CLUSTER_BIN=$out"
