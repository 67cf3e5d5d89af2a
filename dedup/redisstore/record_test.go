package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
)

// TestRecordLayout pins the record's fixed-width header, which the Lua
// scripts read by byte offset, against its definition in fmt terms.
func TestRecordLayout(t *testing.T) {
	token := claimtoken.New("fp-ü")
	for _, tc := range []struct {
		name   string
		state  byte
		until  time.Time
		result []byte
	}{
		{"in progress", 'p', time.UnixMilli(1_790_000_000_123), nil},
		{"completed", 'c', time.Time{}, []byte("result")},
		{"large lease end", 'p', time.UnixMilli(1<<60 + 0xabc), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ms int64
			if !tc.until.IsZero() {
				ms = tc.until.UnixMilli()
			}
			want := fmt.Sprintf("%c%016x%s%08x%s%s", tc.state, ms, token[:claimtoken.RandLen], len("fp-ü"), "fp-ü", tc.result)
			if got := record(tc.state, tc.until, token, tc.result); got != want {
				t.Fatalf("record = %q, want %q", got, want)
			}
		})
	}
}
