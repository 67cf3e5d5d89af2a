package jetstream

// A publish whose PubAck never comes, on the embedded nats-server and the
// local server at 127.0.0.1:4222 (see servers_test.go for when the latter
// is skipped): the stream is deleted under an open topic and a plain
// subscriber that never answers takes its subject, so that a publish finds
// a responder (no "no responders" answer) but no PubAck.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// TestUnansweredPublishIsMaybeSentAndFreed: a message whose PubAck did not
// come within the context is reported maybe sent (never stored), and once
// the call returned the client keeps nothing of it: no pending publish,
// no reply subscription. Before, the client held each such publish, with
// its reply subscription, for a minute after the call gave up.
func TestUnansweredPublishIsMaybeSentAndFreed(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		for _, tc := range []struct {
			name string
			send func(t *testing.T, top *Topic, pub *dedupq.Publisher, ctx context.Context)
		}{
			{"SendBatch", func(t *testing.T, top *Topic, _ *dedupq.Publisher, ctx context.Context) {
				res, err := top.SendBatch(ctx, []*driver.Message{{ID: "a", Body: []byte("a")}, {ID: "b", Body: []byte("b")}})
				if err != nil {
					t.Fatalf("SendBatch: %v", err)
				}
				for i, r := range res {
					if r.Err == nil || !top.IsRetryable(r.Err) || !errors.Is(r.Err, context.DeadlineExceeded) {
						t.Errorf("message %d: %+v, want a retryable error that wraps the context's", i, r)
					}
				}
			}},
			{"Publisher", func(t *testing.T, _ *Topic, pub *dedupq.Publisher, ctx context.Context) {
				res, err := pub.Publish(ctx, &dedupq.Message{ID: "a", Body: []byte("a")})
				var pe *dedupq.PublishError
				if !errors.As(err, &pe) || !pe.MaybeSent || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Publish = %+v, %v; want a *PublishError, maybe sent, for the context's deadline", res, err)
				}
				if res.BackendID != "" {
					t.Errorf("Publish reported a stream sequence %q for a message nobody stored", res.BackendID)
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				nc := connect(t, srv)
				cfg := testConfig(t, srv)
				top := openTopic(t, nc, cfg)
				pub, err := dedupq.NewPublisher(ctxT(t), top, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
				if err != nil {
					t.Fatal(err)
				}
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				if err := js.DeleteStream(ctxT(t), cfg.Stream); err != nil {
					t.Fatal(err)
				}
				silent, err := nc.SubscribeSync(cfg.Subject)
				if err != nil {
					t.Fatal(err)
				}
				defer silent.Unsubscribe()
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
				subs := nc.NumSubscriptions()

				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				tc.send(t, top, pub, ctx)

				// The message did reach the subject: it was handed over,
				// not refused before sending.
				if _, err := silent.NextMsg(5 * time.Second); err != nil {
					t.Errorf("the silent subscriber got nothing: %v", err)
				}
				if n := nc.NumSubscriptions(); n != subs {
					t.Errorf("%d subscriptions on the connection after the call returned, %d before it: the abandoned publishes are still held", n, subs)
				}
				top.pubsMu.Lock()
				defer top.pubsMu.Unlock()
				for _, js := range top.pubs {
					if n := js.PublishAsyncPending(); n > 0 {
						t.Errorf("an idle publish context holds %d pending publishes", n)
					}
				}
			})
		}
	})
}

// TestCloseDropsReplySubscriptions: a topic on a connection the caller
// keeps leaves no subscription behind once closed; its idle publish
// contexts each hold a reply subscription until then.
func TestCloseDropsReplySubscriptions(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		// The stream exists before the count, so that the count includes
		// whatever its creation left on the connection.
		openTopic(t, nc, cfg).Close()
		before := nc.NumSubscriptions()
		top := openTopic(t, nc, cfg)
		if res := send(t, top, &driver.Message{ID: "a", Body: []byte("a")}); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		top.Close()
		if n := nc.NumSubscriptions(); n != before {
			t.Errorf("%d subscriptions after the topic closed, %d before it opened", n, before)
		}
	})
}
