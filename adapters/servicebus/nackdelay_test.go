package servicebus_test

// A nack with a delay against the double, through a Consumer: it holds the
// delivery (the Subscription is a driver.NackHolder), renewing its lock,
// and abandons it when the delay has passed, or at once when its Run
// stops.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/servicebus"
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

func TestNackDelayHeld(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	const lock = 2 * time.Second
	q := newQueue(t, d, a, servicebus.EntityProperties{LockDuration: lock, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes})
	c := newClient(t, d)
	tp, _ := openPair(t, c, q, servicebus.WithAdmin(servicebus.Options{}, a))
	sub, cr := openCounting(t, c, a, q)
	t.Cleanup(func() { _ = sub.Close() })
	// The delay is longer than what remains of the lock less the renewal
	// margin, so the hold must renew the lock once.
	adaptertest.NackHeld(t, adaptertest.HeldNack{Topic: tp, Sub: sub, Cap: lock}, 1800*time.Millisecond)
	if n := cr.renewals.Load(); n < 1 {
		t.Errorf("%d lock renewals during a hold past the lock, want at least 1", n)
	}
}

func TestNackDelayEndsWithRun(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	const lock = 10 * time.Second
	q := newQueue(t, d, a, servicebus.EntityProperties{LockDuration: lock, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes})
	c := newClient(t, d)
	tp, _ := openPair(t, c, q, servicebus.WithAdmin(servicebus.Options{}, a))
	sub, _ := openCounting(t, c, a, q)
	t.Cleanup(func() { _ = sub.Close() })
	// Whether the abandoned message is then available at once to another
	// receiver is not checked: the Run's last receive, its context ended,
	// leaves its credit open on the link (see Subscription.Receive), and
	// the message the abandon returns can arrive on it and stay locked to
	// this receiver until its lock expires. For the same reason the
	// Consumer's Close leaves a held delivery to its lock's expiry.
	adaptertest.NackHoldEndsWithRun(t, adaptertest.HeldNack{Topic: tp, Sub: sub, Cap: lock})
}
