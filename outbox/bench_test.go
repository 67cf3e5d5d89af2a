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
// with enqueuing them (one or 100 per transaction) and relaying them in
// batches of 100, on the in-memory broker so that the outbox's own cost shows.
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
	for _, perTx := range []int{1, 100} {
		b.Run(fmt.Sprintf("outbox/%d-per-tx", perTx), func(b *testing.B) {
			table := newTable(b, pool)
			broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
			r := newRelay(b, pool, newPublisher(b, broker.Topic("q")), outbox.Options{Table: table})
			var batch []*dedupq.Message
			flush := func() {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return r.Enqueue(ctx, tx, batch...) })
				if err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				batch = append(batch, &dedupq.Message{ID: fmt.Sprint(i), Body: []byte("x")})
				if len(batch) == perTx {
					flush()
				}
				if i%100 == 99 {
					drain(b, r)
				}
			}
			if len(batch) > 0 {
				flush()
			}
			drain(b, r)
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			if s := broker.Stats("q"); s.Published != b.N {
				b.Fatalf("stored %d of %d", s.Published, b.N)
			}
		})
	}
}
