// Command anybroker publishes a few orders and consumes them through
// dedupq's portable API, on whichever broker the URL in DEDUPQ_URL names.
// The code does not change between brokers; only the URL does:
//
//	go run ./examples/anybroker                      # mem://orders?window=2m&ack_wait=30s&max_deliveries=5, in memory
//	DEDUPQ_URL='jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=anybroker&create=true&max_deliveries=5' go run ./examples/anybroker
//	DEDUPQ_URL='jetstream://embedded/ORDERS?subject=orders&durable=anybroker&create=true&max_deliveries=5' go run ./examples/anybroker
//	DEDUPQ_URL='sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566&create=true' go run ./examples/anybroker
//
// The host "embedded" names a NATS server inside the process: importing
// package adapters/jetstream/embedded is all it takes, so the JetStream
// run needs no service either. The SQS run needs an emulator on port 4566 and any credentials:
// fauxqs, started in another terminal with
//
//	npm ci --prefix localstack/fauxqs && npx --prefix localstack/fauxqs fauxqs
//
// and AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test here (or LocalStack,
// see localstack/README.md). create=true makes the FIFO queue orders.fifo,
// its dead-letter queue orders-dlq.fifo and the redrive policy (5
// deliveries of 30s) once the startup checks pass; it is refused for AWS's
// own endpoints, where queues are made with infrastructure as code.
//
// Each broker is linked in by importing its adapter package, the way
// database/sql drivers are. What the program does adapt to is what the
// broker guarantees. First it shows dedupq's startup check refusing a
// publisher that would keep retrying for an hour, longer than the broker's
// dedup window. Then it opens a consumer whose dedup guard's TTL must cover
// the broker's redelivery, and a publisher with the default retry policy,
// which must fit the window. Every URL above passes both checks, and the
// run ends with each order's effect having run once. A URL that fails
// them (mem://orders, with no window and unbounded redelivery) makes the
// program say why and fall back to what is safe, so the check can be seen
// at work.
//
// Run it twice within the window on a broker that outlives the process
// (the local NATS server): the second run's sends are reported as
// duplicates the broker already stored, and it has nothing new to consume.
// Not so on SQS, which does not tell a process that its send duplicated
// another's (see adapters/sqs): a second SQS run within 5 minutes waits
// for deliveries that never come and fails after 30s. Use another queue
// name, or wait 5 minutes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"slices"
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

// defaultURL is an in-memory queue with a 2-minute dedup window (a
// JetStream stream's default) and at most 5 deliveries of a message 30s
// apart, so that both startup checks pass.
const defaultURL = "mem://orders?window=2m&ack_wait=30s&max_deliveries=5"

func main() {
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Stdout, os.Getenv("DEDUPQ_URL"))
	// Removes the store of the server jetstream://embedded/… started, if
	// any; log.Fatal below would skip a deferred call.
	if serr := embedded.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if err != nil {
		log.Fatal(err)
	}
}

// dedupTTL is how long the consumer remembers a handled order. A day is
// far beyond any broker's redelivery here, and what a payment provider's
// retries would need.
const dedupTTL = 24 * time.Hour

// settleLimit bounds the wait for the deliveries of what was stored. They
// arrive within a second on every broker here; the limit only turns a
// broker that lost a message into an error instead of a hang.
const settleLimit = 30 * time.Second

// hourOfRetries is a publisher retry policy that resends for about an
// hour: longer than most brokers' dedup windows.
var hourOfRetries = window.RetryPolicy{MaxAttempts: 20, InitialBackoff: time.Second, MaxBackoff: 5 * time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}

func run(ctx context.Context, out io.Writer, rawURL string) error {
	if rawURL == "" {
		rawURL = defaultURL
	}
	fmt.Fprintln(out, "broker:", redact(rawURL))

	// 1. A publisher whose retries outlive the broker's window is refused
	// at startup, with the numbers and the fix.
	p, err := dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{Retry: &hourOfRetries})
	switch {
	case errors.Is(err, window.ErrUnsafeRetry):
		fmt.Fprintf(out, "1. startup check refused retries for %s:\n   %v\n", hourOfRetries.Span(), err)
	case err != nil:
		return err
	default:
		fmt.Fprintf(out, "1. startup check: the window %s covers retries for %s\n", p.Window(), hourOfRetries.Span())
		if err := p.Close(ctx); err != nil {
			return err
		}
	}

	// 2. The consumer opens first: whether its dedup guard is usable
	// decides how the publisher may retry.
	con, guard, err := openConsumer(ctx, out, rawURL, window.DefaultRetryPolicy().Span())
	if err != nil {
		return err
	}
	defer con.Close(ctx)
	pub, err := openPublisher(ctx, out, rawURL, guard != nil)
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	fmt.Fprintln(out, "window:", pub.Window())

	// 3. Publish. The application resends order-2, as it would after a
	// crash between sending and recording the send. Same ID: within the
	// broker's window the broker drops it; without one, the consumer's
	// dedup must. A send the broker drops stores nothing to consume.
	stored := 0
	for _, id := range []string{"order-1", "order-2", "order-3", "order-2"} {
		res, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("payload of " + id), GroupKey: "eu"})
		if err != nil {
			return err
		}
		if res.Duplicate {
			fmt.Fprintf(out, "published %s: duplicate (already stored), dropped by the broker\n", id)
			continue
		}
		stored++
		fmt.Fprintf(out, "published %s as %s\n", id, res.BackendID)
	}
	if stored == 0 {
		fmt.Fprintln(out, "nothing new was stored, so nothing to consume")
		return nil
	}

	// 4. Consume until every stored message has been settled: handled, or
	// acked by the guard as a duplicate of one handled before.
	var mu sync.Mutex
	handled := map[string]int{}
	runs := 0
	settled := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := runs
		if guard != nil {
			n += int(guard.Stats().Suppressed)
		}
		return n
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			handled[d.Message.ID]++
			runs++
			fmt.Fprintf(out, "handled %s (attempt %d, group %q)\n", d.Message.ID, d.Attempt, d.Message.GroupKey)
			return nil
		})
	}()
	limit := time.NewTimer(settleLimit)
	defer limit.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for settled() < stored {
		select {
		case <-tick.C:
		case <-limit.C:
			cancel()
			<-done
			return fmt.Errorf("after %s, %d of the %d stored message(s) were settled", settleLimit, settled(), stored)
		case <-ctx.Done():
			cancel()
			<-done
			return ctx.Err()
		case err := <-done:
			return fmt.Errorf("the consumer stopped early: %v", err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}

	mu.Lock()
	defer mu.Unlock()
	for _, id := range slices.Sorted(maps.Keys(handled)) {
		fmt.Fprintf(out, "effect of %s ran %d time(s)\n", id, handled[id])
	}
	if guard != nil {
		s := guard.Stats()
		fmt.Fprintf(out, "dedup guard: ran %d, suppressed %d duplicate(s)\n", s.Ran, s.Suppressed)
	}
	return nil
}

// openPublisher asks for the default retry policy, which resends failed
// publishes for up to 51.5s. Where the broker's window does not cover that,
// it says why and falls back: to the consumer's dedup guard when there is
// one, else to no retries at all.
func openPublisher(ctx context.Context, out io.Writer, rawURL string, consumerDedup bool) (*dedupq.Publisher, error) {
	pub, err := dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		if err == nil {
			fmt.Fprintf(out, "3. publisher check passed: retries for %s fit the window\n", pub.RetryPolicy().Span())
		}
		return pub, err
	}
	fmt.Fprintln(out, "3. publisher check refused the default retries:", err)
	if consumerDedup {
		fmt.Fprintf(out, "-> relying on the consumer's dedup guard (TTL %s) instead\n", dedupTTL)
		return dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{ConsumerDedupTTL: dedupTTL})
	}
	fmt.Fprintln(out, "-> publishing without retries: nothing would deduplicate them")
	return dedupq.OpenPublisher(ctx, rawURL, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
}

// openConsumer runs the handler behind an in-memory dedup guard, if the
// broker bounds its redelivery so that the guard's TTL provably covers it;
// otherwise it says why and consumes without the guard.
func openConsumer(ctx context.Context, out io.Writer, rawURL string, publisherSpan time.Duration) (*dedupq.Consumer, *dedup.Guard, error) {
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: dedupTTL})
	if err != nil {
		return nil, nil, err
	}
	con, err := dedupq.OpenConsumer(ctx, rawURL, dedupq.ConsumerOptions{Dedup: guard, PublisherSpan: publisherSpan, Concurrency: 4})
	if errors.Is(err, window.ErrUnsafeRetry) {
		fmt.Fprintln(out, "2. consumer check refused the dedup guard:", err)
		fmt.Fprintln(out, "-> consuming without the dedup guard")
		con, err = dedupq.OpenConsumer(ctx, rawURL, dedupq.ConsumerOptions{Concurrency: 4})
		return con, nil, err
	}
	if err == nil {
		fmt.Fprintf(out, "2. consumer check passed: the dedup TTL %s covers the redelivery %s\n", dedupTTL, con.Redelivery())
	}
	return con, guard, err
}

func redact(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return dedupq.RedactURL(u)
	}
	return "(a URL that does not parse)"
}
