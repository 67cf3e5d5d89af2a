package adaptertest

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/driver"
)

// HeldNack is a subscription whose broker has no redelivery delay of its
// own, so that its Nack holds a delivery for the delay (its lease kept
// alive) and only then gives it back (Pub/Sub, Service Bus), with what
// NackHeld and NackHoldReleasedOnClose need to drive it.
type HeldNack struct {
	Topic driver.Topic // publishes to Sub's entity
	Sub   driver.Subscription
	// Cap is the longest hold Nack applies, which Sub's Redelivery must
	// report as the backoff before every redelivery.
	Cap time.Duration
}

func (h HeldNack) send(t *testing.T, id string) {
	t.Helper()
	res, err := h.Topic.SendBatch(t.Context(), []*driver.Message{{ID: id, Body: []byte("b")}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
}

// receive receives one delivery from sub within d, or returns nil.
func receive(t *testing.T, sub driver.Subscription, d time.Duration) *driver.Delivery {
	t.Helper()
	if d <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if err != nil || len(ds) == 0 {
		return nil
	}
	if len(ds) != 1 {
		t.Fatalf("Receive returned %d deliveries, want 1", len(ds))
	}
	return ds[0]
}

// holdSlack bounds how long a Nack that holds, or a Close that ends the
// holds, may take, and how much earlier than the delay's end a bounded
// negative check stops looking.
const holdSlack = 500 * time.Millisecond

// NackHeld checks a held nack: Redelivery reports Cap as the backoff; Nack
// with delay returns at once; the message comes back no sooner than delay,
// as the next attempt of the same message. It returns both deliveries for
// the adapter's own checks; the second is acked.
func NackHeld(t *testing.T, h HeldNack, delay time.Duration) (first, second *driver.Delivery) {
	t.Helper()
	r, err := h.Sub.Redelivery(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.BackoffBefore(2) != h.Cap {
		t.Errorf("Redelivery().Backoff = %v, want the hold cap %s", r.Backoff, h.Cap)
	}
	h.send(t, "held")
	if first = receive(t, h.Sub, 15*time.Second); first == nil {
		t.Fatal("no first delivery")
	}
	start := time.Now()
	if err := h.Sub.Nack(t.Context(), first, delay); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if took := time.Since(start); took > holdSlack {
		t.Errorf("Nack took %s; it must not block for the delay", took)
	}
	// Bounded negative check: nothing comes back well before the delay.
	if again := receive(t, h.Sub, delay-holdSlack-time.Since(start)); again != nil {
		t.Fatalf("redelivered after %s, before the %s delay", time.Since(start), delay)
	}
	if second = receive(t, h.Sub, 15*time.Second); second == nil {
		t.Fatal("not redelivered after the delay")
	}
	if took := time.Since(start); took < delay {
		t.Errorf("redelivered after %s, before the %s delay", took, delay)
	}
	if second.BackendID != first.BackendID || second.Attempt != first.Attempt+1 {
		t.Errorf("redelivery %s attempt %d, want %s attempt %d", second.BackendID, second.Attempt, first.BackendID, first.Attempt+1)
	}
	if err := h.Sub.Ack(t.Context(), second); err != nil {
		t.Errorf("Ack: %v", err)
	}
	return first, second
}

// NackHoldReleasedOnClose checks that Close ends a hold at once: a delivery
// nacked for Cap comes back, well before Cap has passed, to the
// subscription on the same entity that other returns once Sub is closed.
// It returns both deliveries for the adapter's own checks; the second is
// acked.
func NackHoldReleasedOnClose(t *testing.T, h HeldNack, other func() driver.Subscription) (first, second *driver.Delivery) {
	t.Helper()
	h.send(t, "closing")
	if first = receive(t, h.Sub, 15*time.Second); first == nil {
		t.Fatal("no first delivery")
	}
	if err := h.Sub.Nack(t.Context(), first, h.Cap); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	start := time.Now()
	if err := h.Sub.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s with a held delivery", took)
	}
	// Well before the hold would have ended.
	o := other()
	if second = receive(t, o, h.Cap/2); second == nil {
		t.Fatal("the held delivery did not come back at once after Close")
	}
	if second.BackendID != first.BackendID {
		t.Errorf("redelivered %s, want %s", second.BackendID, first.BackendID)
	}
	_ = o.Ack(t.Context(), second)
	return first, second
}
