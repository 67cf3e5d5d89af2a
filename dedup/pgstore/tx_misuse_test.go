// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test (override with DEDUPQ_PG_DSN), in tables with random names, like
// pgstore_test.go; without it they skip, unless CI is set, when they fail.
// The broker is the in-memory one (adapters/mem).
package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/mem" // registers mem://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

// A handler that asks for the TxGuard's transaction where no TxGuard runs
// it gets ErrNoTx, saying what to do, and writes nothing: the delivery is
// nacked and comes back, never acked as done without its dedup record.
// Ignoring the error does not get further: the nil transaction panics, and
// the Consumer nacks the panic too.
func TestTxOutsideTxGuard(t *testing.T) {
	pool := connect(t, 4)
	table, fx := newTable(t, pool), newEffects(t, pool)
	store := newStore(t, pool, pgstore.Options{Table: table})

	if _, err := pgstore.Tx(context.Background()); !errors.Is(err, pgstore.ErrNoTx) || !strings.Contains(err.Error(), "pgstore.TxGuard") {
		t.Fatalf("Tx outside a TxGuard: %v, want ErrNoTx naming the TxGuard", err)
	}

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	write := func(ctx context.Context, d *dedupq.Delivery) error {
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", d.Message.ID)
		return err
	}
	ignoreErr := func(ctx context.Context, d *dedupq.Delivery) error {
		tx, _ := pgstore.Tx(ctx)
		_, err := tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", d.Message.ID)
		return err
	}
	for _, tc := range []struct {
		name    string
		dedup   dedupq.Deduplicator // nil: none
		handler dedupq.Handler
		wantErr error // the first attempt's, when the handler returns one
	}{
		{"no deduplicator", nil, write, pgstore.ErrNoTx},
		{"dedup.Guard over pgstore", guard, write, pgstore.ErrNoTx},
		{"error ignored", nil, ignoreErr, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := "mem://" + randomName("misuse-") + "?window=2m&ack_wait=30s&max_deliveries=5"
			pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(ctx)
			id := randomName("order-")
			if _, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("pay 10")}); err != nil {
				t.Fatal(err)
			}
			con, err := dedupq.OpenConsumer(ctx, url, dedupq.ConsumerOptions{Dedup: tc.dedup})
			if err != nil {
				t.Fatal(err)
			}
			defer con.Close(t.Context())

			var mu sync.Mutex
			var attempts []int
			var firstErr error
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
				mu.Lock()
				attempts = append(attempts, d.Attempt)
				mu.Unlock()
				if d.Attempt >= 2 { // redelivered: the first was not acked
					stop()
					return nil
				}
				err := tc.handler(ctx, d)
				mu.Lock()
				firstErr = err
				mu.Unlock()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(attempts) < 2 || attempts[0] != 1 || attempts[len(attempts)-1] != 2 {
				t.Fatalf("attempts %v: want the first delivery nacked and redelivered", attempts)
			}
			if tc.wantErr != nil && !errors.Is(firstErr, tc.wantErr) {
				t.Errorf("the handler's error %v, want %v", firstErr, tc.wantErr)
			}
			if n := effects(t, pool, fx, id); n != 0 {
				t.Errorf("%d effects written outside a TxGuard, want none", n)
			}
		})
	}
}
