package repocheck

import (
	"maps"
	"slices"
	"testing"
)

func TestLayoutPaths(t *testing.T) {
	tests := []struct {
		name    string
		readme  string
		want    []string
		wantErr bool
	}{
		{name: "table", readme: "# natgw\n\n## Layout\n\nOne line a package.\n\n| path | what |\n|---|---|\n| `nat` | the model |\n| `nat/nftables` | the backend; see `nat/README.md` |\n| `controller/config`, `charts/x` | manifests |\n| `hack/`, `mk/` | tools |\n\nScope: `not/a/row`.\n",
			want: []string{"charts/x", "controller/config", "hack", "mk", "nat", "nat/nftables"}},
		{name: "next section ends it", readme: "## Layout\n\n| path | what |\n|---|---|\n| `a` | x |\n\n## Other\n\n| `b` | y |\n",
			want: []string{"a"}},
		{name: "a row without a path", readme: "## Layout\n\n| path | what |\n|---|---|\n| a | x |\n| `b` | y |\n",
			want: []string{"b"}},
		{name: "no section", readme: "# natgw\n\n## Packages\n\n| `a` | x |\n", wantErr: true},
		{name: "section without a table", readme: "## Layout\n\nSee the tree.\n", wantErr: true},
		{name: "table without paths", readme: "## Layout\n\n| path | what |\n|---|---|\n| nat | x |\n", wantErr: true},
		{name: "heading inside a line is not the section", readme: "text ## Layout\n| `a` | x |\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := layoutPaths(tc.readme)
			keys := slices.Sorted(maps.Keys(got))
			if (err != nil) != tc.wantErr || !slices.Equal(keys, tc.want) {
				t.Errorf("layoutPaths = %q, %v; want %q, error %v", keys, err, tc.want, tc.wantErr)
			}
		})
	}
}
