// Runnable examples of opening publishers and consumers by URL, over the
// in-memory broker (mem://): no services.
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/mem" // registers mem://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// A URL names the backend and its entity; importing the adapter package
// registers its scheme. The same code runs on another broker with another
// URL.
func ExampleOpenPublisher() {
	ctx := context.Background()
	pub, err := dedupq.OpenPublisher(ctx, "mem://example-open-publisher?window=2m", dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	fmt.Println(pub.Window())
	for range 2 {
		res, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", Body: []byte(`{"amount":10}`)})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("stored as %s, duplicate %v\n", res.BackendID, res.Duplicate)
	}
	// Output:
	// mem dedup window 2m (configured on the entity, given by the program, scope queue example-open-publisher)
	// stored as 1, duplicate false
	// stored as 1, duplicate true
}

// A URL whose broker has no dedup window cannot protect retries: the
// publisher fails to open with a *window.UnsafeRetryError saying why, until
// it retries no more (or declares consumer-side dedup).
func ExampleOpenPublisher_refused() {
	ctx := context.Background()
	_, err := dedupq.OpenPublisher(ctx, "mem://example-no-window", dedupq.PublisherOptions{})
	fmt.Println(errors.Is(err, window.ErrUnsafeRetry))

	pub, err := dedupq.OpenPublisher(ctx, "mem://example-no-window", dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	fmt.Println(err)
	pub.Close(ctx)
	// Output:
	// true
	// <nil>
}

// A consumer opened by URL, behind a dedup guard. The URL bounds
// redelivery (max_deliveries), so that the guard's TTL provably covers it;
// without the bound OpenConsumer refuses the guard.
func ExampleOpenConsumer() {
	ctx := context.Background()
	const url = "mem://example-open-consumer?window=2m&ack_wait=30s&max_deliveries=5"
	pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	for _, id := range []string{"order-1", "order-2", "order-1"} { // order-1 resent
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte(id)}); err != nil {
			log.Fatal(err)
		}
	}

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	con, err := dedupq.OpenConsumer(ctx, url, dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		log.Fatal(err)
	}
	defer con.Close(ctx)
	fmt.Println(con.Redelivery())

	runCtx, stop := context.WithCancel(ctx)
	handled := 0
	err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
		fmt.Println("handling", d.Message.ID)
		if handled++; handled == 2 { // both stored orders
			stop()
		}
		return nil
	})
	fmt.Println(err)

	_, err = dedupq.OpenConsumer(ctx, "mem://example-unbounded", dedupq.ConsumerOptions{Dedup: guard})
	fmt.Println(errors.Is(err, window.ErrUnsafeRetry))
	// Output:
	// 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s)
	// handling order-1
	// handling order-2
	// <nil>
	// true
}

// Inspect answers whether a deployment is window-safe without opening a
// Publisher or a Consumer, and without creating anything on the broker:
// the dedupq command's check is built on it.
func ExampleInspect() {
	ctx := context.Background()
	in, err := dedupq.Inspect(ctx, "mem://example-inspect?window=1m&ack_wait=30s&max_deliveries=3", dedupq.InspectOptions{
		Publisher: dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 10, MaxBackoff: time.Minute}},
		DedupTTL:  time.Hour,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(in.URL)
	fmt.Println(in.Window)
	fmt.Println("publisher safe:", in.Publisher == nil)
	fmt.Println("consumer safe:", in.Consumer == nil)
	var unsafe *window.UnsafeRetryError
	if errors.As(in.Publisher, &unsafe) {
		fmt.Println("first fix:", unsafe.Fixes[0])
	}
	// Output:
	// mem://example-inspect?window=1m&ack_wait=30s&max_deliveries=3
	// mem dedup window 1m (configured on the entity, given by the program, scope queue example-inspect)
	// publisher safe: false
	// consumer safe: true
	// first fix: lower PublisherOptions.Retry.MaxAttempts from 10 to 4
}
