package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

// TestParse: flags before and after the verb (mk/cluster.mk passes
// -image after up), and the errors name what is wrong.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want command
		err  string
	}{
		{"flags before", []string{"-repo", "/r", "-image", "a.tar", "up"}, command{verb: "up", repo: "/r", images: []string{"a.tar"}}, ""},
		{"flags after (make cluster-up)", []string{"-repo", "/r", "up", "-image", "a.tar", "-image", "b.tar"}, command{verb: "up", repo: "/r", images: []string{"a.tar", "b.tar"}}, ""},
		{"flags on both sides", []string{"-image", "a.tar", "up", "-repo", "/r", "-image", "b.tar"}, command{verb: "up", repo: "/r", images: []string{"a.tar", "b.tar"}}, ""},
		{"down", []string{"-repo", "/r", "down"}, command{verb: "down", repo: "/r"}, ""},
		{"default repo", []string{"down"}, command{verb: "down", repo: "."}, ""},
		{"no verb", []string{"-repo", "/r"}, command{}, "want one command, got 0"},
		{"two verbs", []string{"up", "down"}, command{}, `want one command, got 2 ["up" "down"]`},
		{"unknown verb", []string{"start"}, command{}, `unknown command "start"`},
		{"unknown flag after verb", []string{"up", "-images", "a.tar"}, command{}, "-images"},
		{"image with down", []string{"down", "-image", "a.tar"}, command{}, `-image ["a.tar"]: only up imports images`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(tc.args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parse(%q) error %v, want one containing %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse(%q): %v", tc.args, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parse(%q) = %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
}
