//go:build goexperiment.jsonv2

package agentapi

import (
	jsonv2 "encoding/json/v2"
	"testing"
)

// BenchmarkSyncLine100kJSONv2 is BenchmarkSyncLine100k's comparison with
// encoding/json/v2 (experimental in this Go: GOEXPERIMENT=jsonv2), decoding
// as strictly as the agent does (unknown members refused).
func BenchmarkSyncLine100kJSONv2(b *testing.B) {
	req, line := syncRequest100k()
	b.Run("encode/json-v2", func(b *testing.B) {
		for b.Loop() {
			if _, err := jsonv2.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json-v2", func(b *testing.B) {
		for b.Loop() {
			var r Request
			if err := jsonv2.Unmarshal(line, &r, jsonv2.RejectUnknownMembers(true)); err != nil {
				b.Fatal(err)
			}
			if len(r.Objects) != len(req.Objects) {
				b.Fatalf("decoded %d objects, want %d", len(r.Objects), len(req.Objects))
			}
		}
	})
}
