package servicebus_test

// Receive against the Service Bus double (through the real SDK): a message
// that arrives between two Receive calls must not be released, which the
// broker counts as a delivery nobody handled.

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// TestNoMessageReleasedBetweenReceives: a Receive asking for more messages
// than are waiting returns what there is; a message sent after it must be
// delivered by the next Receive as attempt 1. When Receive left the credits
// it did not use open, the SDK's releaser took the late message and released
// it, and it came back as attempt 2 (the CI failure of adaptertest Batch:
// "first delivery is attempt 2, want 1").
func TestNoMessageReleasedBetweenReceives(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	q := newQueue(t, d, a, servicebus.EntityProperties{LockDuration: time.Minute, MaxDeliveryCount: 10})
	tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
	defer tp.Close()
	defer sub.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	send := func(id string) {
		t.Helper()
		res, err := tp.SendBatch(ctx, []*driver.Message{{ID: id, Body: []byte(id)}})
		if err != nil || res[0].Err != nil {
			t.Fatalf("send %s: %v / %v", id, err, res[0].Err)
		}
	}
	send("first")
	ds, err := sub.Receive(ctx, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d deliveries, %v; want the one sent", len(ds), err)
	}
	if err := sub.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	send("late")
	// Give a releaser time to take the late message, as a handler's time
	// between two Receives does: a bounded wait that can only let the old
	// behaviour pass, never fail the right one.
	time.Sleep(300 * time.Millisecond)
	ds, err = sub.Receive(ctx, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d deliveries, %v; want the late one", len(ds), err)
	}
	if ds[0].Message.ID != "late" || ds[0].Attempt != 1 {
		t.Errorf("delivery %q attempt %d, want late attempt 1 (a release counted as a delivery)", ds[0].Message.ID, ds[0].Attempt)
	}
	_ = sub.Ack(ctx, ds[0])
}
