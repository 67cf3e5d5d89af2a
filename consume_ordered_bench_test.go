//go:build unix

// Benchmark of ordered groups on the in-memory broker (adapters/mem): what
// running each GroupKey in order costs against the same work unordered,
// per message. No services:
//
//	go test -run '^$' -bench ConsumeOrderedMem -benchtime 50000x -count 5 .
//
// Issue 24's goals read two ratios of the same run: "groups-64" (64
// groups, Concurrency 64, Ordered) against "unordered" (Concurrency 64),
// and "hot-group" (every message in one group, Concurrency 64, Ordered)
// against "unordered-c1" (Concurrency 1): one group can go no faster than
// one handler at a time. "hot-group-c1" is the hot group at Concurrency 1:
// against "hot-group" it shows what asking ahead costs on a broker that
// withholds a group until its head is acked (mem): with free slots the
// receive loop asks while the group's one deliverable message is in
// flight, and that receive waits in the broker for the ack (BENCHMARKS.md,
// "Ordered groups").
package dedupq_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
)

func BenchmarkConsumeOrderedMem(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		groups      int // 0: no GroupKey
		concurrency int
	}{
		{"unordered", 0, 64},
		{"groups-64", 64, 64},
		{"unordered-c1", 0, 1},
		{"hot-group", 1, 64},
		{"hot-group-c1", 1, 1},
	} {
		b.Run(tc.name, func(b *testing.B) {
			broker := mem.NewBroker(mem.Options{DedupWindow: time.Hour, MaxDeliveries: 5})
			top := broker.Topic("q")
			body := make([]byte, 256)
			for i := 0; i < b.N; {
				batch := make([]*driver.Message, 0, top.MaxBatch())
				for ; i < b.N && len(batch) < cap(batch); i++ {
					m := &driver.Message{ID: "m" + strconv.Itoa(i), Body: body}
					if tc.groups > 0 {
						m.GroupKey = "g" + strconv.Itoa(i%tc.groups)
					}
					batch = append(batch, m)
				}
				if _, err := top.SendBatch(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			consumeN(b, broker.Subscription("q"),
				dedupq.ConsumerOptions{Concurrency: tc.concurrency, Ordered: tc.groups > 0}, 0)
		})
	}
}
