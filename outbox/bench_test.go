package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/outbox"
)

// BenchmarkOutbox compares, in one run, publishing each message directly
// with enqueuing each in its own transaction and relaying them (batches of
// 100), on the in-memory broker so that the outbox's own cost shows.
func BenchmarkOutbox(b *testing.B) {
	pool := newPool(b)
	ctx := context.Background()
	b.Run("direct", func(b *testing.B) {
		broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
		pub := newPublisher(b, broker.Topic("q"))
		start := time.Now()
		for i := 0; b.Loop(); i++ {
			if _, err := pub.Publish(ctx, &dedupq.Message{ID: fmt.Sprint(i), Body: []byte("x")}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
	b.Run("outbox", func(b *testing.B) {
		table := newTable(b, pool)
		broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
		r := newRelay(b, pool, newPublisher(b, broker.Topic("q")), outbox.Options{Table: table})
		start := time.Now()
		for i := 0; b.Loop(); i++ {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				return r.Enqueue(ctx, tx, &dedupq.Message{ID: fmt.Sprint(i), Body: []byte("x")})
			})
			if err != nil {
				b.Fatal(err)
			}
			if i%100 == 99 {
				drain(b, r)
			}
		}
		drain(b, r)
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		if s := broker.Stats("q"); s.Published != b.N {
			b.Fatalf("stored %d of %d", s.Published, b.N)
		}
	})
}
