package servicebus_test

// Opt-in: the official Service Bus emulator (localstack/docker-compose.yml,
// which declares the queues "orders" and "orders-sessions", the same with
// RequiresSession, in localstack/servicebus/Config.json: duplicate
// detection over 10 minutes, LockDuration 1m, MaxDeliveryCount 10). Runs
// only when SERVICEBUS_EMULATOR_CONNECTION_STRING is set, e.g.
//
//	Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true
//
// The properties are stated (the SDK's management client speaks HTTPS only,
// which the emulator does not serve), matching Config.json.

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
)

// emulatorClient connects to the official emulator, or skips the test
// when none is named.
func emulatorClient(t *testing.T) *azservicebus.Client {
	t.Helper()
	cs := os.Getenv("SERVICEBUS_EMULATOR_CONNECTION_STRING")
	if cs == "" {
		// Opt-in even under CI: the official emulator needs Docker, which CI
		// machines lack; the AMQP double covers the adapter there.
		t.Skip("SERVICEBUS_EMULATOR_CONNECTION_STRING is not set (opt-in; see localstack/README.md)")
	}
	c, err := azservicebus.NewClientFromConnectionString(cs, servicebus.ClientOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestOfficialEmulator(t *testing.T) {
	c := emulatorClient(t)
	stated := servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: time.Minute, MaxDeliveryCount: 10}
	tp, sub := openPair(t, c, "orders", &servicebus.Options{Stated: &stated})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	p, err := dedupq.NewPublisher(ctx, tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer p.Close(context.Background())
	id := "emu-" + time.Now().Format("150405.000000000")
	for range 2 { // the second send is a duplicate the emulator drops
		if _, err := p.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("hello")}); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	con, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	defer con.Close(ctx)
	seen := make(chan dedupq.Delivery, 10)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- con.Run(rctx, func(_ context.Context, d *dedupq.Delivery) error {
			if d.Message.ID == id {
				seen <- *d
			}
			return nil
		})
	}()
	select {
	case d := <-seen:
		if d.Attempt != 1 {
			t.Errorf("Attempt = %d, want 1", d.Attempt)
		}
	case <-ctx.Done():
		t.Fatal("the message was not delivered within a minute")
	}
	// A second delivery would be the duplicate: give it a bounded chance.
	extra := time.NewTimer(3 * time.Second)
	defer extra.Stop()
	select {
	case d := <-seen:
		t.Errorf("the duplicate was delivered too: %+v", d)
	case <-extra.C:
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestOfficialEmulatorSessions: on the session queue "orders-sessions",
// two ordered Consumers (each on a client of its own) share the groups of
// this run, never running two messages of a group at once nor one out of
// order, though each group's first message fails once; a resent message
// is dropped by duplicate detection within its session.
func TestOfficialEmulatorSessions(t *testing.T) {
	c := emulatorClient(t)
	stated := servicebus.EntityProperties{
		RequiresSession: true, RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
		LockDuration: time.Minute, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes,
	}
	opts := &servicebus.Options{Stated: &stated, SessionIdle: time.Second}
	const q = "orders-sessions"
	tp, subA := openSessionPair(t, c, q, opts)
	subB, err := servicebus.OpenSessionSubscription(t.Context(), emulatorClient(t), servicebus.Entity{Queue: q}, opts)
	if err != nil {
		t.Fatalf("OpenSessionSubscription: %v", err)
	}
	// The emulator keeps its queues across runs: this run's groups are its
	// own, and a message left by an earlier run is acked unlogged.
	run := "emu-" + time.Now().Format("150405.000000000") + "-"
	groups := []string{run + "a", run + "b", run + "c"}
	const perGroup = 4
	publishGroups(t, tp, groups, perGroup)
	resend, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer resend.Close(context.Background())
	// The resent copy of a's first message: same MessageId, same session.
	if _, err := resend.Publish(t.Context(), &dedupq.Message{ID: groups[0] + "-1", GroupKey: groups[0], Body: []byte("resent"), Attributes: map[string]string{"seq": "1"}}); err != nil {
		t.Fatalf("Publish the resent copy: %v", err)
	}
	log := newGroupLog()
	handler := func(name string) dedupq.Handler {
		return func(_ context.Context, d *dedupq.Delivery) error {
			if !strings.HasPrefix(d.Message.GroupKey, run) {
				return nil
			}
			if string(d.Message.Body) == "resent" {
				t.Errorf("the resent copy of %s was delivered: duplicate detection did not drop it", d.Message.ID)
			}
			return log.handle(name, d, 100*time.Millisecond)
		}
	}
	runConsumer(t, subA, 2, handler("A"))
	runConsumer(t, subB, 2, handler("B"))
	log.waitAll(t, 2*time.Minute, groups, perGroup)
	log.check(t)
}
