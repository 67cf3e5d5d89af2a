// Command postgres charges orders exactly once with PostgreSQL: pgstore's
// TxGuard runs each delivery's handler inside a transaction that also
// records the message ID as handled, so the charge and its dedup record
// commit together or not at all. A redelivery after the commit finds the
// ID and is acked without running; a crash before it rolls back both, and
// the redelivery charges as if for the first time. Do is the same path
// without a consumer, and a dedup.Guard over the same store covers
// effects outside the database.
//
// It needs PostgreSQL at 127.0.0.1:5432 (database test, trust auth). The
// broker is the in-memory one, set to deliver every message twice,
// so that no other service is needed.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem" // registers mem://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := run(ctx, pool, "payments"); err != nil {
		log.Fatal(err)
	}
}

// run consumes the mem:// queue named queue.
func run(ctx context.Context, pool *pgxpool.Pool, queue string) error {
	// The dedup table (pgstore.Migration has the SQL for your migrations)
	// and the table the handler writes its effect to.
	if err := pgstore.EnsureSchema(ctx, pool, pgstore.DefaultTable); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS charges (order_id text NOT NULL, amount int NOT NULL)`); err != nil {
		return err
	}
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		return err
	}
	// The TxGuard gives the handler a transaction that commits with the
	// message's dedup record.
	guard, err := pgstore.NewTxGuard(store, pgstore.TxGuardOptions{TTL: 24 * time.Hour})
	if err != nil {
		return err
	}
	charge := func(ctx context.Context, d *dedupq.Delivery) error {
		tx, err := pgstore.Tx(ctx) // pgstore.ErrNoTx unless the TxGuard runs this handler
		if err != nil {
			return err
		}
		// Never commit or roll back tx here: the TxGuard does, with the record.
		_, err = tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`, d.Message.ID, string(d.Message.Body))
		return err // an error rolls the charge back with the record, and nacks
	}

	// 1. Orders go through a queue that delivers every message twice, at once.
	queueURL := "mem://" + queue + "?window=2m&ack_wait=10s&max_deliveries=5&dup_delivery=1"
	pub, err := dedupq.OpenPublisher(ctx, queueURL, dedupq.PublisherOptions{})
	if err != nil {
		return err
	}
	defer pub.Close(ctx)
	for i := 1; i <= 4; i++ {
		msg := &dedupq.Message{ID: fmt.Sprintf("order-%d", i), Body: fmt.Appendf(nil, "%d", 10*i)}
		if _, err := pub.Publish(ctx, msg); err != nil {
			return err
		}
	}

	// 2. Consume through the TxGuard: each order is charged once,
	// however often it is delivered.
	con, err := dedupq.OpenConsumer(ctx, queueURL, dedupq.ConsumerOptions{Dedup: guard, Concurrency: 4})
	if err != nil {
		return err
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- con.Run(runCtx, charge) }()
	if err := drained(ctx, mem.URLBroker(queue), queue); err != nil {
		return err
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	stats := mem.URLBroker(queue).Stats(queue)
	fmt.Printf("the broker delivered %d messages %d times\n", stats.Published, stats.Deliveries)

	// 3. Do, for a request that carries its own idempotency key: a
	// refund asked for twice is made once, and the second call gets the
	// first one's result.
	for range 2 {
		out, err := store.Do(ctx, "refund-order-1", "amount=10", 24*time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ('order-1', -10)`)
			return []byte("refund #1"), err
		})
		if err != nil {
			return err
		}
		fmt.Printf("refund of order-1: ran %v, result %q\n", out.Ran, out.Result)
	}

	// 4. An effect outside the database (an email) cannot join the
	// transaction: a dedup.Guard on the same store claims the key, runs the
	// handler, then records the key as completed.
	receipts, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: 24 * time.Hour})
	if err != nil {
		return err
	}
	sendReceipt := receipts.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		fmt.Println("emailing the receipt for", d.Message.ID)
		return nil
	})
	for range 2 {
		if err := sendReceipt(ctx, &dedupq.Delivery{Message: dedupq.Message{ID: "receipt-order-1"}}); err != nil {
			return err
		}
	}

	rows, err := pool.Query(ctx, `SELECT order_id, count(*), sum(amount) FROM charges GROUP BY order_id ORDER BY order_id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n, sum int
		if err := rows.Scan(&id, &n, &sum); err != nil {
			return err
		}
		fmt.Printf("%s: %d row(s), balance %d\n", id, n, sum)
	}
	return rows.Err()
}

// drained waits until the broker has settled every message of the queue,
// duplicate deliveries included.
func drained(ctx context.Context, b *mem.Broker, queue string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for s := b.Stats(queue); s.Stored > 0 || s.Ready > 0; s = b.Stats(queue) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("%d message(s) still stored: %w", s.Stored, ctx.Err())
		}
	}
	return nil
}
