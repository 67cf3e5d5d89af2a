// The example runs an embedded nats-server in the process: no services.
package kvstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/kvstore"
)

// A store in a JetStream key-value bucket, checked at startup, behind a
// Guard. The bucket gives each record a TTL of its own (nats-server 2.11 or
// later); on an older server, use kvstore.ExpiryInValue and a bucket max age
// of at least the Guard's TTL.
func Example() {
	ctx := context.Background()
	url, stop, err := embedded.Run(ctx, "") // or your servers' URL
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	opts := kvstore.Options{Bucket: "billing-dedup", Namespace: "billing"}
	if err := kvstore.EnsureBucket(ctx, js, kvstore.BucketConfig(opts, 0)); err != nil {
		log.Fatal(err)
	}
	store, err := kvstore.New(js, opts)
	if err != nil {
		log.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	// dedupq.NewConsumer calls this through ConsumerOptions.Dedup.
	if err := guard.Check(ctx); err != nil {
		log.Fatal(err)
	}

	// What the Guard does per delivery, by hand.
	c, err := store.Claim(ctx, "order-42", "fp", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first delivery:", c.State)
	if err := store.Complete(ctx, "order-42", c.Token, guard.TTL(), []byte("charged")); err != nil {
		log.Fatal(err)
	}
	c, err = store.Claim(ctx, "order-42", "fp", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("redelivery: %s (%s)\n", c.State, c.Result)
	fmt.Println("KV key:", store.Key("order-42"))
	// Output:
	// first delivery: acquired
	// redelivery: completed (charged)
	// KV key: billing.b3JkZXItNDI
}
