package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/dedup"
)

// Claimed is the outcome of a claim that ClaimAsync made.
type Claimed struct {
	Claim dedup.Claim
	Err   error
}

// ClaimAsync claims key on s (fingerprint "fp", a minute's lease) on a
// goroutine of its own and delivers the outcome on the channel: for a test
// of a batching store that holds a claim's round trip back and acts while
// it is in flight.
func ClaimAsync(ctx context.Context, s dedup.Store, key string) <-chan Claimed {
	ch := make(chan Claimed, 1)
	go func() {
		c, err := s.Claim(ctx, key, "fp", time.Minute)
		ch <- Claimed{c, err}
	}()
	return ch
}

// Receive returns what ch delivers, failing t if nothing comes within 20
// seconds; what names the awaited thing in the failure.
func Receive[T any](t testing.TB, what string, ch <-chan T) T {
	t.Helper()
	timeout := time.NewTimer(20 * time.Second)
	defer timeout.Stop()
	select {
	case v := <-ch:
		return v
	case <-timeout.C:
		t.Fatalf("%s: nothing within 20s", what)
		var zero T
		return zero
	}
}
