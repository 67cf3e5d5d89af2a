package main

// Runs the program against the local PostgreSQL (127.0.0.1:5432, database
// test) in a schema of its own, first on the search path and dropped
// afterwards, and checks what it wrote:
// one charge per order although the in-memory broker delivered each twice,
// one refund although it was asked for twice. Skipped outside CI when
// PostgreSQL is unreachable; failed under CI.

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/examples/internal/need"
)

func TestRun(t *testing.T) {
	need.Service(t, "PostgreSQL", "127.0.0.1:5432")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := need.Suffix()
	queue, schema := "payments-"+id, "example_"+id
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the schema is dropped
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA `+schema+` CASCADE`); err != nil {
			t.Logf("dropping schema %s: %v", schema, err)
		}
	})

	if err := run(ctx, pool, queue); err != nil {
		t.Fatalf("run: %v", err)
	}

	s := mem.URLBroker(queue).Stats(queue)
	if s.Published != 4 || s.Deliveries < 2*s.Published {
		t.Errorf("the broker delivered %d messages %d times, want 4 messages each twice", s.Published, s.Deliveries)
	}
	rows, err := pool.Query(ctx, `SELECT order_id, amount FROM charges ORDER BY order_id, amount`)
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
	err = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgstore.DefaultTable+` WHERE completed`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 { // 4 orders, the refund, the receipt
		t.Errorf("%d completed dedup records, want 6", n)
	}
}
