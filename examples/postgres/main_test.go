package main

// Runs the program against the local PostgreSQL (127.0.0.1:5432, database
// test) with its own tables, dropped afterwards, and checks what it wrote:
// one charge per order although the in-memory broker delivered some twice,
// one refund although it was asked for twice. Skipped outside CI when
// PostgreSQL is unreachable; failed under CI.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/examples/internal/need"
)

func TestRun(t *testing.T) {
	need.Service(t, "PostgreSQL", "127.0.0.1:5432")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the tables are dropped
	id := need.Suffix()
	queue, charges, keys := "payments-"+id, "charges_"+id, "dedup_"+id
	t.Cleanup(func() {
		for _, table := range []string{charges, keys} {
			if _, err := pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize()); err != nil {
				t.Logf("dropping %s: %v", table, err)
			}
		}
	})

	if err := run(ctx, pool, queue, charges, keys); err != nil {
		t.Fatalf("run: %v", err)
	}

	s := mem.URLBroker(queue).Stats(queue)
	if s.Deliveries <= s.Published {
		t.Errorf("the broker delivered %d messages %d times: no duplicate delivery was tested", s.Published, s.Deliveries)
	}
	rows, err := pool.Query(ctx, `SELECT order_id, amount FROM `+pgx.Identifier{charges}.Sanitize()+` ORDER BY order_id, amount`)
	if err != nil {
		t.Fatal(err)
	}
	type charge struct {
		Order  string
		Amount int
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[charge])
	if err != nil {
		t.Fatal(err)
	}
	want := []charge{{"order-1", -10}, {"order-1", 10}, {"order-2", 20}, {"order-3", 30}, {"order-4", 40}}
	if len(got) != len(want) {
		t.Fatalf("charges %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("charges %v, want %v", got, want)
		}
	}
	// The Guard recorded the receipt as sent, with the charges and the refund.
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{keys}.Sanitize()+` WHERE completed`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 { // 4 orders, the refund, the receipt
		t.Errorf("%d completed dedup records, want 6", n)
	}
}
