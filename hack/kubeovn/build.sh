#!/usr/bin/env bash
# Builds Kube-OVN's own, unmodified kube-ovn-controller v1.16.2 from the Go
# module proxy into a git-ignored cache, once, for internal/kubeovn and the
# tests in e2e/kubeovn.
#
#   hack/kubeovn/build.sh               build if missing or stale, print the binary's path
#   KUBEOVN_FORCE=1 hack/kubeovn/build.sh   rebuild unconditionally
#
# The wrapper module hack/kubeovn/controller has kube-ovn v1.16.2's go.mod as
# its basis (module renamed, a require of kube-ovn itself, its replace lines
# kept, its tool block dropped) and its go.sum. The binary dispatches on
# argv[0], so it is written as kube-ovn-controller. Output:
# $KUBEOVN_BIN (default <repo>/.cache/kubeovn/bin)/kube-ovn-controller plus a
# .stamp; the build is skipped when the stamp matches. Cold: ~400 s on 2
# cores. The last line printed is KUBEOVN_CONTROLLER=<path>.
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
out="${KUBEOVN_BIN:-$root/.cache/kubeovn/bin}"
mod="$here/controller"
KUBEOVN_VERSION=v1.16.2
pkg=github.com/kubeovn/kube-ovn/cmd/controller

stamp_content() {
	echo "kube-ovn $KUBEOVN_VERSION $(hash_files "$mod/go.mod" "$mod/go.sum")"
	go_stamp
	echo "pkg $pkg"
}
want="$(stamp_content)"
bin="$out/kube-ovn-controller"
begin_build "$out" "$want" "${KUBEOVN_FORCE:-}" "kube-ovn-controller $KUBEOVN_VERSION" "KUBEOVN_CONTROLLER=$bin" "$bin"
go_isolate
GOFLAGS+=" -mod=mod"
echo "building kube-ovn-controller $KUBEOVN_VERSION (cold: ~400 s) ..." >&2
go build -C "$mod" -trimpath -o "$bin.tmp" "$pkg"
mv -f "$bin.tmp" "$bin"
end_build "$out" "$want" kube-ovn-controller "KUBEOVN_CONTROLLER=$bin"
