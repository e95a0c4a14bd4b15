package v1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSetCondition(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	ready := func(status metav1.ConditionStatus, reason string, gen int64) Condition {
		return Condition{Type: ConditionReady, Status: status, Reason: reason, ObservedGeneration: gen}
	}
	tests := []struct {
		name               string
		have               []Condition
		set                Condition
		changed            bool
		transition, update metav1.Time
		others             int
	}{
		{"new", nil, ready("True", ReasonProgrammed, 1), true, t1, t1, 0},
		{"same", []Condition{{Type: ConditionReady, Status: "True", Reason: ReasonProgrammed, ObservedGeneration: 1, LastTransitionTime: t0, LastUpdateTime: t0}},
			ready("True", ReasonProgrammed, 1), false, t0, t0, 0},
		{"new generation keeps the transition time", []Condition{{Type: ConditionReady, Status: "True", Reason: ReasonProgrammed, ObservedGeneration: 1, LastTransitionTime: t0, LastUpdateTime: t0}},
			ready("True", ReasonProgrammed, 2), true, t0, t1, 0},
		{"status change moves both", []Condition{{Type: ConditionReady, Status: "True", Reason: ReasonProgrammed, ObservedGeneration: 1, LastTransitionTime: t0, LastUpdateTime: t0}},
			ready("False", ReasonEIPNotFound, 1), true, t1, t1, 0},
		{"other types stay", []Condition{{Type: "Validated", Status: "True"}}, ready("True", ReasonProgrammed, 1), true, t1, t1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conds := append([]Condition(nil), tc.have...)
			if got := SetCondition(&conds, tc.set, t1); got != tc.changed {
				t.Errorf("changed = %v, want %v", got, tc.changed)
			}
			c := FindCondition(conds, ConditionReady)
			if c == nil || c.Status != tc.set.Status || c.ObservedGeneration != tc.set.ObservedGeneration {
				t.Fatalf("Ready condition %+v", c)
			}
			if !c.LastTransitionTime.Equal(&tc.transition) || !c.LastUpdateTime.Equal(&tc.update) {
				t.Errorf("times transition %v update %v, want %v %v", c.LastTransitionTime, c.LastUpdateTime, tc.transition, tc.update)
			}
			if len(conds) != tc.others+1 {
				t.Errorf("%d conditions, want %d", len(conds), tc.others+1)
			}
		})
	}
}

func TestGatewayReady(t *testing.T) {
	tests := []struct {
		name, annotation string
		want             *Condition
	}{
		{"none", "", nil},
		{"bad JSON", "{", nil},
		{"ok", `{"status":"True","reason":"Programmed","observedGeneration":3}`, &Condition{Type: ConditionReady, Status: "True", Reason: ReasonProgrammed, ObservedGeneration: 3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := &VpcNatGateway{}
			if tc.annotation != "" {
				g.Annotations = map[string]string{ReadyAnnotation: tc.annotation}
			}
			got := GatewayReady(g)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Errorf("GatewayReady = %+v, want %+v", got, tc.want)
			}
			s, _ := SummaryOf(g)
			if tc.want != nil && s.ObservedGeneration != tc.want.ObservedGeneration {
				t.Errorf("summary generation %d", s.ObservedGeneration)
			}
		})
	}
}
