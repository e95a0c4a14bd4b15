#!/usr/bin/env bash
# Builds the helm CLI (helm.sh/helm/v4, pinned in hack/helm/go.mod) from the
# Go module proxy into a git-ignored cache, once: the chart under
# charts/natgw-controller is rendered and installed with it by the chart's
# tests (charts/natgw-controller) and the first-run test (e2e/firstrun).
#
#   hack/helm/build.sh             build if missing or stale
#   HELM_FORCE=1 hack/helm/build.sh   rebuild unconditionally
#
# Output: $HELM_BIN (default <repo>/.cache/helm/bin) holding helm and a
# .stamp of what it was built from (the wrapper module's go.mod/go.sum
# hashes, the Go version, the flags). The last line printed is
#   HELM=<path of helm>
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
out="${HELM_BIN:-$root/.cache/helm/bin}"

# The helm version the wrapper module requires (one place: hack/helm/go.mod).
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" {print $2}' "$here/go.mod")
[[ -n "$HELM_VERSION" ]] || { echo "hack/helm/go.mod requires no helm.sh/helm/v4" >&2; exit 1; }
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"

stamp_content() {
	echo "helm $HELM_VERSION $(hash_files "$here/go.mod" "$here/go.sum")"
	go_stamp
	echo "ldflags $ldflags"
}

want="$(stamp_content)"
begin_build "$out" "$want" "${HELM_FORCE:-}" "helm $HELM_VERSION" "HELM=$out/helm" "$out/helm"
go_isolate
echo "building helm $HELM_VERSION (cold: a few minutes) ..." >&2
go_build "$here" "" "$ldflags" "$out" helm.sh/helm/v4/cmd/helm helm

# Sanity: the binary reports the pinned version.
v=$("$out/helm" version --template '{{.Version}}')
[[ "$v" == "$HELM_VERSION" ]] || { echo "helm reports $v, want $HELM_VERSION" >&2; exit 1; }

end_build "$out" "$want" helm "HELM=$out/helm"
