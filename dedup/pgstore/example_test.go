// ExampleTx runs without a service. ExampleTxGuard needs PostgreSQL and a
// broker, so it has no Output comment: go test compiles it but does not
// run it, because an example cannot skip when the server is missing.
// examples/postgres runs the same pattern under test.
package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

// The handler writes its effect through the transaction the TxGuard opened
// for the delivery, so the effect and the delivery's dedup record commit
// together or not at all.
func ExampleTxGuard() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Options{})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := pgstore.NewTxGuard(store, pgstore.TxGuardOptions{TTL: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, d *dedupq.Delivery) error {
		tx, err := pgstore.Tx(ctx) // pgstore.ErrNoTx unless the TxGuard runs this handler
		if err != nil {
			return err
		}
		// Never commit or roll back tx here: the TxGuard does, with the
		// dedup record. Writing through pool instead would commit apart.
		_, err = tx.Exec(ctx, `INSERT INTO charges (order_id, amount) VALUES ($1, $2)`, d.Message.ID, string(d.Message.Body))
		return err // an error rolls the charge back with the record, and nacks
	}

	// The guard is the consumer's Dedup: it runs the handler inside
	// Store.Do. ORDERS_URL is the queue's URL, as in examples/anybroker.
	con, err := dedupq.OpenConsumer(ctx, os.Getenv("ORDERS_URL"), dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		log.Fatal(err)
	}
	defer con.Close(ctx)
	if err := con.Run(ctx, charge); err != nil {
		log.Fatal(err)
	}
}

// Outside a TxGuard or Store.Do there is no transaction, and Tx says so
// instead of letting the handler write apart from its dedup record.
func ExampleTx() {
	_, err := pgstore.Tx(context.Background())
	fmt.Println(errors.Is(err, pgstore.ErrNoTx))
	fmt.Println(err)
	// Output:
	// true
	// pgstore: no transaction in the context: the handler does not run under a pgstore.TxGuard (set one as dedupq.ConsumerOptions.Dedup, or call its Wrap) or inside Store.Do; writing through the pool instead would commit the effect apart from its dedup record
}
