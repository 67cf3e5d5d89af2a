package jetstream_test

// Runnable examples against an embedded nats-server started in process.

import (
	"context"
	"fmt"
	"log"
	"net/url"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
)

// A publisher on a JetStream stream, opened from a URL: the second send of
// the same ID is dropped by the stream, and the window is read from it.
func Example() {
	ctx := context.Background()
	natsURL, stop, err := embedded.Run(ctx, "") // no service needed
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	cfg := jetstream.Config{Stream: "ORDERS", Subject: "orders", CreateStream: true}
	pub, err := dedupq.OpenPublisher(ctx, cfg.URL(natsURL), dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	fmt.Println(pub.Window())
	for range 2 {
		res, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", Body: []byte(`{"total":42}`)})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("stream sequence %s, duplicate %v\n", res.BackendID, res.Duplicate)
	}
	// Output:
	// jetstream dedup window 2m (configured on the entity, discovered from the broker, scope stream ORDERS)
	// stream sequence 1, duplicate false
	// stream sequence 1, duplicate true
}

func ExampleConfig_URL() {
	cfg := jetstream.Config{Stream: "ORDERS", Subject: "orders", Durable: "billing", CreateStream: true, MaxDeliver: 5}
	fmt.Println(cfg.URL("nats://127.0.0.1:4222"))
	// Output: jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=billing&create=true&max_deliveries=5
}

func ExampleParseURL() {
	u, _ := url.Parse("jetstream://127.0.0.1:4222/ORDERS?subject=orders&ack_wait=1m")
	server, cfg, err := jetstream.ParseURL(u)
	fmt.Println(server, cfg.Stream, cfg.Subject, cfg.AckWait, err)

	u, _ = url.Parse("jetstream://127.0.0.1:4222/ORDERS?subject=orders&ack_wait=soon")
	_, _, err = jetstream.ParseURL(u)
	fmt.Println(err)
	// Output:
	// nats://127.0.0.1:4222 ORDERS orders 1m0s <nil>
	// dedupq: URL "jetstream://127.0.0.1:4222/ORDERS?subject=orders&ack_wait=REDACTED": parameter "ack_wait": not a duration such as 30s or 2m
}
