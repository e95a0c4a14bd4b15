#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver + etcd) from the Go module
# proxy into a git-ignored cache, once. Neither can be `go install`ed (their
# go.mod files carry replace directives), so each is built from a small
# wrapper module here (kube-apiserver/, etcd/: see their go.mod).
#
#   hack/envtest/build.sh            build if missing or stale, print the assets dir
#   ENVTEST_FORCE=1 hack/envtest/build.sh   rebuild unconditionally
#
# Output: $ENVTEST_ASSETS (default <repo>/.cache/envtest/bin) holding
# kube-apiserver and etcd, plus a .stamp file recording what they were built
# from. The build is skipped when the stamp matches (pinned versions, the
# wrapper modules' go.mod/go.sum hashes, the Go version and the build flags)
# and both binaries exist. The last line printed is
#   KUBEBUILDER_ASSETS=<dir>
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
out="${ENVTEST_ASSETS:-$root/.cache/envtest/bin}"

ETCD_VERSION=v3.7.3

apiserver_mod="$here/kube-apiserver"
etcd_mod="$here/etcd"
apiserver_tags="selinux,notest,grpcnotrace"

ldflags="$(kube_ldflags)"

# Everything the binaries depend on, in one stamp.
stamp_content() {
	echo "kube-apiserver $KUBE_VERSION $(hash_files "$apiserver_mod/go.mod" "$apiserver_mod/go.sum")"
	echo "etcd $ETCD_VERSION $(hash_files "$etcd_mod/go.mod" "$etcd_mod/go.sum")"
	go_stamp
	echo "tags $apiserver_tags"
	echo "ldflags $ldflags"
}

want="$(stamp_content)"
begin_build "$out" "$want" "${ENVTEST_FORCE:-}" "envtest assets ($KUBE_VERSION, etcd $ETCD_VERSION)" "KUBEBUILDER_ASSETS=$out" "$out/kube-apiserver" "$out/etcd"
go_isolate
echo "building kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION (cold: several minutes) ..." >&2
go_build "$apiserver_mod" "$apiserver_tags" "$ldflags" "$out" k8s.io/kubernetes/cmd/kube-apiserver kube-apiserver
go_build "$etcd_mod" "" "" "$out" go.etcd.io/etcd/server/v3 etcd

# Sanity: the binaries report the pinned versions. (Capture first: with
# pipefail, `cmd | grep -q` fails when grep exits before cmd has written all.)
apiserver_version=$("$out/kube-apiserver" --version)
grep -qx "Kubernetes $KUBE_VERSION" <<<"$apiserver_version" ||
	{ echo "kube-apiserver reports $apiserver_version, want $KUBE_VERSION" >&2; exit 1; }
etcd_version=$("$out/etcd" --version)
grep -q "etcd Version: ${ETCD_VERSION#v}" <<<"$etcd_version" ||
	{ echo "etcd reports $(head -1 <<<"$etcd_version"), want $ETCD_VERSION" >&2; exit 1; }

end_build "$out" "$want" "envtest assets" "KUBEBUILDER_ASSETS=$out"
