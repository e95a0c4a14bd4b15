package procfs

import (
	"slices"
	"testing"
)

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Mount
		wantErr bool
	}{
		{name: "optional fields", in: "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n" +
			"29 1 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n",
			want: []Mount{{Point: "/mnt/a b", FSType: "ext3"}, {Point: "/sys/fs/cgroup", FSType: "cgroup2"}}},
		{name: "no optional field", in: "5 1 0:4 net:[4026532] /run/netns/x rw - nsfs nsfs rw", want: []Mount{{Point: "/run/netns/x", FSType: "nsfs"}}},
		{name: "empty", in: "", want: nil},
		{name: "blank line skipped", in: "\n5 1 0:4 / /proc rw - proc proc rw\n", want: []Mount{{Point: "/proc", FSType: "proc"}}},
		{name: "no separator", in: "5 1 0:4 / /proc rw proc proc rw\n", wantErr: true},
		{name: "nothing after the separator", in: "5 1 0:4 / /proc rw -\n", wantErr: true},
		{name: "short", in: "5 1 0:4\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMountinfo(tc.in)
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Errorf("parseMountinfo = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/x":          "/var/lib/x",
		`/a\040b`:             "/a b",
		`/tab\011end\134x`:    "/tab\tend\\x",
		`/trailing\04`:        `/trailing\04`,
		`/ends\040`:           "/ends ",
		`/not\04x`:            `/not\04x`,
		`/var/lib/natgw\040c`: "/var/lib/natgw c",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestMountsSelf reads this process's mount table: it has / and /proc.
func TestMountsSelf(t *testing.T) {
	ms, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	var root, proc bool
	for _, m := range ms {
		root = root || m.Point == "/"
		proc = proc || (m.Point == "/proc" && m.FSType == "proc")
	}
	if !root || !proc {
		t.Errorf("mounts %q: want / and /proc (proc)", ms)
	}
}
