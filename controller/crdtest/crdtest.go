// Package crdtest holds what natgw's tests need to run against Kube-OVN's
// own v1.16.2 CRDs (read from upstream's tree through internal/upstream,
// never copied): the CRD sets a test can install, the comparison that
// proves natgw's schemas a superset of upstream's, and objects with every
// field of upstream's schema set, to check that no write of natgw's drops
// one. For tests only.
package crdtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/internal/upstream"
)

// Set names a set of CRDs a test installs.
type Set string

// The CRD sets.
const (
	// Natgw is controller/config/crd.
	Natgw Set = "natgw"
	// Upstream is Kube-OVN v1.16.2's charts/kube-ovn-v2/crds/kube-ovn-crd.yaml
	// (every kubeovn.io CRD of the release), as a cluster with Kube-OVN has.
	Upstream Set = "upstream"
)

// Sets are both sets, natgw's first.
var Sets = []Set{Natgw, Upstream}

// Kinds are the kinds natgw-controller reads and writes.
var Kinds = []string{"VpcNatGateway", "IptablesEIP", "IptablesFIPRule", "IptablesDnatRule", "IptablesSnatRule", "QoSPolicy"}

// Path returns what envtest installs for set: natgw's directory, or
// upstream's CRD file in the module cache (downloaded through the Go module
// proxy when missing).
func Path(ctx context.Context, set Set, natgwDir string) (string, error) {
	switch set {
	case Natgw:
		return natgwDir, nil
	case Upstream:
		return upstream.Path(ctx, upstream.CRDs)
	}
	return "", fmt.Errorf("crdtest: CRD set %q: want %q or %q", set, Natgw, Upstream)
}

// Load reads the CRDs of a file or a directory of YAML files, by kind.
func Load(path string) (map[string]*apiextv1.CustomResourceDefinition, error) {
	files := []string{path}
	if st, err := os.Stat(path); err != nil {
		return nil, err
	} else if st.IsDir() {
		files, err = filepath.Glob(filepath.Join(path, "*.yaml"))
		if err != nil {
			return nil, err
		}
	}
	out := map[string]*apiextv1.CustomResourceDefinition{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if err != nil {
				break
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			crd := &apiextv1.CustomResourceDefinition{}
			if err := yaml.Unmarshal(doc, crd); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				continue
			}
			out[crd.Spec.Names.Kind] = crd
		}
	}
	return out, nil
}

// LoadSet loads one set's CRDs.
func LoadSet(ctx context.Context, set Set, natgwDir string) (map[string]*apiextv1.CustomResourceDefinition, error) {
	p, err := Path(ctx, set, natgwDir)
	if err != nil {
		return nil, err
	}
	return Load(p)
}

// Schema returns the v1 schema of crd (nil when it has none).
func Schema(crd *apiextv1.CustomResourceDefinition) *apiextv1.JSONSchemaProps {
	for _, v := range crd.Spec.Versions {
		if v.Name == "v1" && v.Schema != nil {
			return v.Schema.OpenAPIV3Schema
		}
	}
	return nil
}

// Superset lists how ours fails to be a superset of up (none: it is one):
// names, scope, the v1 version served and stored, its status subresource,
// printer columns, and, recursively, every property of up's schema present
// in ours with the same type and format, with nothing required in ours
// that up does not require. Value checks ours adds (patterns, CEL rules,
// lengths) are not differences here: they refuse malformed values only.
func Superset(up, ours *apiextv1.CustomResourceDefinition) []string {
	var d []string
	un, on := up.Spec.Names, ours.Spec.Names
	if un.Plural != on.Plural || un.Singular != on.Singular || un.Kind != on.Kind || un.ListKind != on.ListKind {
		d = append(d, fmt.Sprintf("names: upstream %+v, natgw %+v", un, on))
	}
	for _, s := range un.ShortNames {
		if !slices.Contains(on.ShortNames, s) {
			d = append(d, "short name "+s+" missing")
		}
	}
	if up.Spec.Group != ours.Spec.Group || up.Spec.Scope != ours.Spec.Scope {
		d = append(d, fmt.Sprintf("group/scope: upstream %s/%s, natgw %s/%s", up.Spec.Group, up.Spec.Scope, ours.Spec.Group, ours.Spec.Scope))
	}
	var uv, ov *apiextv1.CustomResourceDefinitionVersion
	for i := range up.Spec.Versions {
		if up.Spec.Versions[i].Name == "v1" {
			uv = &up.Spec.Versions[i]
		}
	}
	for i := range ours.Spec.Versions {
		if ours.Spec.Versions[i].Name == "v1" {
			ov = &ours.Spec.Versions[i]
		}
	}
	if uv == nil || ov == nil {
		return append(d, "no v1 version")
	}
	if ov.Served != uv.Served || ov.Storage != uv.Storage {
		d = append(d, "v1 served/storage differ")
	}
	if (uv.Subresources != nil && uv.Subresources.Status != nil) != (ov.Subresources != nil && ov.Subresources.Status != nil) {
		d = append(d, "status subresource differs")
	}
	for _, c := range uv.AdditionalPrinterColumns {
		if !slices.ContainsFunc(ov.AdditionalPrinterColumns, func(o apiextv1.CustomResourceColumnDefinition) bool {
			return o.Name == c.Name && o.JSONPath == c.JSONPath && o.Type == c.Type
		}) {
			d = append(d, fmt.Sprintf("printer column %s (%s %s) missing", c.Name, c.Type, c.JSONPath))
		}
	}
	return append(d, schemaSuperset("", uv.Schema.OpenAPIV3Schema, ov.Schema.OpenAPIV3Schema)...)
}

func schemaSuperset(path string, up, ours *apiextv1.JSONSchemaProps) []string {
	if up == nil {
		return nil
	}
	if ours == nil {
		return []string{path + ": missing"}
	}
	var d []string
	if up.Type != ours.Type && !(up.XIntOrString && ours.XIntOrString) {
		d = append(d, fmt.Sprintf("%s: type %q, natgw %q", orRoot(path), up.Type, ours.Type))
	}
	if up.Format != ours.Format && up.Format != "" && !compatibleFormat(up.Format, ours.Format) {
		d = append(d, fmt.Sprintf("%s: format %q, natgw %q", orRoot(path), up.Format, ours.Format))
	}
	if up.XPreserveUnknownFields != nil && *up.XPreserveUnknownFields && (ours.XPreserveUnknownFields == nil || !*ours.XPreserveUnknownFields) {
		d = append(d, orRoot(path)+": upstream preserves unknown fields, natgw does not")
	}
	if ours.Default != nil && up.Default == nil {
		d = append(d, fmt.Sprintf("%s: natgw defaults it to %s, upstream does not", orRoot(path), ours.Default.Raw))
	}
	for _, r := range ours.Required {
		if !slices.Contains(up.Required, r) && !strings.HasPrefix(path, ".metadata") {
			d = append(d, fmt.Sprintf("%s: natgw requires %s, upstream does not", orRoot(path), r))
		}
	}
	for _, k := range sortedKeys(up.Properties) {
		u := up.Properties[k]
		o, ok := ours.Properties[k]
		if !ok {
			d = append(d, path+"."+k+": missing")
			continue
		}
		d = append(d, schemaSuperset(path+"."+k, &u, &o)...)
	}
	if up.Items != nil && up.Items.Schema != nil {
		var oi *apiextv1.JSONSchemaProps
		if ours.Items != nil {
			oi = ours.Items.Schema
		}
		d = append(d, schemaSuperset(path+"[]", up.Items.Schema, oi)...)
	}
	if up.AdditionalProperties != nil && up.AdditionalProperties.Schema != nil {
		var oa *apiextv1.JSONSchemaProps
		if ours.AdditionalProperties != nil {
			oa = ours.AdditionalProperties.Schema
		}
		d = append(d, schemaSuperset(path+"{}", up.AdditionalProperties.Schema, oa)...)
	}
	return d
}

// compatibleFormat: an integer format natgw widens accepts upstream's.
func compatibleFormat(up, ours string) bool {
	return up == "int32" && (ours == "int64" || ours == "")
}

func orRoot(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Values give the value of a leaf at a path (".spec.v4ip", lists as "[]",
// map values as "{}"); ok false leaves it to Fill's defaults.
type Values func(path string) (v any, ok bool)

// Fill returns a value for schema with every property set, recursively:
// strings "x-<name>", integers 1, booleans true, date-times a fixed time,
// one element per list and one key per map; vals overrides any path
// (returning a whole subtree stops the recursion there).
func Fill(schema *apiextv1.JSONSchemaProps, vals Values) any {
	return fill("", schema, vals)
}

func fill(path string, s *apiextv1.JSONSchemaProps, vals Values) any {
	if vals != nil {
		if v, ok := vals(path); ok {
			return v
		}
	}
	switch {
	case s.XIntOrString:
		return "1"
	case s.Type == "object" || len(s.Properties) > 0:
		m := map[string]any{}
		for k, p := range s.Properties {
			if path == "" && (k == "metadata" || k == "apiVersion" || k == "kind") {
				continue
			}
			m[k] = fill(path+"."+k, &p, vals)
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			m["key1"] = fill(path+"{}", s.AdditionalProperties.Schema, vals)
		}
		return m
	case s.Type == "array":
		if s.Items == nil || s.Items.Schema == nil {
			return []any{}
		}
		return []any{fill(path+"[]", s.Items.Schema, vals)}
	case s.Type == "integer", s.Type == "number":
		return int64(1)
	case s.Type == "boolean":
		return true
	case s.Format == "date-time":
		return "2026-01-02T03:04:05Z"
	}
	name := path[strings.LastIndexAny(path, ".[{")+1:]
	return "x-" + strings.Trim(name, "]}")
}

// Object returns an object of kind with every field of its schema in crd
// set (Fill), named name.
func Object(crd *apiextv1.CustomResourceDefinition, name string, vals Values) *unstructured.Unstructured {
	m := Fill(Schema(crd), vals).(map[string]any)
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion(crd.Spec.Group + "/v1")
	u.SetKind(crd.Spec.Names.Kind)
	u.SetName(name)
	return u
}

// Leaves flattens v into path → leaf value (paths as Fill's, with list
// indexes "[i]" and map keys "{k}").
func Leaves(v any) map[string]any {
	out := map[string]any{}
	leaves("", v, out)
	return out
}

func leaves(path string, v any, out map[string]any) {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			out[path] = "{}"
		}
		for k, e := range x {
			leaves(path+"."+k, e, out)
		}
	case []any:
		if len(x) == 0 {
			out[path] = "[]"
		}
		for i, e := range x {
			leaves(fmt.Sprintf("%s[%d]", path, i), e, out)
		}
	default:
		out[path] = v
	}
}

// valid are well-formed values for the leaves whose values natgw's CRDs
// check (IPs, ports, enums), by path; Valid serves them.
var valid = map[string]any{
	".spec.v4ip":                              "172.18.0.10",
	".spec.v6ip":                              "2001:db8::10",
	".spec.macAddress":                        "00:00:5e:00:53:01",
	".spec.internalIp":                        "10.0.1.5",
	".spec.internalCIDR":                      "10.0.1.0/24",
	".spec.externalPort":                      "8080",
	".spec.internalPort":                      "80",
	".spec.protocol":                          "tcp",
	".spec.lanIp":                             "10.0.1.254",
	".spec.routes[].cidr":                     "10.2.0.0/16",
	".spec.routes[].nextHopIP":                "10.0.1.1",
	".spec.bindingType":                       "EIP",
	".spec.bandwidthLimitRules[].direction":   "ingress",
	".spec.bandwidthLimitRules[].matchType":   "ip",
	".spec.bandwidthLimitRules[].matchValue":  "10.0.1.5",
	".spec.bandwidthLimitRules[].rateMax":     "10",
	".spec.bandwidthLimitRules[].burstMax":    "1",
	".status.bindingType":                     "EIP",
	".status.bandwidthLimitRules[].direction": "ingress",
	".status.bandwidthLimitRules[].matchType": "ip",
	".status.bandwidthLimitRules[].rateMax":   "10",
	".status.bandwidthLimitRules[].burstMax":  "1",
	".spec.bgpSpeaker.holdTime":               "1m0s",
	".status.v4ip":                            "172.18.0.10",
	".status.ip":                              "172.18.0.10",
}

// Valid returns well-formed values where natgw's CRDs check values, and
// leaves the rest to Fill. With it, an object of upstream's schema passes
// natgw's CRDs too.
func Valid(path string) (any, bool) {
	v, ok := valid[path]
	return v, ok
}

// With returns Values that answers from m first, then from next.
func With(m map[string]any, next Values) Values {
	return func(p string) (any, bool) {
		if v, ok := m[p]; ok {
			return v, true
		}
		if next != nil {
			return next(p)
		}
		return nil, false
	}
}

// DiffLeaves lists the leaves of want missing or different in got (values
// compared as their JSON-ish text, so int64(1) and float64(1) agree).
func DiffLeaves(want, got map[string]any) []string {
	var d []string
	for _, k := range sortedKeys(want) {
		g, ok := got[k]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("%s: %v dropped", k, want[k]))
		case fmt.Sprint(g) != fmt.Sprint(want[k]):
			d = append(d, fmt.Sprintf("%s: %v became %v", k, want[k], g))
		}
	}
	return d
}
