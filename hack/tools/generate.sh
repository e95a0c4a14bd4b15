#!/usr/bin/env bash
# Runs controller-gen (pinned in hack/tools/go.mod) over controller/api/...:
# deepcopy functions and CRD manifests.
#
#   hack/tools/generate.sh                  write in tree (zz_generated.deepcopy.go
#                                           next to the types, CRDs in controller/config/crd)
#   hack/tools/generate.sh OBJ_DIR CRD_DIR  write into these directories instead
#                                           (used by controller/api/v1/generate_test.go)
#
# CONTROLLER_GEN may name an already built controller-gen binary.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

gen="${CONTROLLER_GEN:-$root/.cache/tools/controller-gen}"
if [[ -z "${CONTROLLER_GEN:-}" ]]; then
	# Cheap when current: go build keeps the binary if its build ID matches.
	mkdir -p "$(dirname "$gen")"
	GOWORK=off GOFLAGS=-mod=readonly go build -C hack/tools -o "$gen" sigs.k8s.io/controller-tools/cmd/controller-gen
fi

paths="paths=./controller/api/..."
if [[ $# -eq 0 ]]; then
	"$gen" object crd "$paths" output:crd:artifacts:config=controller/config/crd
elif [[ $# -eq 2 ]]; then
	mkdir -p "$1" "$2"
	"$gen" object crd "$paths" "output:object:dir=$1" "output:crd:dir=$2"
else
	echo "usage: $0 [OBJ_DIR CRD_DIR]" >&2
	exit 2
fi
