package servicebus_test

// Options.Create (create=true in the URL) against the Service Bus double
// (started by TestMain): the management API's part, which the double does
// not serve, goes through the Admin seam, which creates the queue on the
// double as the API would.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
)

// TestCreateSessionQueue: a session queue that does not exist is reported
// as what will be created, created only once the startup checks pass, and
// then orders; Provision again does nothing.
func TestCreateSessionQueue(t *testing.T) {
	d := needDouble(t)
	a := newCreatingAdmin(t, d)
	plan := sessionProps(5 * time.Second)
	opts := servicebus.WithAdmin(servicebus.Options{Create: &plan, SessionIdle: 200 * time.Millisecond}, a)
	q := fmt.Sprintf("created-%x", time.Now().UnixNano()&0xffffff)
	c := newClient(t, d)
	ctx := t.Context()
	s, err := c.NewSender(q, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp, err := servicebus.OpenTopic(ctx, s, servicebus.Entity{Queue: q}, opts)
	if err != nil {
		t.Fatalf("OpenTopic before the queue exists: %v", err)
	}
	sub, err := servicebus.OpenSessionSubscription(ctx, c, servicebus.Entity{Queue: q}, opts)
	if err != nil {
		t.Fatalf("OpenSessionSubscription before the queue exists: %v", err)
	}
	planned, err := sub.Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plannedR, err := sub.Redelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(planned.Scope, "to be created") || planned.Duration != plan.DuplicateDetectionWindow {
		t.Errorf("window before creation = %s, want the planned %s, to be created", planned, plan.DuplicateDetectionWindow)
	}
	if a.created.Load() != 0 {
		t.Fatal("opening created the queue")
	}
	pub, err := dedupq.NewPublisher(ctx, tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer pub.Close(context.Background())
	if a.created.Load() != 1 {
		t.Fatalf("NewPublisher created %d queues, want 1", a.created.Load())
	}
	live, err := sub.Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	liveR, err := sub.Redelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if live.Duration != planned.Duration || live.Kind != planned.Kind || liveR.AckWait != plannedR.AckWait || liveR.MaxDeliveries != plannedR.MaxDeliveries {
		t.Errorf("after creation window %s redelivery %s, before %s / %s: the check ran on another entity than the one created", live, liveR, planned, plannedR)
	}
	if err := sub.Provision(ctx); err != nil || a.created.Load() != 1 {
		t.Errorf("Provision again = %v with %d creations, want nil and still 1", err, a.created.Load())
	}
	publishGroups(t, tp, []string{"g"}, 3)
	log := newGroupLog()
	runConsumer(t, sub, 2, func(_ context.Context, d *dedupq.Delivery) error { return log.handle("C", d, 0) })
	log.waitAll(t, 20*time.Second, []string{"g"}, 3)
	log.check(t)
}

// TestCreateRefusesSessionMismatch: an entity that exists without
// sessions cannot become a session entity (RequiresSession is fixed at
// creation): opening it for one fails at once, naming the fix.
func TestCreateRefusesSessionMismatch(t *testing.T) {
	d := needDouble(t)
	a := newCreatingAdmin(t, d)
	plain := sessionProps(5 * time.Second)
	plain.RequiresSession = false
	q := newQueue(t, d, a, plain)
	want := sessionProps(5 * time.Second)
	_, err := servicebus.OpenSessionSubscription(t.Context(), newClient(t, d), servicebus.Entity{Queue: q}, servicebus.WithAdmin(servicebus.Options{Create: &want}, a))
	if err == nil || !strings.Contains(err.Error(), "fixed at creation") {
		t.Errorf("open = %v, want a refusal saying RequiresSession is fixed at creation", err)
	}
}
