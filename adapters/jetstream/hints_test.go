package jetstream

// The startup check's fixes as a JetStream user reads them, from the window
// and redelivery policy this package reports for a stream and durable it
// will create. Pure functions: no server.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/window"
)

func TestFixesNameJetStreamSettings(t *testing.T) {
	// 8 attempts 10s each, waits 5s doubling up to 1m: 5m35s.
	retry := window.RetryPolicy{MaxAttempts: 8, InitialBackoff: 5 * time.Second, MaxBackoff: time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}
	w := plannedWindow(Config{Stream: "ORDERS", Subject: "orders", Duplicates: 2 * time.Minute})
	tests := []struct {
		name  string
		check error
		want  []string
	}{
		{"publisher outlives the stream's Duplicates",
			window.CheckPublisher(window.PublisherPlan{Retry: retry, Window: w}),
			[]string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 4",
				"cap PublisherOptions.Retry.MaxBackoff at 2s",
				"raise the stream's Duplicates (Config.Duplicates, URL parameter window) from 2m to ≥ 6m59s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{"consumer TTL short of MaxDeliver × AckWait",
			window.CheckConsumer(window.ConsumerPlan{
				Redelivery: redeliveryPolicy(jetstream.ConsumerConfig{AckWait: 30 * time.Second, MaxDeliver: 5}),
				Window:     w, DedupTTL: 2 * time.Minute,
			}),
			[]string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 2m to ≥ 3m8s",
				"lower the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries) from 5 to 3",
				"lower the durable's AckWait and every BackOff entry above it (Config.AckWait and BackOff, URL parameters ack_wait and backoff) from 30s to 19s",
			}},
		{"consumer on a durable that redelivers forever",
			window.CheckConsumer(window.ConsumerPlan{
				Redelivery: redeliveryPolicy(jetstream.ConsumerConfig{AckWait: 30 * time.Second, MaxDeliver: -1}),
				Window:     w, DedupTTL: time.Hour,
			}),
			[]string{
				"set the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries) to at most 96 (deliveries are unlimited now)",
			}},
		{"consumer whose only cheap fix is no redelivery",
			window.CheckConsumer(window.ConsumerPlan{
				Redelivery: redeliveryPolicy(jetstream.ConsumerConfig{AckWait: time.Minute, MaxDeliver: 2}),
				Window:     w, DedupTTL: time.Minute,
			}),
			[]string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 1m to ≥ 2m30s",
				"lower the durable's AckWait and every BackOff entry above it (Config.AckWait and BackOff, URL parameters ack_wait and backoff) from 1m to 24s",
				"set the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries) to 1, which means no redelivery at all: a message whose first delivery fails is not retried",
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
