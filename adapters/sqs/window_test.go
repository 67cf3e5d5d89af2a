package sqs_test

// The startup check on SQS, against fauxqs (started by TestMain; see
// fauxqs_test.go). The window compared with is read from the emulator's
// queue attributes exactly as from AWS; no fauxqs difference matters here.
// There is no Service Bus adapter, so the Service Bus side is a
// window.Window of the size its queues default to (10 minutes).

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/window"
)

// TestRetryPolicyFitsServiceBusNotSQS: a policy spanning 7m40s fits a
// 10-minute Service Bus window (8 minutes after the 20% margin) but not
// SQS's fixed 5 minutes (4 minutes usable). Opening a publisher on SQS
// refuses it with the numbers and fixes; declaring consumer-side dedup
// whose TTL covers the span makes it acceptable.
func TestRetryPolicyFitsServiceBusNotSQS(t *testing.T) {
	c := needFauxqs(t)
	_, name := newQueue(t, c, nil)
	policy := window.RetryPolicy{
		MaxAttempts: 5, InitialBackoff: 20 * time.Second, Multiplier: 2,
		MaxBackoff: 2 * time.Minute, AttemptTimeout: 40 * time.Second,
	}
	const span = 7*time.Minute + 40*time.Second // 5×40s + 20s+40s+80s+120s
	if got := policy.Span(); got != span {
		t.Fatalf("policy span %s, want %s", got, span)
	}
	serviceBus := window.Window{Backend: "servicebus", Duration: 10 * time.Minute, Kind: window.KindConfigured, Source: window.SourceDiscovered}
	if err := window.CheckPublisher(window.PublisherPlan{Retry: policy, Window: serviceBus}); err != nil {
		t.Fatalf("the policy should fit a 10-minute Service Bus window: %v", err)
	}

	url := "sqs://" + name + "?region=" + testRegion + "&endpoint=" + fauxqsEndpoint
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		wantErr string // the error's text up to its fixes; empty: accepted
		wantFix string // the fixes, in full
	}{
		{
			name:    "broker window only",
			wantErr: "dedupq: unsafe publisher retry policy: worst-case span 7m40s exceeds the broker window 5m less a 20% safety margin = 4m (sqs dedup window 5m (fixed by the broker, discovered from the broker, scope queue))",
			// No fix raises the window: AWS fixes it.
			wantFix: "lower PublisherOptions.Retry.MaxAttempts from 5 to 3, or cap PublisherOptions.Retry.MaxBackoff at 10s, or declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 9m35s, and ConsumerOptions.PublisherSpan to 7m40s on the consumers, whose TTL must also cover their redelivery span",
		},
		{name: "consumer dedup TTL too short", ttl: 9 * time.Minute,
			wantErr: "dedupq: unsafe publisher retry policy: worst-case span 7m40s exceeds the declared consumer dedup TTL 9m less a 20% safety margin = 7m12s (PublisherOptions.ConsumerDedupTTL; the span does not fit the sqs dedup window 5m (fixed by the broker, discovered from the broker, scope queue) either)",
			wantFix: "lower PublisherOptions.Retry.MaxAttempts from 5 to 4, or cap PublisherOptions.Retry.MaxBackoff at 1m32s, or lower PublisherOptions.Retry.AttemptTimeout from 40s to 34s, or raise PublisherOptions.ConsumerDedupTTL from 9m to ≥ 9m35s, and ConsumerOptions.PublisherSpan to 7m40s on the consumers, whose TTL must also cover their redelivery span",
		},
		{name: "consumer dedup TTL covers it", ttl: 10 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := dedupq.OpenPublisher(ctxFor(t, 10*time.Second), url, dedupq.PublisherOptions{Retry: &policy, ConsumerDedupTTL: tc.ttl})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("OpenPublisher: %v", err)
				}
				defer pub.Close(t.Context())
				if _, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: "m", Body: []byte("b"), GroupKey: "g"}); err != nil {
					t.Fatalf("Publish: %v", err)
				}
				return
			}
			var ue *window.UnsafeRetryError
			if !errors.As(err, &ue) || !errors.Is(err, window.ErrUnsafeRetry) {
				t.Fatalf("OpenPublisher err = %v, want an UnsafeRetryError", err)
			}
			t.Logf("refused: %v", err)
			if ue.Span != span || ue.Window.Backend != "sqs" || ue.Window.Duration != 5*time.Minute {
				t.Errorf("error numbers: span %s, window %v", ue.Span, ue.Window)
			}
			msg := err.Error()
			head, fixes, _ := strings.Cut(msg, "; fix: ")
			if head != tc.wantErr {
				t.Errorf("error text:\n got %s\nwant %s", head, tc.wantErr)
			}
			if fixes != tc.wantFix {
				t.Errorf("fixes:\n got %s\nwant %s", fixes, tc.wantFix)
			}
		})
	}
}

// ttlDedup is a Deduplicator that only declares a TTL: the consumer's
// startup check is what is under test.
type ttlDedup time.Duration

func (d ttlDedup) Wrap(h dedupq.Handler) dedupq.Handler { return h }
func (d ttlDedup) TTL() time.Duration                   { return time.Duration(d) }

// TestConsumerCheckUsesQueueRedelivery: the consumer's startup check
// compares the dedup store's TTL with the redelivery span built from the
// queue's real VisibilityTimeout and RedrivePolicy.maxReceiveCount.
func TestConsumerCheckUsesQueueRedelivery(t *testing.T) {
	c := needFauxqs(t)
	dlq, _ := newQueue(t, c, nil)
	redrive := `{"deadLetterTargetArn":"` + queueArn(t, c, dlq) + `","maxReceiveCount":5}`
	for _, tc := range []struct {
		name    string
		attrs   map[string]string
		ttl     time.Duration
		wantErr string
	}{
		// 5 deliveries × 60s = 5m; 20% margin: a TTL of at least 6m15s.
		{"TTL covers 5 × 60s", map[string]string{"VisibilityTimeout": "60", "RedrivePolicy": redrive}, 10 * time.Minute, ""},
		{"TTL too short for 5 × 60s", map[string]string{"VisibilityTimeout": "60", "RedrivePolicy": redrive}, 5 * time.Minute,
			"fix: raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 5m to ≥ 6m15s" +
				", or lower the maxReceiveCount of the queue's redrive policy (URL parameter max_deliveries when create=true makes the queue) from 5 to 4" +
				", or lower the visibility timeout (the queue's VisibilityTimeout, or Options.VisibilityTimeout, URL parameter ack_wait, which overrides it) from 1m to 48s"},
		{"no redrive policy: unlimited", map[string]string{"VisibilityTimeout": "60"}, 24 * time.Hour,
			"fix: set the maxReceiveCount of the queue's redrive policy (URL parameter max_deliveries when create=true makes the queue) to at most 1000 (deliveries are unlimited now)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := newQueue(t, c, tc.attrs)
			sub, err := sqs.OpenSubscription(t.Context(), c, url, nil)
			if err != nil {
				t.Fatal(err)
			}
			con, err := dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Dedup: ttlDedup(tc.ttl)})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("NewConsumer: %v", err)
				}
				con.Close(t.Context())
				return
			}
			sub.Close()
			if !errors.Is(err, window.ErrUnsafeRetry) || !strings.HasSuffix(err.Error(), tc.wantErr) {
				t.Fatalf("NewConsumer err = %v, want an unsafe-retry error suggesting %q", err, tc.wantErr)
			}
			t.Logf("refused: %v", err)
		})
	}
}
