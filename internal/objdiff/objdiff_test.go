package objdiff

import (
	"reflect"
	"testing"
)

func TestFlattenDiffDrop(t *testing.T) {
	a := map[string]any{
		"metadata": map[string]any{"name": "x", "uid": "1", "annotations": map[string]any{"ovn.kubernetes.io/a": "v"}},
		"spec":     map[string]any{"list": []any{map[string]any{"k": 1}, "s"}, "empty": map[string]any{}, "none": []any{}},
	}
	b := map[string]any{
		"metadata": map[string]any{"name": "x", "uid": "2", "annotations": map[string]any{"ovn.kubernetes.io/a": "w"}},
		"spec":     map[string]any{"list": []any{map[string]any{"k": 1}}, "empty": map[string]any{}, "extra": true},
	}
	fa, err := Flatten(a)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := Flatten(b)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		drop []string
		want []Difference
	}{
		{"all", nil, []Difference{
			{`metadata.annotations["ovn.kubernetes.io/a"]`, `"v"`, `"w"`},
			{"metadata.uid", `"1"`, `"2"`},
			{"spec.extra", "", "true"},
			{"spec.list[1]", `"s"`, ""},
			{"spec.none", "[]", ""},
		}},
		{"dropped", []string{"metadata.uid", "metadata.annotations", "spec.list", "spec.none", "spec.extra"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ca, cb := copyMap(fa), copyMap(fb)
			Drop(ca, tc.drop...)
			Drop(cb, tc.drop...)
			if got := Diff(ca, cb); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Diff = %v, want %v", got, tc.want)
			}
		})
	}
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
