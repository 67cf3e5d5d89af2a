package servicebus_test

// Opt-in: the official Service Bus emulator (localstack/docker-compose.yml,
// which declares the queue "orders" in localstack/servicebus/Config.json:
// duplicate detection over 10 minutes, LockDuration 1m, MaxDeliveryCount
// 10). Runs only when SERVICEBUS_EMULATOR_CONNECTION_STRING is set, e.g.
//
//	Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true
//
// The properties are stated (the SDK's management client speaks HTTPS only,
// which the emulator does not serve), matching Config.json.

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
)

func TestOfficialEmulator(t *testing.T) {
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
	defer c.Close(context.Background())
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
