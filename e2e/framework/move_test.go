package framework

import (
	"errors"
	"testing"
	"time"
)

func TestAnalyzeSwitch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(ms int, ns string, port uint16) Result { return Result{ServerNS: ns, ClientPort: port, At: at(ms)} }
	fail := func(ms int) Result { return Result{Err: errors.New("timeout"), At: at(ms)} }
	settled := at(100)
	tests := []struct {
		name    string
		rs      []Result
		want    Switch
		wantErr bool
	}{
		{"clean", []Result{ok(0, "a", 1), ok(10, "a", 2), ok(20, "b", 3), ok(200, "b", 4)},
			Switch{Probes: 4, Before: 2, After: 2}, false},
		{"one cut in flight", []Result{ok(0, "a", 1), fail(10), ok(20, "b", 3)},
			Switch{Probes: 3, Before: 1, After: 1, Cut: 1}, false},
		{"failure after settled", []Result{ok(0, "a", 1), ok(20, "b", 3), fail(150)},
			Switch{Probes: 3, Before: 1, After: 1, Failed: 1}, true},
		{"old answers a fresh tuple", []Result{ok(0, "a", 1), ok(20, "b", 3), ok(30, "a", 4)},
			Switch{Probes: 3, Before: 1, After: 1, Back: 1}, true},
		{"old answers a reused tuple before settled", []Result{ok(0, "a", 1), ok(20, "b", 3), ok(30, "a", 1)},
			Switch{Probes: 3, Before: 1, After: 1, SameTuple: 1}, false},
		{"old answers a reused tuple after settled", []Result{ok(0, "a", 1), ok(20, "b", 3), ok(130, "a", 1)},
			Switch{Probes: 3, Before: 1, After: 1, Back: 1}, true},
		{"someone else", []Result{ok(0, "a", 1), ok(20, "c", 3), ok(30, "b", 4)},
			Switch{Probes: 3, Before: 1, After: 1, Other: 1}, true},
		{"never moved", []Result{ok(0, "a", 1), ok(200, "a", 2)},
			Switch{Probes: 2, Before: 2}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := AnalyzeSwitch(tc.rs, "a", "b", settled)
			if got.Probes != tc.want.Probes || got.Before != tc.want.Before || got.After != tc.want.After ||
				got.Failed != tc.want.Failed || got.Cut != tc.want.Cut || got.Back != tc.want.Back ||
				got.Other != tc.want.Other || got.SameTuple != tc.want.SameTuple {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if err := got.OK(); (err != nil) != tc.wantErr {
				t.Errorf("OK() = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
