package servicebus_test

// Nack with a delay against the double: the Subscription holds the
// message (renewing its lock) and abandons it when the delay has passed,
// or at once on Close.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// countingReceiver counts lock renewals on the real SDK receiver.
type countingReceiver struct {
	*azservicebus.Receiver
	renewals atomic.Int32
}

func (r *countingReceiver) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	r.renewals.Add(1)
	return r.Receiver.RenewMessageLock(ctx, m, o)
}

func openCounting(t *testing.T, c *azservicebus.Client, a *fakeAdmin, queue string) (*servicebus.Subscription, *countingReceiver) {
	t.Helper()
	r, err := c.NewReceiverForQueue(queue, nil)
	if err != nil {
		t.Fatalf("NewReceiverForQueue: %v", err)
	}
	cr := &countingReceiver{Receiver: r}
	sub, err := servicebus.OpenSubscriptionWith(t.Context(), cr, servicebus.Entity{Queue: queue}, servicebus.WithAdmin(servicebus.Options{}, a))
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	return sub, cr
}

// receiveOne receives until a delivery arrives or within passes.
func receiveOne(t *testing.T, sub *servicebus.Subscription, within time.Duration) *driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if err != nil {
		return nil
	}
	if len(ds) != 1 {
		t.Fatalf("Receive returned %d deliveries, want 1", len(ds))
	}
	return ds[0]
}

func sendOne(t *testing.T, tp *servicebus.Topic, id string) {
	t.Helper()
	res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: id, Body: []byte("b")}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %v", err, res)
	}
}

func TestNackDelayHeld(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	const lock = 2 * time.Second
	q := newQueue(t, d, a, servicebus.EntityProperties{LockDuration: lock, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes})
	c := newClient(t, d)
	tp, _ := openPair(t, c, q, servicebus.WithAdmin(servicebus.Options{}, a))
	sub, cr := openCounting(t, c, a, q)
	t.Cleanup(func() { _ = sub.Close() })

	r, err := sub.Redelivery(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r.BackoffBefore(2) != lock {
		t.Errorf("Redelivery().Backoff = %v, want the hold cap %s", r.Backoff, lock)
	}

	sendOne(t, tp, "held")
	first := receiveOne(t, sub, 15*time.Second)
	if first == nil {
		t.Fatal("no first delivery")
	}
	// Longer than what remains of the lock less the renewal margin, so the
	// hold must renew the lock once.
	const delay = 1800 * time.Millisecond
	start := time.Now()
	if err := sub.Nack(t.Context(), first, delay); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Nack took %s; it must not block for the delay", took)
	}
	// Bounded negative check: nothing comes back well before the delay.
	if again := receiveOne(t, sub, delay-600*time.Millisecond); again != nil {
		t.Fatalf("redelivered after %s, before the %s delay", time.Since(start), delay)
	}
	second := receiveOne(t, sub, 15*time.Second)
	if second == nil {
		t.Fatal("not redelivered after the delay")
	}
	if took := time.Since(start); took < delay {
		t.Errorf("redelivered after %s, before the %s delay", took, delay)
	}
	if second.Message.ID != "held" || second.Attempt != first.Attempt+1 {
		t.Errorf("redelivery %q attempt %d, want %q attempt %d", second.Message.ID, second.Attempt, "held", first.Attempt+1)
	}
	if n := cr.renewals.Load(); n < 1 {
		t.Errorf("%d lock renewals during a hold past the lock, want at least 1", n)
	}
	if err := sub.Ack(t.Context(), second); err != nil {
		t.Errorf("Ack: %v", err)
	}
}

func TestNackDelayReleasedOnClose(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	const lock = 10 * time.Second
	q := newQueue(t, d, a, servicebus.EntityProperties{LockDuration: lock, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes})
	c := newClient(t, d)
	tp, other := openPair(t, c, q, servicebus.WithAdmin(servicebus.Options{}, a))
	t.Cleanup(func() { _ = other.Close() })
	sub, _ := openCounting(t, c, a, q)

	sendOne(t, tp, "closing")
	first := receiveOne(t, sub, 15*time.Second)
	if first == nil {
		t.Fatal("no first delivery")
	}
	if err := sub.Nack(t.Context(), first, lock); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	start := time.Now()
	if err := sub.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Close took %s with a held delivery", took)
	}
	// Well before both the delay and the lock would have ended.
	second := receiveOne(t, other, 5*time.Second)
	if second == nil {
		t.Fatalf("the held delivery did not come back at once after Close")
	}
	if second.Message.ID != "closing" || second.Attempt != first.Attempt+1 {
		t.Errorf("redelivery %q attempt %d, want %q attempt %d", second.Message.ID, second.Attempt, "closing", first.Attempt+1)
	}
	_ = other.Ack(t.Context(), second)
}
