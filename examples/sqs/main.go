// Command sqs publishes orders to an Amazon SQS FIFO queue and consumes
// them through a dedup guard, building dedupq's SQS driver from an AWS SDK
// client (a sqs:// URL does the same from the default credentials):
//
//	go run ./examples/sqs https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo
//
// The queue must be FIFO, and should have a dead-letter queue: its
// RedrivePolicy's maxReceiveCount bounds redelivery, which the guard's TTL
// must cover, or the consumer refuses to start. For an emulator, set
// AWS_ENDPOINT_URL_SQS.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: sqs QUEUE_URL")
	}
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(ctx, awssqs.NewFromConfig(cfg), os.Args[1]); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, client *awssqs.Client, queueURL string) error {
	// Every FIFO message needs a message group; orders without a GroupKey
	// go to "orders".
	opts := &sqs.Options{DefaultGroup: "orders"}
	topic, err := sqs.OpenTopic(ctx, client, queueURL, opts)
	if err != nil {
		return err
	}
	pub, err := dedupq.NewPublisher(ctx, topic, dedupq.PublisherOptions{})
	if err != nil {
		topic.Close()
		return err // the queue's 5-minute window is too short for the retry policy
	}
	defer pub.Close(ctx)
	fmt.Println(pub.Window())
	orders := []string{"order-1", "order-2"}
	for _, id := range append(orders, "order-1") { // order-1 resent
		res, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte(`{"amount":10}`)})
		if err != nil {
			return err
		}
		fmt.Printf("sent %s as MessageDeduplicationId, duplicate: %v\n", id, res.Duplicate)
	}

	sub, err := sqs.OpenSubscription(ctx, client, queueURL, opts)
	if err != nil {
		return err
	}
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		return err
	}
	con, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		sub.Close()
		return err // no dead-letter queue: redelivery is unbounded
	}
	defer con.Close(ctx)
	fmt.Println(con.Redelivery())

	ctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	handled := map[string]bool{}
	err = con.Run(ctx, func(ctx context.Context, d *dedupq.Delivery) error {
		fmt.Printf("charging %s (receive %d)\n", d.Message.ID, d.Attempt)
		if handled[d.Message.ID] = true; len(handled) == len(orders) {
			stop() // a service would keep consuming; this demo is done
		}
		return nil
	})
	if err == nil && len(handled) != len(orders) {
		err = fmt.Errorf("%d of %d orders arrived within 30s", len(handled), len(orders))
	}
	return err
}
