package nat

import "testing"

// TestUIDBytes: uidOK admits exactly [A-Za-z0-9][A-Za-z0-9._:-]*, byte by
// byte at the first position and after it (every one of the 256), and no
// empty UID.
func TestUIDBytes(t *testing.T) {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	if uidOK("") {
		t.Fatal("the empty UID is admitted")
	}
	for i := range 256 {
		c := byte(i)
		if got, want := uidOK(string([]byte{c})), alnum(c); got != want {
			t.Errorf("UID %q: admitted %v, want %v", c, got, want)
		}
		if got, want := uidOK(string([]byte{'a', c, 'z'})), alnum(c) || c == '.' || c == '_' || c == ':' || c == '-'; got != want {
			t.Errorf("UID %q: admitted %v, want %v", "a"+string(c)+"z", got, want)
		}
	}
	for _, uid := range []string{"0b9d8c6e-4f5a-4e2b-9c1d-7a6b5c4d3e2f", "fip.dnat_x:1-2", "A"} {
		if err := ValidateUID(uid); err != nil {
			t.Errorf("ValidateUID(%q): %v", uid, err)
		}
	}
	for _, uid := range []string{"-a", "a b", "a\"", "a/b", "é"} {
		if err := ValidateUID(uid); err == nil {
			t.Errorf("ValidateUID(%q) admitted", uid)
		}
	}
}
