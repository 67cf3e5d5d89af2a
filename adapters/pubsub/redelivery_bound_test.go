package pubsub_test

// Issue 29, item 2: max_delivery_attempts is not a bound. These tests talk
// to pstest (the in-process fake, in its child process), made to behave as
// the documentation says the service may: it counts delivery attempts only
// while the subscription has a working dead-letter topic, so removing the
// dead-letter policy on the server while the adapter still knows it stands
// for a count that is not kept.
//
// The documentation:
//   - "Handle message failures", section "How maximum delivery attempts are
//     calculated" (https://cloud.google.com/pubsub/docs/handling-failures):
//     Pub/Sub counts delivery attempts only when the dead-letter topic and
//     its permissions are right, it forwards after "approximately" the
//     configured number of attempts, and the count may reset to zero.
//   - DeadLetterPolicy.max_delivery_attempts (google.pubsub.v1 reference):
//     "This field will be honored on a best effort basis."
//   - Subscription.message_retention_duration: "How long to retain
//     unacknowledged messages in the subscription's backlog, from the
//     moment a message is published"; default 7 days, 10 minutes to 31
//     days ("Subscription properties"). That is the bound left.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// dropDeadLetterPolicy removes the dead-letter policy on the server, which
// then counts and forwards nothing, as the service does when its
// permissions on the dead-letter topic are missing.
func dropDeadLetterPolicy(ctx context.Context, t *testing.T, srv server, sub string) {
	t.Helper()
	c := srv.client(t)
	_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"dead_letter_policy"}},
	})
	if err != nil {
		t.Fatalf("removing the dead-letter policy: %v", err)
	}
}

// TestMaxDeliveryAttemptsIsNoBound: a subscription whose dead-letter policy
// says 5 attempts delivers a message a 6th time when the service does not
// count; the redelivery policy the check reads must not promise 5, and a
// dedup TTL that covers 5 attempts but not the message retention must be
// refused with a fix that names the retention.
func TestMaxDeliveryAttemptsIsNoBound(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const attempts = 5
	f := srv.create(ctx, t, c, subConfig{ackDeadline: 10 * time.Second, maxDeliveries: attempts, retention: time.Hour})
	sub, err := dpubsub.OpenSubscription(ctx, c, f.sub, &dpubsub.Options{AckExtension: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	r, err := sub.Redelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The double, as documented: the count is not kept, and a message
	// nacked 5 times comes a 6th.
	dropDeadLetterPolicy(ctx, t, srv, f.sub)
	tp, err := dpubsub.OpenTopic(ctx, c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if res, err := tp.SendBatch(ctx, []*driver.Message{{ID: "beyond-5", Body: []byte("x")}}); err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
	delivered := 0
	for delivered <= attempts {
		d := receiveOne(ctx, t, sub)
		delivered++
		if delivered <= attempts {
			if err := sub.Nack(ctx, d, 0); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := sub.Ack(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	if !r.Unlimited() && r.MaxDeliveries < delivered {
		t.Errorf("Redelivery() = %s: it promises at most %d deliveries, but the message was delivered %d times (the attempts are counted on a best-effort basis)",
			r, r.MaxDeliveries, delivered)
	}

	// The check on that policy: a TTL that covers the attempts (5 × 10s
	// plus 4 holds of 10s: 1m30s) but not the retention of 1h.
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		refused string // a substring of the error; empty: accepted
		fix     string // a substring of the fixes
	}{
		{"a TTL over the attempts only", 20 * time.Minute, "redelivery: deliveries bounded only by the message's expiry",
			"lower the subscription's message retention (message_retention_duration"},
		{"a TTL over the retention", 76 * time.Minute, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := window.ConsumerPlan{Redelivery: r, Window: mustWindow(t, sub), DedupTTL: tc.ttl}
			err := window.CheckConsumer(plan)
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("CheckConsumer(%s) = %v, want accepted", tc.ttl, err)
				}
				return
			}
			var ue *window.UnsafeRetryError
			if !errors.As(err, &ue) {
				t.Fatalf("CheckConsumer with TTL %s over redelivery %s = %v: accepted, though a redelivery may come until the message retention (1h) ends", tc.ttl, r, err)
			}
			t.Logf("refused as expected: %v", err)
			if !strings.Contains(err.Error(), tc.refused) || !strings.Contains(strings.Join(ue.Fixes, "\n"), tc.fix) {
				t.Errorf("error %q\nwant it to contain %q and a fix containing %q", err, tc.refused, tc.fix)
			}
		})
	}
}

func mustWindow(t *testing.T, sub *dpubsub.Subscription) window.Window {
	t.Helper()
	w, err := sub.Window(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestGuardTTLOverAttemptsRefused is the same through NewConsumer, on the
// default retention (7 days, read from the server): a Guard whose TTL
// covers max_delivery_attempts × ack deadline is refused.
func TestGuardTTLOverAttemptsRefused(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{ackDeadline: 10 * time.Second, maxDeliveries: 5})
	sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, &dpubsub.Options{AckExtension: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_, err = dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Dedup: ttlDedup(24 * time.Hour)})
	var ue *window.UnsafeRetryError
	if !errors.As(err, &ue) {
		t.Fatalf("NewConsumer with a 24h TTL = %v: accepted, though the subscription retains (and may redeliver) a message for 7d", err)
	}
	t.Logf("refused as expected: %v", err)
	if !strings.Contains(err.Error(), "none started later than 7d after the first (message expiry, discovered from the broker)") {
		t.Errorf("error %q does not name the retention as discovered", err)
	}
}
