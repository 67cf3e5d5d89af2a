// Allocations of the consume path per delivery, against a driver whose
// ack waits on its context as a request/reply ack does (JetStream's
// DoubleAck): no services.
package dedupq

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/oteloff"
	"github.com/dedupq/dedupq/internal/testutil"
)

// waitingAckSub hands out prepared deliveries, up to max a receive, and
// acks by asking its context for Done, as a driver whose ack is a request
// does; it records nothing, so that what it allocates is the Consumer's.
type waitingAckSub struct {
	*chanSub
	ds []*driver.Delivery
}

func (s *waitingAckSub) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	if len(s.ds) == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	n := min(max, len(s.ds))
	out := s.ds[:n:n]
	s.ds = s.ds[n:]
	return out, nil
}

func (s *waitingAckSub) Ack(ctx context.Context, d *driver.Delivery) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	default:
		return nil
	}
}

// TestConsumeAllocationsWithWaitingAck: without Dedup, a delivery whose
// ack waits on its settle context costs the Consumer its settle context's
// done channel and its share of one block per receive (its handler's copy
// with the settle context). Before, that copy was an allocation of each
// delivery's own, and detaching the settle context from the handler's and
// arming a timer of its own for each (the timer, its closure) cost three
// more: 5.03 allocations per delivery, then 2.03 with the timers reused.
func TestConsumeAllocationsWithWaitingAck(t *testing.T) {
	testutil.SkipUnderRace(t, "the settles' timers come from a sync.Pool, which the race detector empties at random")
	const perRun = 2000
	runs := 3
	all := make([]driver.Delivery, (runs+1)*perRun)
	sub := &waitingAckSub{chanSub: newChanSub()}
	c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Concurrency: 8,
		// Telemetry off, so that what is counted is the consume path's.
		MeterProvider: oteloff.MeterProvider{}, TracerProvider: oteloff.TracerProvider{}})
	if err != nil {
		t.Fatal(err)
	}
	next := 0
	run := func() {
		sub.ds = sub.ds[:0]
		for range perRun {
			d := &all[next]
			next++
			d.Message.ID, d.Attempt = "m", 1
			sub.ds = append(sub.ds, d)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var handled atomic.Int64
		if err := c.Run(ctx, func(context.Context, *Delivery) error {
			if handled.Add(1) == perRun {
				cancel()
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	sub.ds = make([]*driver.Delivery, 0, perRun)
	perDelivery := testing.AllocsPerRun(runs, run) / perRun
	if got := c.Stats().Acked; got != uint64((runs+1)*perRun) {
		t.Fatalf("%d acked, want %d", got, (runs+1)*perRun)
	}
	// Receives of up to 8 (Concurrency) and Run's own setup (workers,
	// channels) spread over the deliveries: well under half an allocation.
	if perDelivery > 1.5 {
		t.Errorf("%.2f allocations per delivery, want 1 and a share of a block", perDelivery)
	}
	t.Logf("%.2f allocations per delivery", perDelivery)
}
