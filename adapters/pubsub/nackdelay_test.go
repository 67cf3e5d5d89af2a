package pubsub_test

// Nack with a delay on pstest: the Subscription holds the message
// unsettled (the client keeps its lease) and nacks it when the delay has
// passed, or at once on Close.

import (
	"context"
	"testing"
	"time"

	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/driver"
)

// tryReceive receives one delivery within d, or returns nil.
func tryReceive(t *testing.T, sub *dpubsub.Subscription, d time.Duration) *driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if err != nil || len(ds) == 0 {
		return nil
	}
	return ds[0]
}

func openNackFixture(t *testing.T, ackExtension time.Duration) (*dpubsub.Topic, func() *dpubsub.Subscription) {
	t.Helper()
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{})
	tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	open := func() *dpubsub.Subscription {
		sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, &dpubsub.Options{AckExtension: ackExtension})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	return tp, open
}

func publishOne(t *testing.T, tp *dpubsub.Topic, id string) {
	t.Helper()
	if res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: id, Body: []byte("x")}}); err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
}

func TestNackDelayHeld(t *testing.T) {
	const lease = 2 * time.Second
	tp, open := openNackFixture(t, lease)
	sub := open()
	r, err := sub.Redelivery(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.BackoffBefore(2) != lease {
		t.Errorf("Redelivery().Backoff = %v, want the hold cap %s", r.Backoff, lease)
	}

	publishOne(t, tp, "held")
	first := tryReceive(t, sub, 15*time.Second)
	if first == nil {
		t.Fatal("no first delivery")
	}
	// Longer than the server's 1 s ack deadline: the client's lease
	// management must keep the message during the hold.
	const delay = 1800 * time.Millisecond
	start := time.Now()
	if err := sub.Nack(t.Context(), first, delay); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Nack took %s; it must not block for the delay", took)
	}
	// Bounded negative check: nothing comes back well before the delay.
	if again := tryReceive(t, sub, delay-500*time.Millisecond); again != nil {
		t.Fatalf("redelivered after %s, before the %s delay", time.Since(start), delay)
	}
	second := tryReceive(t, sub, 15*time.Second)
	if second == nil {
		t.Fatal("not redelivered after the delay")
	}
	if took := time.Since(start); took < delay {
		t.Errorf("redelivered after %s, before the %s delay", took, delay)
	}
	if second.BackendID != first.BackendID || second.Attempt != first.Attempt+1 {
		t.Errorf("redelivery %s attempt %d, want %s attempt %d", second.BackendID, second.Attempt, first.BackendID, first.Attempt+1)
	}
	if err := sub.Ack(t.Context(), second); err != nil {
		t.Errorf("Ack: %v", err)
	}
}

func TestNackDelayReleasedOnClose(t *testing.T) {
	const lease = 10 * time.Second
	tp, open := openNackFixture(t, lease)
	sub := open()
	publishOne(t, tp, "closing")
	first := tryReceive(t, sub, 15*time.Second)
	if first == nil {
		t.Fatal("no first delivery")
	}
	if err := sub.Nack(t.Context(), first, lease); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	start := time.Now()
	if err := sub.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s with a held delivery", took)
	}
	// Well before the delay would have ended. A new Subscription counts
	// attempts afresh, so the redelivery's number is not compared here.
	other := open()
	second := tryReceive(t, other, 5*time.Second)
	if second == nil {
		t.Fatal("the held delivery did not come back at once after Close")
	}
	if second.BackendID != first.BackendID {
		t.Errorf("redelivered %s, want %s", second.BackendID, first.BackendID)
	}
	_ = other.Ack(t.Context(), second)
}
