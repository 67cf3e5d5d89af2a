// Command jetstream-redis publishes an order to a NATS JetStream stream and
// consumes it through a dedup guard that keeps its keys in Redis, so that
// the order takes effect once however often it is sent or delivered. It
// needs NATS with JetStream at 127.0.0.1:4222 and Redis at 127.0.0.1:6379.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
)

// queueURL names the stream ORDERS, created if missing with the server's
// 2-minute dedup window, and the durable consumer billing. max_deliveries
// bounds redelivery: the dedup guard's TTL must provably cover it.
const queueURL = "jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=billing&create=true&max_deliveries=5"

func main() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	orderID := fmt.Sprintf("order-%d", time.Now().UnixNano()) // your order's own ID
	if err := run(ctx, queueURL, rdb, orderID); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, queueURL string, rdb redis.UniversalClient, orderID string) error {
	// The default retry policy resends for up to 51.5s with the same ID,
	// inside the stream's window. One that could outlive the window fails
	// here with a *window.UnsafeRetryError naming the numbers and the fix.
	pub, err := dedupq.OpenPublisher(ctx, queueURL, dedupq.PublisherOptions{})
	if err != nil {
		return err
	}
	defer pub.Close(ctx)
	for range 2 { // the second send stands for a resend after a crash
		res, err := pub.Publish(ctx, &dedupq.Message{ID: orderID, Body: []byte(`{"amount":42}`)})
		if err != nil {
			return err
		}
		fmt.Printf("published %s, duplicate: %v\n", orderID, res.Duplicate)
	}

	// The guard runs the handler once per message ID, and remembers the
	// IDs it handled in Redis for a day.
	store, err := redisstore.New(rdb, redisstore.Options{Namespace: "billing"})
	if err != nil {
		return err
	}
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: 24 * time.Hour})
	if err != nil {
		return err
	}
	// Refused when the TTL does not cover the stream's redelivery, or
	// when Redis does not answer.
	con, err := dedupq.OpenConsumer(ctx, queueURL, dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		return err
	}
	defer con.Close(ctx)

	ctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	handled := false
	err = con.Run(ctx, func(ctx context.Context, d *dedupq.Delivery) error {
		fmt.Printf("charging %s: %s\n", d.Message.ID, d.Message.Body)
		if d.Message.ID == orderID {
			handled = true
			stop() // a service would keep consuming; this demo is done
		}
		return nil // nil acks, an error nacks, dedupq.Permanent(err) dead-letters
	})
	if err == nil && !handled {
		err = fmt.Errorf("%s was not delivered within 30s", orderID)
	}
	return err
}
