// Command servicebus publishes orders to an Azure Service Bus queue and
// consumes them through a dedup guard, opened by URL. The connection
// string comes from the environment, never from the URL:
//
//	export SERVICEBUS_CONNECTION_STRING='Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…'
//	go run ./examples/servicebus 'servicebus://myns.servicebus.windows.net/orders'
//
// The queue needs duplicate detection on, or the publisher's retries are
// refused at startup. Its properties (window, lock duration, maximum
// delivery count) are read through the management API, which needs Manage
// rights; without them, or on an emulator, state them in the URL, as in
// ?window=10m&ack_wait=1m&max_deliveries=10.
//
// An order that no redelivery can make right is dead-lettered: the
// handler returns it wrapped in dedupq.Permanent.
//
// Each order carries its customer as GroupKey (the SessionId), so the
// program runs unchanged on a session queue (RequiresSession; sessions=true
// with window states one), where a customer's orders are handled one at a
// time in the order sent, by one consumer at a time.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/servicebus" // registers servicebus://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: servicebus QUEUE_URL")
	}
	if err := run(context.Background(), os.Args[1]); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, queueURL string) error {
	pub, err := dedupq.OpenPublisher(ctx, queueURL, dedupq.PublisherOptions{})
	if err != nil {
		return err
	}
	defer pub.Close(ctx)
	fmt.Println(pub.Window())
	orders := []struct{ id, body string }{
		{"order-1", `{"amount":10}`},
		{"order-2", `{"amount":`},    // malformed: it will be dead-lettered
		{"order-1", `{"amount":10}`}, // resent: duplicate detection drops it
	}
	for _, o := range orders {
		res, err := pub.Publish(ctx, &dedupq.Message{ID: o.id, GroupKey: "customer-7", Body: []byte(o.body)})
		if err != nil {
			return err
		}
		fmt.Printf("sent %s as MessageId, duplicate: %v\n", o.id, res.Duplicate)
	}

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		return err
	}
	con, err := dedupq.OpenConsumer(ctx, queueURL, dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		return err
	}
	defer con.Close(ctx)
	fmt.Println(con.Redelivery())

	ctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	settled := map[string]bool{}
	err = con.Run(ctx, func(ctx context.Context, d *dedupq.Delivery) error {
		if settled[d.Message.ID] = true; len(settled) == 2 {
			stop() // a service would keep consuming; this demo is done
		}
		var order struct{ Amount int }
		if err := json.Unmarshal(d.Message.Body, &order); err != nil {
			fmt.Printf("dead-lettering %s: %v\n", d.Message.ID, err)
			return dedupq.Permanent(err) // no redelivery can fix it
		}
		fmt.Printf("charging %s: %d\n", d.Message.ID, order.Amount)
		return nil
	})
	if err == nil && len(settled) != 2 {
		err = fmt.Errorf("%d of 2 orders arrived within 30s", len(settled))
	}
	return err
}
