package engine

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
)

// NewBootID returns a fresh random boot id: 32 lower-case hex digits. A
// backend stores it with its state when it creates that state, so a
// controller that sees a different boot id knows the gateway's state was
// made anew (pod replaced, table flushed) and syncs once.
func NewBootID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("boot id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// bootIDPattern also accepts the 16 digits the iptables backend wrote
// before both backends shared NewBootID, so such a gateway keeps its id.
var bootIDPattern = regexp.MustCompile(`^(?:[0-9a-f]{16}|[0-9a-f]{32})$`)

// ValidBootID reports whether s has the form NewBootID gives.
func ValidBootID(s string) bool { return bootIDPattern.MatchString(s) }
