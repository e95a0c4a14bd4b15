package testlog

import (
	"bytes"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/natgw/natgw/internal/syncbuf"
)

// TestNoLogAfterEnd: a goroutine that logs while its test ends and after
// (run with -race: testr alone races with the testing package here) neither
// races nor panics; its lines from after the end go to late.
func TestNoLogAfterEnd(t *testing.T) {
	var out syncbuf.Buffer
	late = &out
	defer func() { late = os.Stderr }()
	var wg sync.WaitGroup
	t.Run("inner", func(t *testing.T) {
		log := New(t, 0).WithName("agent").WithValues("gateway", "gw")
		log.Info("while the test runs")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				log.Info("line", "i", i)
			}
			log.Error(nil, "last")
		}()
	})
	wg.Wait()
	if !strings.Contains(out.String(), "TestNoLogAfterEnd/inner (ended) agent error: last gateway gw") {
		t.Errorf("the line logged after the end is not on the late output:\n%s", tail(out.String()))
	}
}

func tail(s string) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-5):], []byte("\n")))
}
