package embedded_test

// Runs against the nats-server that jetstream://embedded/… starts inside
// this process.

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// With package embedded imported, the host "embedded" names a JetStream
// server inside the process: a program runs with no services, and moves
// to a real server by changing the URL's host. The publisher closes
// before the consumer opens, which stops the server in between; the
// stream stays in its store, so the consumer gets every order, each once.
func Example() {
	ctx := context.Background()
	// Removes the server's temporary store when the program is done.
	defer embedded.Shutdown(ctx)
	const url = "jetstream://embedded/ORDERS?subject=orders&durable=billing&create=true&max_deliveries=5"

	pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"order-1", "order-2", "order-1"} { // order-1 resent
		res, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte(id)})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("published %s: stream sequence %s, duplicate %v\n", id, res.BackendID, res.Duplicate)
	}
	if err := pub.Close(ctx); err != nil {
		log.Fatal(err)
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
	fmt.Println(err, guard.Stats().Ran)
	// Output:
	// published order-1: stream sequence 1, duplicate false
	// published order-2: stream sequence 2, duplicate false
	// published order-1: stream sequence 1, duplicate true
	// 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s)
	// handling order-1
	// handling order-2
	// <nil> 2
}
