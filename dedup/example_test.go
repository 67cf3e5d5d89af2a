// Runnable example of the Guard over the in-memory store: no services.
package dedup_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// A guarded handler runs once per dedup ID: a redelivery of a completed
// message is acked without running it, and a failed run leaves the key
// free so that the redelivery runs.
func ExampleGuard_Wrap() {
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		panic(err)
	}
	fail := true
	h := guard.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		if fail {
			fail = false
			return fmt.Errorf("database down")
		}
		fmt.Println("charging", d.Message.ID)
		return nil
	})
	d := &dedupq.Delivery{Message: dedupq.Message{ID: "order-42", Body: []byte(`{"amount":10}`)}}
	for attempt := 1; attempt <= 3; attempt++ {
		d.Attempt = attempt
		fmt.Printf("delivery %d: %v\n", attempt, h(context.Background(), d))
	}
	s := guard.Stats()
	fmt.Printf("ran=%d failed=%d suppressed=%d\n", s.Ran, s.Failed, s.Suppressed)
	// Output:
	// delivery 1: database down
	// charging order-42
	// delivery 2: <nil>
	// delivery 3: <nil>
	// ran=1 failed=1 suppressed=1
}
