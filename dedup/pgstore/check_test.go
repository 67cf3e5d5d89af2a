// Readiness check and empty-key tests. They talk to the real PostgreSQL
// server (see connect: skipped without it unless CI is set), each on tables
// with random names, to a closed port on loopback that nothing listens on,
// and to the in-process mem broker for the consumer's startup.
package pgstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

func newPGStore(t *testing.T, pool pgstore.DB, table string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(pool, pgstore.Options{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dropAtCleanup drops table when t ends.
func dropAtCleanup(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
}

func TestCheck(t *testing.T) {
	pool := connect(t, 4)
	ctx := context.Background()
	tests := []struct {
		name   string
		create string // SQL creating the table, %s its name; "" for none
		want   []string
	}{
		{"missing table", "", []string{"does not exist", "pgstore.EnsureSchema", "pgstore.Migration"}},
		{"table of another shape", "CREATE TABLE %s (namespace text, key integer, PRIMARY KEY (namespace, key))",
			[]string{"column key is integer, want text", "column token is missing", "pgstore.EnsureSchema"}},
		{"no unique key", `CREATE TABLE %s (namespace text NOT NULL, key text NOT NULL, token text NOT NULL,
			fingerprint text NOT NULL, completed boolean NOT NULL DEFAULT false, locked_until timestamptz,
			expires_at timestamptz NOT NULL, result bytea)`, []string{"no primary key or unique index on (namespace, key)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := randomName("dedupq_check_")
			dropAtCleanup(t, pool, table)
			if tt.create != "" {
				if _, err := pool.Exec(ctx, strings.ReplaceAll(tt.create, "%s", table)); err != nil {
					t.Fatal(err)
				}
			}
			err := newPGStore(t, pool, table).Check(ctx)
			if err == nil {
				t.Fatal("Check passed")
			}
			if errors.Is(err, dedup.ErrStoreUnavailable) {
				t.Errorf("Check = %v: a database that answers is not unavailable", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check = %v\nwant it to say %q", err, w)
				}
			}
		})
	}
	t.Run("EnsureSchema's table is ready", func(t *testing.T) {
		table := newTable(t, pool)
		if err := newPGStore(t, pool, table).Check(ctx); err != nil {
			t.Fatalf("Check = %v", err)
		}
	})
	t.Run("schema-qualified table", func(t *testing.T) {
		schema := randomName("dedupq_schema_")
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
		table := schema + ".keys"
		s := newPGStore(t, pool, table)
		if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), `"`+table+`"`) {
			t.Fatalf("Check before EnsureSchema = %v; want it to name %q", err, table)
		}
		if err := pgstore.EnsureSchema(ctx, pool, table); err != nil {
			t.Fatal(err)
		}
		if err := s.Check(ctx); err != nil {
			t.Fatalf("Check after EnsureSchema = %v", err)
		}
	})
}

func TestCheckUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/test?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg) // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	err = newPGStore(t, pool, "").Check(context.Background())
	if !errors.Is(err, dedup.ErrStoreUnavailable) || !strings.Contains(err.Error(), "cannot reach PostgreSQL") {
		t.Fatalf("Check on a closed port = %v; want ErrStoreUnavailable saying PostgreSQL cannot be reached", err)
	}
}

// TestConsumerStartupFailsOnMissingTable: a consumer whose dedup table was
// never created fails at startup, through the Guard and through TxGuard,
// with an error naming EnsureSchema, instead of failing its first claim.
func TestConsumerStartupFailsOnMissingTable(t *testing.T) {
	pool := connect(t, 4)
	table := randomName("dedupq_missing_")
	s := newPGStore(t, pool, table)
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: s, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	txGuard, err := pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b := mem.NewBroker(mem.Options{MaxDeliveries: 5})
	for _, tt := range []struct {
		name  string
		dedup dedupq.Deduplicator
	}{{"Guard", guard}, {"TxGuard", txGuard}} {
		t.Run(tt.name, func(t *testing.T) {
			sub := b.Subscription("orders")
			defer sub.Close()
			con, err := dedupq.NewConsumer(context.Background(), sub, dedupq.ConsumerOptions{Dedup: tt.dedup})
			if err == nil {
				con.Close(context.Background())
				t.Fatal("the consumer started on a missing dedup table")
			}
			if !errors.Is(err, dedup.ErrNotReady) || !strings.Contains(err.Error(), "pgstore.EnsureSchema") || !strings.Contains(err.Error(), table) {
				t.Fatalf("err = %v; want ErrNotReady naming the table and pgstore.EnsureSchema", err)
			}
			t.Log(err)
		})
	}
}

func TestEmptyKeyRefused(t *testing.T) {
	pool := connect(t, 4)
	table := newTable(t, pool)
	s := newPGStore(t, pool, table)
	ctx := context.Background()
	runs := 0
	fn := func(context.Context, pgx.Tx) ([]byte, error) { runs++; return nil, nil }
	if _, err := s.Do(ctx, "", "fp", time.Hour, fn); !errors.Is(err, dedup.ErrEmptyKey) {
		t.Errorf(`Do("") = %v; want ErrEmptyKey`, err)
	}
	g, err := pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { runs++; return nil })
	for _, body := range []string{"a", "b"} {
		err := h(ctx, &dedupq.Delivery{Message: dedupq.Message{Body: []byte(body)}, Attempt: 1, BackendID: "7"})
		if !errors.Is(err, dedup.ErrEmptyKey) || dedupq.IsPermanent(err) {
			t.Errorf("TxGuard on a delivery without an ID: err = %v; want a nack matching ErrEmptyKey", err)
		}
	}
	if runs != 0 {
		t.Errorf("ran %d times without a key", runs)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil || n != 0 {
		t.Errorf("table holds %d rows (%v); an empty key must never be recorded", n, err)
	}
}
