package engine

import "testing"

func TestBootID(t *testing.T) {
	a, err := NewBootID()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBootID()
	if err != nil {
		t.Fatal(err)
	}
	if a == b || len(a) != 32 {
		t.Errorf("boot ids %q, %q: want two different ids of 32 digits", a, b)
	}
	for _, tt := range []struct {
		id   string
		want bool
	}{
		{a, true},
		{"0123456789abcdef", true}, // written by the iptables backend before NewBootID
		{"0123456789ABCDEF", false},
		{"0123456789abcde", false},
		{"", false},
		{a + "0", false},
		{"0123456789abcdef\n", false},
	} {
		if got := ValidBootID(tt.id); got != tt.want {
			t.Errorf("ValidBootID(%q) = %v, want %v", tt.id, got, tt.want)
		}
	}
}
