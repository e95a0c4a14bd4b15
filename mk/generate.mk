# Generated code: deepcopy functions (controller/api/v1/zz_generated.deepcopy.go)
# and CRD manifests (controller/config/crd/) by controller-gen, pinned in the
# nested module hack/tools/go.mod so the root go.mod stays untouched.
# controller/api/v1/generate_test.go fails when the committed output is stale.
#
#   make generate

.PHONY: generate
generate:
	hack/tools/generate.sh
