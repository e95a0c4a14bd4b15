package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	// Point is the mount point, its octal escapes (\040 for a space)
	// decoded.
	Point string
	// FSType is the file system type ("cgroup2", "nsfs", "proc", ...).
	FSType string
}

// Mounts returns the mounts of this process's mount namespace
// (/proc/self/mountinfo), in its order.
func Mounts() ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	ms, err := parseMountinfo(string(b))
	if err != nil {
		return nil, fmt.Errorf("/proc/self/mountinfo: %w", err)
	}
	return ms, nil
}

// parseMountinfo reads mountinfo lines: "id parent major:minor root
// mountpoint options [optional fields...] - fstype source superoptions".
func parseMountinfo(s string) ([]Mount, error) {
	var out []Mount
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if len(f) < 5 || sep < 0 || sep+1 >= len(f) {
			return nil, fmt.Errorf("line %q: want \"id parent major:minor root mountpoint options ... - fstype ...\"", strings.TrimSpace(line))
		}
		out = append(out, Mount{Point: unescapeMount(f[4]), FSType: f[sep+1]})
	}
	return out, nil
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
