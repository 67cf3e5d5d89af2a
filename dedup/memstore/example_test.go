// Runnable example of a consumer behind a Guard over the in-memory store,
// on the in-memory broker: no services.
package memstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// The broker hands every delivery out twice; the guard runs the handler
// for the first copy and acks the second without running it.
func Example() {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute, AckWait: 30 * time.Second, MaxDeliveries: 5, Faults: mem.Faults{DuplicateDelivery: 1}})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", Body: []byte("10")}); err != nil {
		log.Fatal(err)
	}

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		log.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			fmt.Println("charging", d.Message.ID)
			return nil
		})
	}()
	// The demo is done when both copies are settled.
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s := guard.Stats(); s.Ran+s.Suppressed < 2; s = guard.Stats() {
		select {
		case <-tick.C:
		case <-wait.Done():
			log.Fatalf("after 10s: %+v", s)
		}
	}
	stop()
	s := guard.Stats()
	fmt.Println(<-done, broker.Stats("orders").Deliveries, s.Ran, s.Suppressed)
	// Output:
	// charging order-1
	// <nil> 2 1 1
}
