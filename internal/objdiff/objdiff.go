// Package objdiff compares API objects field by field: each object is
// flattened to its leaves (a JSON path such as
// spec.template.spec.containers[0].image and the leaf's JSON value), and
// two flattenings are compared path by path. Tests use it to compare an
// object upstream's controller made with natgw's (e2e/kubeovn) and a built
// object with the expected one (controller/provision).
package objdiff

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Flatten returns v's leaves by path. v is anything encoding/json encodes
// (a typed object, an apply configuration, map[string]any). Empty maps and
// lists are leaves ("{}", "[]") so that an empty affinity still counts.
func Flatten(v any) (map[string]string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("objdiff: encode: %w", err)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("objdiff: decode: %w", err)
	}
	out := map[string]string{}
	walk("", tree, out)
	return out, nil
}

func walk(path string, v any, out map[string]string) {
	switch t := v.(type) {
	case map[string]any:
		if len(t) == 0 {
			out[path] = "{}"
			return
		}
		for k, c := range t {
			var p string
			switch {
			case strings.ContainsAny(k, "./[]"):
				p = path + "[" + strconv.Quote(k) + "]" // a label or annotation key
			case path == "":
				p = k
			default:
				p = path + "." + k
			}
			walk(p, c, out)
		}
	case []any:
		if len(t) == 0 {
			out[path] = "[]"
			return
		}
		for i, c := range t {
			walk(fmt.Sprintf("%s[%d]", path, i), c, out)
		}
	default:
		b, _ := json.Marshal(t)
		out[path] = string(b)
	}
}

// Difference is one path whose leaves differ; A or B is "" where that side
// has no such leaf.
type Difference struct {
	Path, A, B string
}

func (d Difference) String() string {
	return fmt.Sprintf("%s: %s != %s", d.Path, orAbsent(d.A), orAbsent(d.B))
}

func orAbsent(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// Diff returns the paths where a and b differ, sorted by path.
func Diff(a, b map[string]string) []Difference {
	var out []Difference
	for p, va := range a {
		if vb := b[p]; vb != va {
			out = append(out, Difference{p, va, vb})
		}
	}
	for p, vb := range b {
		if _, ok := a[p]; !ok {
			out = append(out, Difference{p, "", vb})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Drop removes the paths under any of the prefixes (a prefix names a
// field: "metadata.uid" drops that leaf, "status" everything below it).
func Drop(m map[string]string, prefixes ...string) {
	for p := range m {
		for _, pre := range prefixes {
			if p == pre || strings.HasPrefix(p, pre+".") || strings.HasPrefix(p, pre+"[") {
				delete(m, p)
				break
			}
		}
	}
}

// Paths returns m's paths, sorted.
func Paths(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}
