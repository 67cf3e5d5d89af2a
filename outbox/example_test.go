package outbox_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/outbox"
)

// An order and its message commit in one transaction; a relay publishes
// the message. Example needs PostgreSQL, so it has no Output comment (an
// example cannot skip); TestExample runs it and checks what it prints.
func Example() {
	if err := relayDemo(context.Background(), "postgres://postgres@127.0.0.1:5432/test", "orders_outbox", os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func relayDemo(ctx context.Context, dsn, table string, out io.Writer) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := outbox.EnsureSchema(ctx, pool, table); err != nil {
		return err
	}
	broker := mem.NewBroker(mem.Options{DedupWindow: 5 * time.Minute})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{})
	if err != nil {
		return err
	}
	defer pub.Close(ctx)
	relay, err := outbox.NewRelay(pool, pub, outbox.Options{Table: table})
	if err != nil {
		return err // the relay's resend span does not fit the window
	}
	fmt.Fprintf(out, "relay span %s: declare it as ConsumerOptions.PublisherSpan\n", relay.Span())

	// The business write and the message commit together, or neither does.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ... through tx ...
		return relay.Enqueue(ctx, tx, &dedupq.Message{ID: "order-42", GroupKey: "customer-7", Body: []byte(`{"total":10}`)})
	})
	if err != nil {
		return err
	}
	pending, _, _, err := outbox.TableStatus(ctx, pool, table)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "pending before the relay: %d\n", pending)

	// Run would do this on every NOTIFY until its context ends.
	if _, err := relay.RunOnce(ctx); err != nil {
		return err
	}
	pending, parked, _, err := outbox.TableStatus(ctx, pool, table)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "pending %d, parked %d, stored on the broker %d\n", pending, parked, broker.Stats("orders").Stored)
	return nil
}

func TestExample(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	var got strings.Builder
	if err := relayDemo(context.Background(), dsn(), table, &got); err != nil {
		t.Fatal(err)
	}
	want := `relay span 4m0s: declare it as ConsumerOptions.PublisherSpan
pending before the relay: 1
pending 0, parked 0, stored on the broker 1
`
	if got.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got.String(), want)
	}
}
