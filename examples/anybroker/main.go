// Command anybroker publishes a few orders and consumes them through
// dedupq's portable API, on whichever broker the URL in DEDUPQ_URL names.
// The code does not change between brokers; only the URL does:
//
//	go run ./examples/anybroker                      # mem://orders, in memory
//	DEDUPQ_URL='jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=anybroker&create=true&maxdeliver=5' go run ./examples/anybroker
//	DEDUPQ_URL='jetstream://embedded/ORDERS?subject=orders&durable=anybroker&create=true&maxdeliver=5' go run ./examples/anybroker
//	DEDUPQ_URL='sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566' go run ./examples/anybroker
//
// The host "embedded" starts a NATS server inside the process (package
// adapters/jetstream/embedded), so the JetStream run needs no service
// either.
//
// Each broker is linked in by importing its adapter package, the way
// database/sql drivers are. What the program does adapt to is what the
// broker guarantees: dedupq's startup check refuses a retry policy that
// outlives the broker's dedup window (mem:// without ?window= has none),
// and a consumer-side dedup store whose TTL does not cover the broker's
// redelivery (unbounded unless the URL bounds it). The program prints the
// refusal and falls back to what is safe, so the check can be seen at work.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	_ "github.com/dedupq/dedupq/adapters/mem" // registers mem://
	_ "github.com/dedupq/dedupq/adapters/sqs" // registers sqs://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

func main() {
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Getenv("DEDUPQ_URL")); err != nil {
		log.Fatal(err)
	}
}

// dedupTTL is how long the consumer remembers a handled order. A day is
// far beyond any broker's redelivery here, and what a payment provider's
// retries would need.
const dedupTTL = 24 * time.Hour

func run(ctx context.Context, rawURL string) error {
	if rawURL == "" {
		rawURL = "mem://orders"
	}
	rawURL, stopServer, err := startEmbedded(ctx, rawURL)
	if err != nil {
		return err
	}
	defer stopServer()
	fmt.Println("broker:", redact(rawURL))

	// The consumer opens first: whether its dedup guard is usable decides
	// how the publisher may retry.
	con, guard, err := openConsumer(ctx, rawURL, window.DefaultRetryPolicy().Span())
	if err != nil {
		return err
	}
	defer con.Close()
	pub, err := openPublisher(ctx, rawURL, guard != nil)
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	fmt.Println("window:", pub.Window())

	orders := []string{"order-1", "order-2", "order-3"}
	for _, id := range orders {
		res, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("payload of " + id), GroupKey: "eu"})
		if err != nil {
			return err
		}
		fmt.Printf("published %s as %s\n", id, res.BackendID)
	}
	// The application resends order-2, as it would after a crash between
	// sending and recording the send. Same ID: within the broker's window
	// the broker drops it; without one, the consumer's dedup must.
	res, err := pub.Publish(ctx, &dedupq.Message{ID: "order-2", Body: []byte("payload of order-2"), GroupKey: "eu"})
	if err != nil {
		return err
	}
	fmt.Printf("resent order-2: duplicate dropped by the broker: %v\n", res.Duplicate)

	var mu sync.Mutex
	handled := map[string]int{}
	allDone := make(chan struct{})
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled[d.Message.ID]++
		fmt.Printf("handled %s (attempt %d, group %q)\n", d.Message.ID, d.Attempt, d.Message.GroupKey)
		if len(handled) == len(orders) {
			select {
			case <-allDone:
			default:
				close(allDone)
				// Every order was seen once: stop after the in-flight
				// deliveries settle. A duplicate that the broker stored
				// would be in line behind them.
				time.AfterFunc(500*time.Millisecond, cancel)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if runCtx.Err() != nil && ctx.Err() == nil && len(handled) < len(orders) {
		return errors.New("timed out before every order arrived")
	}
	ids := make([]string, 0, len(handled))
	for id := range handled {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Printf("effect of %s ran %d time(s)\n", id, handled[id])
	}
	if guard != nil {
		s := guard.Stats()
		fmt.Printf("dedup guard: ran %d, suppressed %d duplicate(s)\n", s.Ran, s.Suppressed)
	}
	return nil
}

// openPublisher asks for the default retry policy, which resends failed
// publishes for up to 51.5s. Where the broker's window does not cover that,
// it says why and falls back: to the consumer's dedup guard when there is
// one, else to no retries at all.
func openPublisher(ctx context.Context, rawURL string, consumerDedup bool) (*dedupq.Publisher, error) {
	pub, err := dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		return pub, err
	}
	fmt.Println("publisher check:", err)
	if consumerDedup {
		fmt.Printf("-> relying on the consumer's dedup guard (TTL %s) instead\n", dedupTTL)
		return dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{ConsumerDedupTTL: dedupTTL})
	}
	fmt.Println("-> publishing without retries: nothing would deduplicate them")
	return dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
}

// openConsumer runs the handler behind an in-memory dedup guard, if the
// broker bounds its redelivery so that the guard's TTL provably covers it;
// otherwise it says why and consumes without the guard.
func openConsumer(ctx context.Context, rawURL string, producerSpan time.Duration) (*dedupq.Consumer, *dedup.Guard, error) {
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: dedupTTL})
	if err != nil {
		return nil, nil, err
	}
	con, err := dedupq.OpenConsumer(ctx, rawURL, dedupq.ConsumerOptions{Dedup: guard, ProducerSpan: producerSpan, Concurrency: 4})
	if errors.Is(err, window.ErrUnsafeRetry) {
		fmt.Println("consumer check:", err)
		fmt.Println("-> consuming without the dedup guard")
		con, err = dedupq.OpenConsumer(ctx, rawURL, dedupq.ConsumerOptions{Concurrency: 4})
		return con, nil, err
	}
	return con, guard, err
}

// startEmbedded starts an in-process NATS server when the URL's host is
// "embedded" and points the URL at it.
func startEmbedded(ctx context.Context, rawURL string) (string, func(), error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "jetstream" || u.Hostname() != "embedded" {
		return rawURL, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "anybroker-*")
	if err != nil {
		return "", nil, err
	}
	serverURL, stop, err := embedded.Run(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	u.Host = strings.TrimPrefix(serverURL, "nats://")
	return u.String(), func() { stop(); os.RemoveAll(dir) }, nil
}

func redact(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return dedupq.RedactURL(u)
	}
	return "(a URL that does not parse)"
}
