package servicebus

// The startup check's fixes as a Service Bus user reads them, from the
// window and redelivery policy this package makes of an entity's
// properties. Pure functions: no broker.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq/window"
)

func TestFixesNameEntityProperties(t *testing.T) {
	// 6 attempts of 45s, waits 1s doubling: 5m1s.
	retry := window.RetryPolicy{MaxAttempts: 6, InitialBackoff: time.Second, MaxBackoff: 30 * time.Second, Multiplier: 2, AttemptTimeout: 45 * time.Second}
	props := EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 5}
	noDetection := props
	noDetection.RequiresDuplicateDetection = false
	const (
		noRetries = "set PublisherOptions.Retry.MaxAttempts to 1 (no retries)"
		declare   = "declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m17s, and ConsumerOptions.PublisherSpan to 5m1s on the consumers, whose TTL must also cover their redelivery span"
	)
	publisher := func(e Entity, p EntityProperties, stated bool) error {
		return window.CheckPublisher(window.PublisherPlan{Retry: retry, Window: windowOf(e, p, stated, false)})
	}
	// 5 deliveries locked 30s, each redelivery up to a lock later: 4m30s.
	consumer := func(e Entity, p EntityProperties, stated bool) error {
		return window.CheckConsumer(window.ConsumerPlan{Redelivery: redeliveryOf(p), Window: windowOf(e, p, stated, false), DedupTTL: 4 * time.Minute})
	}
	queue, sub := Entity{Queue: "orders"}, Entity{Topic: "events", Subscription: "billing"}
	tests := []struct {
		name  string
		check error
		want  []string
	}{
		{"publisher on a queue", publisher(queue, props, false), []string{
			"lower PublisherOptions.Retry.AttemptTimeout from 45s to 2s",
			"raise the queue's DuplicateDetectionHistoryTimeWindow from 1m to ≥ 6m17s",
			declare, noRetries,
		}},
		{"publisher on a topic whose properties the URL states", publisher(Entity{Topic: "events"}, props, true), []string{
			"lower PublisherOptions.Retry.AttemptTimeout from 45s to 2s",
			"raise the topic's DuplicateDetectionHistoryTimeWindow and URL parameter window (Options.Stated) from 1m to ≥ 6m17s",
			declare, noRetries,
		}},
		{"publisher on a queue without duplicate detection", publisher(queue, noDetection, false), []string{
			"set the DuplicateDetectionHistoryTimeWindow of a queue recreated with RequiresDuplicateDetection (fixed at creation) to ≥ 6m17s",
			declare, noRetries,
		}},
		{"consumer on a queue", consumer(queue, props, false), []string{
			"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 4m to ≥ 5m38s",
			"lower the queue's MaxDeliveryCount from 5 to 3",
			"lower the queue's LockDuration from 30s to 14s",
		}},
		{"consumer on a topic subscription whose properties the URL states", consumer(sub, props, true), []string{
			"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 4m to ≥ 5m38s",
			"lower the subscription's MaxDeliveryCount and URL parameter max_deliveries (Options.Stated) from 5 to 3",
			"lower the subscription's LockDuration and URL parameter ack_wait (Options.Stated) from 30s to 14s",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ue *window.UnsafeRetryError
			if !errors.As(tt.check, &ue) {
				t.Fatalf("check = %v, want an *window.UnsafeRetryError", tt.check)
			}
			if got, want := strings.Join(ue.Fixes, "\n"), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("fixes:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
