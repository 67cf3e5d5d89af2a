package adaptertest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// HeldNack is a subscription whose broker cannot delay a redelivery, so
// that the Consumer holds a nacked delivery for its delay
// (driver.NackHolder: Pub/Sub, Service Bus), with what NackHeld,
// NackHoldEndsWithRun and NackHoldLeftToClose need to drive it.
type HeldNack struct {
	Topic driver.Topic // publishes to Sub's entity
	Sub   driver.Subscription
	// Cap is the longest hold (MaxNackHold of a fresh delivery), which
	// Sub's Redelivery must report as the backoff before every
	// redelivery.
	Cap time.Duration
}

// seen is one handler call: its delivery and when it ran.
type seen struct {
	d  dedupq.Delivery
	at time.Time
}

// runHeld runs a Consumer on h.Sub whose handler asks, on a delivery's
// first attempt, for a redelivery after delay, and acks the next. It
// returns the deliveries as the handler sees them, a stop that ends the
// Run and returns how long that took, and the Consumer.
func runHeld(t *testing.T, h HeldNack, delay time.Duration) (<-chan seen, func() time.Duration, *dedupq.Consumer) {
	t.Helper()
	if _, ok := h.Sub.(driver.NackHolder); !ok {
		t.Fatalf("%T is not a driver.NackHolder", h.Sub)
	}
	c, err := dedupq.NewConsumer(t.Context(), h.Sub, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	calls := make(chan seen, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
			calls <- seen{*d, time.Now()}
			if d.Attempt == 1 {
				return dedupq.RetryAfter(errors.New("not yet"), delay)
			}
			return nil
		})
	}()
	var once sync.Once
	stop := func() (took time.Duration) {
		once.Do(func() {
			start := time.Now()
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			took = time.Since(start)
		})
		return took
	}
	t.Cleanup(func() { stop() })
	return calls, stop, c
}

func (h HeldNack) send(t *testing.T, id string) {
	t.Helper()
	res, err := h.Topic.SendBatch(t.Context(), []*driver.Message{{ID: id, Body: []byte("b")}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
}

func next(t *testing.T, calls <-chan seen, what string) seen {
	t.Helper()
	select {
	case s := <-calls:
		return s
	case <-time.After(15 * time.Second):
		t.Fatalf("no %s within 15s", what)
		return seen{}
	}
}

// NackHeld checks a held nack through a Consumer: Redelivery reports Cap as
// the backoff; a handler's RetryAfter(delay) brings the message back no
// sooner than delay, as the next attempt of the same message, its lease
// kept meanwhile (a delay past the broker's own lease or ack deadline
// shows that). The second delivery is acked.
func NackHeld(t *testing.T, h HeldNack, delay time.Duration) {
	t.Helper()
	r, err := h.Sub.Redelivery(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.BackoffBefore(2) != h.Cap {
		t.Errorf("Redelivery().Backoff = %v, want the hold cap %s", r.Backoff, h.Cap)
	}
	calls, stop, _ := runHeld(t, h, delay)
	h.send(t, "held")
	first := next(t, calls, "first delivery")
	second := next(t, calls, "redelivery")
	if took := second.at.Sub(first.at); took < delay {
		t.Errorf("redelivered after %s, before the %s delay", took, delay)
	}
	if second.d.BackendID != first.d.BackendID || second.d.Attempt != first.d.Attempt+1 {
		t.Errorf("redelivery %s attempt %d, want %s attempt %d", second.d.BackendID, second.d.Attempt, first.d.BackendID, first.d.Attempt+1)
	}
	stop()
}

// NackHoldEndsWithRun checks that the end of a Run, its context done,
// ends a hold at once: a delivery whose handler asked for a redelivery
// after Cap is nacked before Run returns, well before Cap has passed.
func NackHoldEndsWithRun(t *testing.T, h HeldNack) {
	t.Helper()
	calls, stop, c := runHeld(t, h, h.Cap)
	h.send(t, "stopping")
	next(t, calls, "first delivery")
	if took := stop(); took > 3*time.Second {
		t.Errorf("Run took %s to stop with a held delivery", took)
	}
	if s := c.Stats(); s.Nacked != 1 || s.SettleFailed != 0 {
		t.Errorf("stats once Run returned: %+v, want the held delivery nacked", s)
	}
}

// NackHoldLeftToClose checks that the Consumer's Close leaves a held
// delivery to the driver's Close, and that this gives it back at once: it
// comes back, well before Cap, to the subscription on the same entity that
// other returns once the Consumer is closed. The redelivery is acked.
func NackHoldLeftToClose(t *testing.T, h HeldNack, other func() driver.Subscription) {
	t.Helper()
	calls, stop, c := runHeld(t, h, h.Cap)
	h.send(t, "closing")
	got := next(t, calls, "first delivery")
	start := time.Now()
	if err := c.Close(t.Context()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	stop()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s with a held delivery", took)
	}
	if s := c.Stats(); s.Nacked != 0 {
		t.Errorf("stats after Close: %+v, want the held delivery left unsettled", s)
	}
	o := other()
	ctx, cancel := context.WithTimeout(t.Context(), h.Cap/2-time.Since(start))
	defer cancel()
	ds, err := o.Receive(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("the held delivery did not come back at once after Close: %v, %d deliveries", err, len(ds))
	}
	if ds[0].BackendID != got.d.BackendID {
		t.Errorf("redelivered %s, want %s", ds[0].BackendID, got.d.BackendID)
	}
	_ = o.Ack(t.Context(), ds[0])
}
