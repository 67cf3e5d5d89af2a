// Talks to: the in-memory broker only, on a fake clock; no services.
package mem_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
)

// BenchmarkConsumeBacklog publishes a backlog of n messages, then consumes
// all of it through the driver's Receive (batches of 64) and Ack, as the
// bench program's raw mem consume side does, and reports the consume's
// cost per message (ns/msg; the publish is not timed). Issue 25 asks that
// a 1M backlog cost no more per message than a 10k one.
//
// "fifo" messages carry no group key. "groups=8" spread them round-robin
// over 8 group keys, so that a Receive finds at most 8 deliverable heads
// and every later message of a group waits behind its in-flight head: the
// shape in which a broker that scans its backlog per Receive goes
// quadratic.
//
// Every iteration checks that exactly n distinct messages were delivered
// once and acked, and that the broker holds nothing after.
func BenchmarkConsumeBacklog(b *testing.B) {
	for _, shape := range []struct {
		name   string
		groups int
	}{{"fifo", 0}, {"groups=8", 8}} {
		for _, n := range []int{10_000, 100_000, 1_000_000} {
			b.Run(fmt.Sprintf("%s/backlog=%s", shape.name, count(n)), func(b *testing.B) {
				consumeBacklog(b, n, shape.groups)
			})
		}
	}
}

func count(n int) string {
	switch {
	case n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func consumeBacklog(b *testing.B, n, groups int) {
	ctx := context.Background()
	body := []byte("0123456789abcdef")
	msgs := make([]driver.Message, n)
	for i := range msgs {
		msgs[i] = driver.Message{ID: "m" + strconv.Itoa(i), Body: body}
		if groups > 0 {
			msgs[i].GroupKey = "g" + strconv.Itoa(i%groups)
		}
	}
	seen := make([]bool, n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		br := mem.NewBroker(mem.Options{Clock: clock.NewFake(epoch), MaxDeliveries: 5})
		top, sub := br.Topic(q), br.Subscription(q)
		batch := make([]*driver.Message, 0, mem.MaxBatch)
		for i := 0; i < n; {
			batch = batch[:0]
			for ; i < n && len(batch) < cap(batch); i++ {
				batch = append(batch, &msgs[i])
			}
			if _, err := top.SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		clear(seen)
		b.StartTimer()

		for done := 0; done < n; {
			ds, err := sub.Receive(ctx, 64)
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range ds {
				if err := sub.Ack(ctx, d); err != nil {
					b.Fatal(err)
				}
				i, err := strconv.Atoi(d.Message.ID[1:])
				if err != nil || seen[i] || d.Attempt != 1 {
					b.Fatalf("delivery %s#%d: a duplicate or a redelivery", d.Message.ID, d.Attempt)
				}
				seen[i] = true
				done++
			}
		}

		b.StopTimer()
		if s := br.Stats(q); s.Acked != n || s.Deliveries != n || s.Stored != 0 || s.Ready != 0 {
			b.Fatalf("after consuming %d: Stats %+v", n, s)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/msg")
}
