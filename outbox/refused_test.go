// These tests talk to the real PostgreSQL server at 127.0.0.1:5432,
// database test (see outbox_test.go), and publish to the in-memory broker
// (adapters/mem). Each test works in a schema of its own, so that the
// package-level Enqueue, which always writes DefaultTable, writes where
// the test's relay reads.
package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/outbox"
)

// newSchemaPool returns a pool whose unqualified names resolve in a fresh
// schema, dropped after the test, with DefaultTable created in it.
func newSchemaPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	schema := randName("outbox_schema_")
	admin := newPool(tb)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := outbox.EnsureSchema(ctx, pool, ""); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// Issue 23, defect 5: the package-level Enqueue checks only what every
// backend requires, so a row the relay's backend refuses reaches the
// relay. It is parked alone, with the refusal, as never sent; the rows
// around it are sent, in the same pass.
func TestRelayParksOnlyTheRefusedRow(t *testing.T) {
	tests := []struct {
		name  string
		bad   dedupq.Message
		field string
	}{
		{name: "ID with a space", bad: dedupq.Message{ID: "order 2"}, field: "ID"},
		{name: "ID of 129 characters", bad: dedupq.Message{ID: strings.Repeat("x", 129)}, field: "ID"},
		{name: "reserved attribute", bad: dedupq.Message{ID: "order-2", Attributes: map[string]string{"dedupq-x": "v"}}, field: "Attributes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			pool := newSchemaPool(t)
			clk := clock.NewFake(time.Now())
			broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute, Clock: clk})
			var parked []*outbox.ParkedError
			r := newRelay(t, pool, newPublisher(t, broker.Topic("q")), outbox.Options{Clock: clk,
				OnParked: func(p *outbox.ParkedError) { parked = append(parked, p) }})
			bad := tt.bad
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return outbox.Enqueue(ctx, tx, &dedupq.Message{ID: "order-1"}, &bad, &dedupq.Message{ID: "order-3"})
			}); err != nil {
				t.Fatalf("Enqueue: %v (it checks only what every backend requires)", err)
			}
			// Passes a minute apart: long enough for a row that failed
			// to be older than ResendFor (about 44s here) at its next claim.
			for pass := 0; pass < 5; pass++ {
				n, err := r.RunOnce(ctx)
				if err != nil {
					t.Logf("pass %d: %v", pass, err)
				}
				if n == 0 {
					break
				}
				clk.Advance(time.Minute)
			}
			s := broker.Stats("q")
			pending, nParked := status(t, pool, "")
			if s.Published != 2 || r.Stats().Sent != 2 || pending != 0 || nParked != 1 || len(parked) != 1 {
				t.Fatalf("stored %d, sent %d, pending %d, parked %d (%v); want order-1 and order-3 stored and sent, the refused row parked alone",
					s.Published, r.Stats().Sent, pending, nParked, parked)
			}
			p := parked[0]
			var ve *dedupq.ValidationError
			if p.MessageID != bad.ID || !errors.Is(p, dedupq.ErrInvalidMessage) || !errors.As(p, &ve) || ve.Field != tt.field {
				t.Fatalf("parked %q: %v; want the refused row, wrapping its *dedupq.ValidationError on %s", p.MessageID, p, tt.field)
			}
			msg := p.Error()
			for _, want := range []string{"never sent", "refuses", tt.field} {
				if !strings.Contains(msg, want) {
					t.Errorf("report %q lacks %q", msg, want)
				}
			}
			if strings.Contains(msg, "may or may not") {
				t.Errorf("report %q says a row that never reached the broker may have been stored", msg)
			}
			var reason string
			if err := pool.QueryRow(ctx, `SELECT park_reason FROM dedupq_outbox WHERE parked_at IS NOT NULL`).Scan(&reason); err != nil || reason != msg {
				t.Fatalf("park_reason %q (%v), want the report", reason, err)
			}
		})
	}
}
