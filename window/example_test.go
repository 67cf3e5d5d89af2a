// Runnable examples of the window arithmetic: no services.
package window_test

import (
	"fmt"
	"time"

	"github.com/dedupq/dedupq/window"
)

// The same retry policy fits a 10-minute Service Bus window and not SQS's
// fixed 5 minutes; declaring consumer-side dedup that covers it makes it
// acceptable on SQS.
func ExampleCheckPublisher() {
	policy := window.RetryPolicy{MaxAttempts: 8, InitialBackoff: 5 * time.Second, MaxBackoff: time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}
	serviceBus := window.Window{Backend: "servicebus", Duration: 10 * time.Minute, Kind: window.KindConfigured, Source: window.SourceDiscovered}
	sqs := window.Window{Backend: "sqs", Duration: 5 * time.Minute, Kind: window.KindFixed, Source: window.SourceDocumented}

	fmt.Println("span:", policy.Span())
	fmt.Println("service bus:", window.CheckPublisher(window.PublisherPlan{Retry: policy, Window: serviceBus}))
	fmt.Println("sqs:", window.CheckPublisher(window.PublisherPlan{Retry: policy, Window: sqs}))
	fmt.Println("sqs + dedup TTL 10m:", window.CheckPublisher(window.PublisherPlan{Retry: policy, Window: sqs, DedupTTL: 10 * time.Minute}))
	// Output:
	// span: 5m35s
	// service bus: <nil>
	// sqs: dedupq: unsafe publisher retry policy: worst-case span 5m35s exceeds the broker window 5m less a 20% safety margin = 4m (sqs dedup window 5m (fixed by the broker, documented)); fix: lower PublisherOptions.Retry.MaxAttempts from 8 to 6, or cap PublisherOptions.Retry.MaxBackoff at 31s, or declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span
	// sqs + dedup TTL 10m: <nil>
}

// A consumer's dedup store must remember completed keys for as long as the
// broker may redeliver: unlimited redelivery never fits. The fixes name the
// settings the driver says its window and redelivery come from (here as
// the jetstream adapter names them), or generic ones when it names none.
func ExampleCheckConsumer() {
	jetstream := window.Window{
		Backend: "jetstream", Duration: 2 * time.Minute, Kind: window.KindConfigured, Source: window.SourceDiscovered,
		Settings: window.Settings{
			AckWait:       "the durable's AckWait (Config.AckWait, URL parameter ack_wait)",
			MaxDeliveries: "the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries)",
		},
	}
	bounded := window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}
	fmt.Println(window.CheckConsumer(window.ConsumerPlan{Redelivery: bounded, Window: jetstream, DedupTTL: time.Hour}))
	fmt.Println(window.CheckConsumer(window.ConsumerPlan{Redelivery: window.RedeliveryPolicy{AckWait: 30 * time.Second}, Window: jetstream, DedupTTL: time.Hour}))
	fmt.Println(window.CheckConsumer(window.ConsumerPlan{Redelivery: bounded, Window: jetstream, DedupTTL: 2 * time.Minute}))
	// Output:
	// <nil>
	// dedupq: unsafe consumer retry policy: worst-case span forever exceeds the dedup store TTL 1h less a 20% safety margin = 48m (the TTL of ConsumerOptions.Dedup; redelivery: unlimited deliveries, no backoff, ack wait 30s per delivery (worst-case span forever)); fix: set the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries) to at most 96 (deliveries are unlimited now)
	// dedupq: unsafe consumer retry policy: worst-case span 2m30s exceeds the dedup store TTL 2m less a 20% safety margin = 1m36s (the TTL of ConsumerOptions.Dedup; redelivery: 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s)); fix: raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 2m to ≥ 3m8s, or lower the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries) from 5 to 3, or lower the durable's AckWait (Config.AckWait, URL parameter ack_wait) from 30s to 19s
}

// A policy names only what it changes: WithDefaults fills the rest from
// DefaultRetryPolicy (dedupq.NewPublisher does this before its check), and
// String says in one line what the publisher will do.
func ExampleRetryPolicy_WithDefaults() {
	partial := window.RetryPolicy{MaxAttempts: 3}
	fmt.Println("as written:", partial)
	fmt.Println("filled:    ", partial.WithDefaults())
	fmt.Println("no waits:  ", window.RetryPolicy{MaxAttempts: 3, InitialBackoff: window.NoBackoff}.WithDefaults())
	fmt.Println("no retries:", window.RetryPolicy{MaxAttempts: 1}.WithDefaults())
	fmt.Println("broker:    ", window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second, Backoff: []time.Duration{time.Second, 5 * time.Second}})
	// Output:
	// as written: 3 attempts, no backoff, no attempt timeout (worst-case span forever)
	// filled:     3 attempts, backoff 100ms×2 up to 5s, jitter 20%, 10s per attempt (worst-case span 30.3s)
	// no waits:   3 attempts, no backoff, 10s per attempt (worst-case span 30s)
	// no retries: 1 attempt (no retries)
	// broker:     3 deliveries, backoff 1s then 5s, ack wait 30s per delivery (worst-case span 1m36s)
}
