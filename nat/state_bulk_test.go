package nat

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// insertEach is the reference NewStateOf must equal: Insert one by one
// into an empty State.
func insertEach(objs []Object) (*State, error) {
	s := NewState()
	for i, o := range objs {
		if err := s.Insert(o); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
	}
	return s, nil
}

// TestNewStateOf: the bulk construction gives the State, or the error
// naming the same object, field and holder, that inserting one by one
// gives, for every case of TestPlanApplyConflicts in both orders (base
// then batch, batch then base), for random subsets and orders of all
// their objects (most of them conflict somewhere), for invalid objects
// and duplicated UIDs; and a refused State's indexes are not what it
// returns (nil).
func TestNewStateOf(t *testing.T) {
	check := func(t *testing.T, objs []Object) (conflict bool) {
		t.Helper()
		want, wantErr := insertEach(objs)
		got, err := NewStateOf(objs)
		if fmt.Sprint(err) != fmt.Sprint(wantErr) {
			t.Fatalf("NewStateOf(%v): %v, Insert one by one: %v", UIDs(objs), err, wantErr)
		}
		if err != nil {
			if got != nil {
				t.Fatalf("NewStateOf(%v) returned a State with its error %v", UIDs(objs), err)
			}
			return true
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("NewStateOf(%v): the State (indexes included) differs from Insert one by one:\n%+v\nwant\n%+v", UIDs(objs), got, want)
		}
		return false
	}
	base := conflictBase()
	var pool []Object
	pool = append(pool, base...)
	for _, tc := range conflictCases() {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(append([]Object{}, base...), tc.objs...)
			check(t, objs)
			check(t, append(append([]Object{}, tc.objs...), base...))
		})
		pool = append(pool, tc.objs...)
	}
	t.Run("invalid and duplicated", func(t *testing.T) {
		bad := fip("bad", "192.0.2.77", "10.0.0.77")
		bad.UID = "" // invalid
		for _, objs := range [][]Object{
			append(append([]Object{}, base...), bad),
			append([]Object{bad}, base...),
			append(append([]Object{}, base...), base[3]),
			append(append([]Object{}, base...), fip("f1", "192.0.2.99", "10.0.0.99")),
		} {
			if !check(t, objs) {
				t.Fatalf("NewStateOf(%v) accepted", UIDs(objs))
			}
		}
	})
	t.Run("random", func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 25))
		accepted, refused := 0, 0
		for range 3000 {
			objs := make([]Object, 0, 12)
			for _, i := range r.Perm(len(pool))[:2+r.IntN(10)] {
				objs = append(objs, pool[i])
			}
			if check(t, objs) {
				refused++
			} else {
				accepted++
			}
		}
		if accepted < 100 || refused < 100 {
			t.Fatalf("random sets: %d accepted, %d refused: the draw covers too little of one side", accepted, refused)
		}
	})
}
