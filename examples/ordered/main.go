// Command ordered publishes the orders of three customers, each customer's
// in its own ordering group (Message.GroupKey), and consumes them with
// ConsumerOptions.Ordered: a customer's orders are handled one at a time,
// in the order they were published, while different customers run side by
// side. The code does not change between brokers; only the URL in
// DEDUPQ_URL does:
//
//	go run ./examples/ordered                       # mem://orders?window=2m&ack_wait=30s&max_deliveries=5, in memory
//	DEDUPQ_URL='sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566&create=true' go run ./examples/ordered
//	DEDUPQ_URL='jetstream://embedded/ORDERS?subject=orders&durable=ordered&create=true&max_deliveries=5' go run ./examples/ordered
//
// The SQS run needs fauxqs (see examples/anybroker's doc). On a broker
// whose consumer cannot keep a group's order yet (JetStream, Pub/Sub,
// Service Bus), Ordered makes the consumer refuse to start, naming why,
// instead of running a customer's orders at once: the program prints the
// refusal and stops.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	// Runs the server jetstream://embedded/… names, in this process.
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	_ "github.com/dedupq/dedupq/adapters/mem" // registers mem://
	_ "github.com/dedupq/dedupq/adapters/sqs" // registers sqs://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// defaultURL is an in-memory queue with a 2-minute dedup window and at
// most 5 deliveries of a message 30s apart.
const defaultURL = "mem://orders?window=2m&ack_wait=30s&max_deliveries=5"

const (
	customers = 3
	perGroup  = 5
)

func main() {
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Stdout, os.Getenv("DEDUPQ_URL"))
	if serr := embedded.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer, rawURL string) error {
	if rawURL == "" {
		rawURL = defaultURL
	}
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		return err
	}
	// The consumer first: Ordered refuses a broker that cannot keep the
	// order, before anything is sent.
	con, err := dedupq.OpenConsumer(ctx, rawURL, dedupq.ConsumerOptions{
		Ordered: true, Concurrency: 8, Dedup: guard,
		PublisherSpan: window.DefaultRetryPolicy().Span(),
	})
	if errors.Is(err, dedupq.ErrOrderingUnsupported) {
		fmt.Fprintf(out, "refused: %v\n", err)
		return nil
	}
	if err != nil {
		return err
	}
	defer con.Close(context.Background())
	pub, err := dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{ConsumerDedupTTL: time.Hour})
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())

	// Customer c's orders c-1 … c-5, interleaved across customers.
	var msgs []*dedupq.Message
	for n := 1; n <= perGroup; n++ {
		for c := 1; c <= customers; c++ {
			msgs = append(msgs, &dedupq.Message{
				ID: fmt.Sprintf("customer-%d-order-%d", c, n), Body: []byte(strconv.Itoa(n)),
				GroupKey: fmt.Sprintf("customer-%d", c),
			})
		}
	}
	if _, err := pub.PublishBatch(ctx, msgs); err != nil {
		return err
	}

	var mu sync.Mutex
	handled := map[string][]string{} // customer → order numbers, as handled
	done := make(chan struct{})
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	go func() {
		<-done
		stop()
	}()
	total := 0
	err = con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled[d.Message.GroupKey] = append(handled[d.Message.GroupKey], string(d.Message.Body))
		if total++; total == len(msgs) {
			close(done)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if total < len(msgs) {
		return fmt.Errorf("%d of %d orders handled in 30s", total, len(msgs))
	}
	for c := 1; c <= customers; c++ {
		key := fmt.Sprintf("customer-%d", c)
		fmt.Fprintf(out, "%s: orders %s\n", key, strings.Join(handled[key], " "))
	}
	return nil
}
