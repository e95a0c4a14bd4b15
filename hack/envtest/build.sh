#!/usr/bin/env bash
# Builds the envtest control plane (kube-apiserver + etcd) from the Go module
# proxy into a git-ignored cache, once. See DESIGN.md §7.
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
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${ENVTEST_ASSETS:-$root/.cache/envtest/bin}"

KUBE_VERSION=v1.37.2
KUBE_MAJOR=1
KUBE_MINOR=37
ETCD_VERSION=v3.7.3

apiserver_mod="$here/kube-apiserver"
etcd_mod="$here/etcd"
apiserver_tags="selinux,notest,grpcnotrace"

ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION"
	ldflags+=" -X $pkg.gitMajor=$KUBE_MAJOR"
	ldflags+=" -X $pkg.gitMinor=$KUBE_MINOR"
	ldflags+=" -X $pkg.gitTreeState=clean"
done
ldflags="${ldflags# }"

hash_files() { cat "$@" | sha256sum | cut -d' ' -f1; }

# Everything the binaries depend on, in one stamp.
stamp_content() {
	echo "kube-apiserver $KUBE_VERSION $(hash_files "$apiserver_mod/go.mod" "$apiserver_mod/go.sum")"
	echo "etcd $ETCD_VERSION $(hash_files "$etcd_mod/go.mod" "$etcd_mod/go.sum")"
	echo "go $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
	echo "tags $apiserver_tags"
	echo "ldflags $ldflags"
}

want="$(stamp_content)"
stamp="$out/.stamp"

if [[ "${ENVTEST_FORCE:-}" != 1 && -x "$out/kube-apiserver" && -x "$out/etcd" && -f "$stamp" ]] &&
	[[ "$(cat "$stamp")" == "$want" ]]; then
	echo "envtest assets up to date in $out ($KUBE_VERSION, etcd $ETCD_VERSION)" >&2
	echo "KUBEBUILDER_ASSETS=$out"
	exit 0
fi

mkdir -p "$out"
rm -f "$stamp"

# The nested modules stand alone: never let a go.work or the caller's GOFLAGS
# (e.g. -mod=vendor) leak into them. Static binaries, no cgo.
export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# One build at a time (2-core machines): each go build already uses every core.
t0=$SECONDS
echo "building kube-apiserver $KUBE_VERSION (cold: several minutes) ..." >&2
go build -C "$apiserver_mod" -tags "$apiserver_tags" -ldflags "$ldflags" \
	-o "$out/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv -f "$out/kube-apiserver.tmp" "$out/kube-apiserver"
t1=$SECONDS
echo "kube-apiserver built in $((t1 - t0))s" >&2

echo "building etcd $ETCD_VERSION ..." >&2
go build -C "$etcd_mod" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
mv -f "$out/etcd.tmp" "$out/etcd"
t2=$SECONDS
echo "etcd built in $((t2 - t1))s" >&2

# Sanity: the binaries report the pinned versions. (Capture first: with
# pipefail, `cmd | grep -q` fails when grep exits before cmd has written all.)
apiserver_version=$("$out/kube-apiserver" --version)
grep -qx "Kubernetes $KUBE_VERSION" <<<"$apiserver_version" ||
	{ echo "kube-apiserver reports $apiserver_version, want $KUBE_VERSION" >&2; exit 1; }
etcd_version=$("$out/etcd" --version)
grep -q "etcd Version: ${ETCD_VERSION#v}" <<<"$etcd_version" ||
	{ echo "etcd reports $(head -1 <<<"$etcd_version"), want $ETCD_VERSION" >&2; exit 1; }

printf '%s\n' "$want" >"$stamp"
echo "envtest assets built in $((t2 - t0))s into $out" >&2
echo "KUBEBUILDER_ASSETS=$out"
