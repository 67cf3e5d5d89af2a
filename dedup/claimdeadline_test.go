// The Guard's claim bounded by the delivery's claim deadline, over the
// in-memory store (wrapped to answer slowly): no services.
package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// lateClaims is a store whose claims answer only when their ctx ends, as a
// store that is slow, not down, does.
type lateClaims struct {
	dedup.Store
	calls atomic.Int32
}

func (s *lateClaims) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	s.calls.Add(1)
	<-ctx.Done()
	return dedup.Claim{}, ctx.Err()
}

// A claim is made only before the delivery's claim deadline, and one the
// store has not answered by then is abandoned: the effect never starts
// after it (issue 23's model: a delivery claims within its deadline, or
// not at all). The error matches dedupq.ErrUnavailable, so the Consumer,
// past the deadline, nacks the delivery.
func TestClaimBoundedByTheClaimDeadline(t *testing.T) {
	for _, tt := range []struct {
		name     string
		deadline time.Duration // from now; 0: no deadline
		slow     bool
		ran      bool
		calls    int32
	}{
		{"no deadline", 0, false, true, 0},
		{"within the deadline", time.Minute, false, true, 0},
		{"a slow store answers after the deadline", 50 * time.Millisecond, true, false, 1},
		{"the deadline has passed: no claim at all", -time.Second, true, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			slow := &lateClaims{Store: memstore.New(nil)}
			var store dedup.Store = memstore.New(nil)
			if tt.slow {
				store = slow
			}
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			d := &dedupq.Delivery{Message: dedupq.Message{ID: "k", Body: []byte("b")}, Attempt: 1, Lease: time.Minute}
			if tt.deadline != 0 {
				d.ClaimDeadline = time.Now().Add(tt.deadline)
			}
			ran := false
			err = g.Wrap(func(context.Context, *dedupq.Delivery) error { ran = true; return nil })(context.Background(), d)
			if ran != tt.ran {
				t.Fatalf("handler ran %v, want %v (err %v)", ran, tt.ran, err)
			}
			if !tt.ran && !errors.Is(err, dedupq.ErrUnavailable) {
				t.Errorf("err = %v, want one matching dedupq.ErrUnavailable", err)
			}
			if got := slow.calls.Load(); got != tt.calls {
				t.Errorf("%d claims asked of the store, want %d", got, tt.calls)
			}
		})
	}
}
