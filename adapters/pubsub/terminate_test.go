package pubsub_test

// Terminate on a subscription with a dead-letter policy nacks the message
// and each of its redeliveries unseen, for Pub/Sub to forward it to the
// dead-letter topic once it has counted max_delivery_attempts. Talks to
// pstest, with the dead-letter policy removed on the server after the
// adapter read it: Pub/Sub counts delivery attempts, and so forwards, only
// while the dead-letter topic and its permissions are right, and the count
// is approximate and may reset to zero ("Handle message failures", "How
// maximum delivery attempts are calculated",
// https://cloud.google.com/pubsub/docs/handling-failures; the
// DeadLetterPolicy reference: "honored on a best effort basis"). The
// adapter's loop must end on its own.

import (
	"context"
	"testing"
	"time"

	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/driver"
)

func TestTerminateLoopEnds(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attempts int
	}{
		{"the default 5 attempts", 5},
		{"7 attempts", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := pstestServer()
			c := srv.client(t)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			f := srv.create(ctx, t, c, subConfig{maxDeliveries: tc.attempts})
			sub, err := dpubsub.OpenSubscription(ctx, c, f.sub, srv.options())
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			events := make(chan string, 1000)
			dpubsub.ObserveTerminated(sub, func(_, op string) {
				select {
				case events <- op:
				default:
				}
			})
			dropDeadLetterPolicy(ctx, t, srv, f.sub)
			tp, err := dpubsub.OpenTopic(ctx, c, f.topic, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tp.Close()
			if res, err := tp.SendBatch(ctx, []*driver.Message{{ID: "poison", Body: []byte("x")}}); err != nil || res[0].Err != nil {
				t.Fatalf("SendBatch: %v %+v", err, res)
			}
			d := receiveOne(ctx, t, sub)
			if err := sub.Terminate(ctx, d, nil); err != nil {
				t.Fatal(err)
			}
			// The bound: twice the attempts the service should have
			// counted, for its count is approximate; then the adapter
			// drops the message, as Terminate does without a dead-letter
			// topic.
			bound := 2 * tc.attempts
			nacks := 0
			for {
				select {
				case op := <-events:
					if op == "ack" {
						t.Logf("dropped after %d unseen nacks", nacks)
						return
					}
					if nacks++; nacks > bound {
						t.Fatalf("a terminated message was nacked unseen %d times and never dropped: with no dead-lettering (the count not kept), the loop does not end", nacks)
					}
				case <-ctx.Done():
					t.Fatalf("after %d unseen nacks, no redelivery for the loop to end on: %v", nacks, ctx.Err())
				}
			}
		})
	}
}
