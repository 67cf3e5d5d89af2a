// Talks to: the in-memory broker only; no services. The startup check's
// fixes as a mem user reads them: Options fields and URL parameters.
package mem_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

func TestFixesNameMemSettings(t *testing.T) {
	// 8 attempts 10s each, waits 5s doubling up to 1m: 5m35s.
	retry := window.RetryPolicy{MaxAttempts: 8, InitialBackoff: 5 * time.Second, MaxBackoff: time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}
	guard := func(ttl time.Duration) dedupq.Deduplicator {
		g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	tests := []struct {
		name string
		opts mem.Options
		pub  *dedupq.PublisherOptions
		con  *dedupq.ConsumerOptions
		want []string
	}{
		{name: "publisher outlives the window",
			opts: mem.Options{DedupWindow: 2 * time.Minute},
			pub:  &dedupq.PublisherOptions{Retry: &retry},
			want: []string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 4",
				"cap PublisherOptions.Retry.MaxBackoff at 2s",
				"raise Options.DedupWindow (URL parameter window) from 2m to ≥ 6m59s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "publisher without a window",
			opts: mem.Options{},
			pub:  &dedupq.PublisherOptions{},
			want: []string{
				"set Options.DedupWindow (URL parameter window) to ≥ 1m5s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 1m5s, and ConsumerOptions.PublisherSpan to 51.5s on the consumers, whose TTL must also cover their redelivery span",
				"set PublisherOptions.Retry.MaxAttempts to 1 (no retries)",
			}},
		{name: "consumer TTL short of the redelivery span",
			opts: mem.Options{DedupWindow: 2 * time.Minute, AckWait: 30 * time.Second, MaxDeliveries: 4, Backoff: []time.Duration{time.Minute}},
			con:  &dedupq.ConsumerOptions{Dedup: guard(4 * time.Minute)},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 4m to ≥ 6m15s",
				"lower Options.MaxDeliveries (URL parameter max_deliveries) from 4 to 2",
				"lower Options.AckWait (URL parameter ack_wait) from 30s to 3s",
				"cap Options.Backoff (URL parameter backoff) at 24s",
			}},
		{name: "consumer with unlimited deliveries",
			opts: mem.Options{DedupWindow: 2 * time.Minute, AckWait: 30 * time.Second},
			con:  &dedupq.ConsumerOptions{Dedup: guard(time.Hour)},
			want: []string{
				"set Options.MaxDeliveries (URL parameter max_deliveries) to at most 96 (deliveries are unlimited now)",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mem.NewBroker(tt.opts)
			var err error
			if tt.pub != nil {
				_, err = dedupq.NewPublisher(t.Context(), b.Topic(q), *tt.pub)
			} else {
				_, err = dedupq.NewConsumer(t.Context(), b.Subscription(q), *tt.con)
			}
			var ue *window.UnsafeRetryError
			if !errors.As(err, &ue) {
				t.Fatalf("open = %v, want an *window.UnsafeRetryError", err)
			}
			if got, want := strings.Join(ue.Fixes, "\n"), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("fixes:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
