package main

// Runs the program against the Service Bus test double
// (localstack/servicebus-double: an AMQP 1.0 broker the real azservicebus
// SDK talks to), which the test starts, and installs from its lockfile if
// needed, on a queue with duplicate detection whose properties the URL
// states (the double has no management API), with sessions and without.
// Skipped outside CI when node or npm is missing; failed under CI.

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq/examples/internal/need"
	servicebusdouble "github.com/dedupq/dedupq/localstack/servicebus-double"
)

func TestRun(t *testing.T) {
	d, err := servicebusdouble.Start()
	switch {
	case err == nil:
		t.Cleanup(func() { _ = d.Stop() })
	case os.Getenv("CI") != "":
		t.Fatalf("the servicebus double cannot run under CI: %v", err)
	case !errors.Is(err, servicebusdouble.ErrUnavailable):
		t.Fatalf("starting the servicebus double: %v", err)
	default:
		t.Skipf("the servicebus double cannot run here (%v); skipping outside CI", err)
	}
	t.Setenv("SERVICEBUS_CONNECTION_STRING", d.ConnectionString())
	endpoint := strings.TrimPrefix(strings.SplitN(d.ConnectionString(), ";", 2)[0], "Endpoint=sb://")
	for _, sessions := range []bool{false, true} {
		name := "queue"
		if sessions {
			name = "session queue"
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			queue := "example-" + need.Suffix()
			err := d.CreateQueue(ctx, queue, servicebusdouble.QueueConfig{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3, RequiresSession: sessions})
			if err != nil {
				t.Fatal(err)
			}
			url := "servicebus://" + endpoint + "/" + queue + "?window=10m&ack_wait=30s&max_deliveries=3"
			if sessions {
				url += "&sessions=true"
			}
			// run fails unless both stored orders are settled.
			if err := run(ctx, url); err != nil {
				t.Fatalf("run: %v", err)
			}
			dead, err := d.DeadLetters(ctx, queue)
			if err != nil {
				t.Fatal(err)
			}
			if len(dead) != 1 || dead[0].MessageID != "order-2" {
				t.Errorf("dead letters %+v, want order-2 alone", dead)
			}
		})
	}
}
