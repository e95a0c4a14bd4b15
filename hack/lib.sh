# Shared by hack/*/build.sh: cached builds of pinned Go programs from the Go
# module proxy into git-ignored folders, skipped when a stamp says the
# binaries are current. Source it; it defines no behaviour of its own
# beyond setting root (the repository) and here (the sourcing script's
# folder). A build script is:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
#   out=...; want="$(stamp_content)"
#   begin_build "$out" "$want" "$FORCE" "LABEL" "RESULT=..." BIN...   # exits 0 when current
#   go_isolate; go_build ...
#   end_build "$out" "$want" "LABEL" "RESULT=..."

set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The Kubernetes release of every Kubernetes binary natgw builds (envtest's
# kube-apiserver, the cluster's kubelet and friends); the Go modules under
# hack/*/ pin the same.
KUBE_VERSION=v1.37.2
KUBE_MAJOR=1
KUBE_MINOR=37

# hash_files FILE...: one sha256 of the files' contents.
hash_files() { cat "$@" | sha256sum | cut -d' ' -f1; }

# go_stamp: the stamp line of the Go toolchain that builds.
go_stamp() { echo "go $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"; }

# kube_ldflags: the -X flags that make a Kubernetes binary report
# KUBE_VERSION (as a release build does).
kube_ldflags() {
	local flags="" pkg
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$KUBE_VERSION"
		flags+=" -X $pkg.gitMajor=$KUBE_MAJOR"
		flags+=" -X $pkg.gitMinor=$KUBE_MINOR"
		flags+=" -X $pkg.gitTreeState=clean"
	done
	echo "${flags# }"
}

# up_to_date STAMP WANT FORCE BIN...: true when FORCE is not 1, every BIN is
# executable and the file STAMP holds WANT.
up_to_date() {
	local stamp=$1 want=$2 force=$3 b
	shift 3
	[[ "$force" != 1 && -f "$stamp" ]] || return 1
	for b in "$@"; do [[ -x "$b" ]] || return 1; done
	[[ "$(cat "$stamp")" == "$want" ]]
}

# go_build MODULE TAGS LDFLAGS DIR PKG NAME: builds PKG of the nested module
# MODULE into DIR/NAME, timed, moved into place only when complete. One
# build at a time: each go build already uses every core.
go_build() {
	local mod=$1 tags=$2 ldflags=$3 dir=$4 pkg=$5 name=$6 t0=$SECONDS
	echo "building $name ..." >&2
	go build -C "$mod" -tags "$tags" -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg"
	mv -f "$dir/$name.tmp" "$dir/$name"
	echo "$name built in $((SECONDS - t0))s" >&2
}

# The nested modules stand alone: never let a go.work or the caller's
# GOFLAGS (e.g. -mod=vendor) leak into them. Static binaries, no cgo.
go_isolate() { export GOWORK=off CGO_ENABLED=0 GOFLAGS=-buildvcs=false; }

# begin_build OUT WANT FORCE LABEL RESULT BIN...: when FORCE is not 1, every
# BIN is executable and OUT/.stamp holds WANT, prints "LABEL up to date in
# OUT" to stderr and RESULT to stdout, and exits the script with 0. Else it
# makes OUT, removes the stale stamp and starts the clock for end_build.
begin_build() {
	local out=$1 want=$2 force=$3 label=$4 result=$5
	shift 5
	if up_to_date "$out/.stamp" "$want" "$force" "$@"; then
		echo "$label up to date in $out" >&2
		echo "$result"
		exit 0
	fi
	mkdir -p "$out"
	rm -f "$out/.stamp"
	build_t0=$SECONDS
}

# end_build OUT WANT LABEL RESULT: records WANT in OUT/.stamp, prints
# "LABEL built in Ns into OUT" to stderr and RESULT (the script's last
# line) to stdout.
end_build() {
	local out=$1 want=$2 label=$3 result=$4
	printf '%s\n' "$want" >"$out/.stamp"
	echo "$label built in $((SECONDS - build_t0))s into $out" >&2
	echo "$result"
}
