package pubsub_test

// Adapter-specific tests. The startup check and the URL parser run against
// pstest (the in-process fake); exactly-once ack results need the official
// emulator, because pstest reports every ack as Success and accepts stale
// ack IDs (see conformance_test.go).

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// TestStartupCheck: Pub/Sub has no publish-side window, so any retrying
// publisher is refused unless it declares consumer-side dedup.
func TestStartupCheck(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{})
	def := window.DefaultRetryPolicy()
	cases := []struct {
		name    string
		opts    dedupq.PublisherOptions
		refused string // substring of the error; empty means accepted
	}{
		{"default retries, no dedup declared", dedupq.PublisherOptions{Retry: &def},
			"dedupq: unsafe publisher retry policy: worst-case span 51.5s has nothing to protect it: pubsub has no publish-side dedup window (documented, scope topic projects/dedupq-test/topics/"},
		{"the fix is named", dedupq.PublisherOptions{Retry: &def},
			") and no consumer-side dedup was declared (PublisherOptions.ConsumerDedupTTL); fix: declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 1m5s, and ConsumerOptions.PublisherSpan to 51.5s on the consumers, whose TTL must also cover their redelivery span, or set PublisherOptions.Retry.MaxAttempts to 1 (no retries)"},
		{"nil policy means the default", dedupq.PublisherOptions{}, "has nothing to protect it"},
		{"default retries, consumer dedup declared", dedupq.PublisherOptions{Retry: &def, ConsumerDedupTTL: 24 * time.Hour}, ""},
		{"no retries", dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}}, ""},
		{"TTL too short for the span", dedupq.PublisherOptions{Retry: &def, ConsumerDedupTTL: time.Minute}, "exceeds the declared consumer dedup TTL 1m less a 20% safety margin = 48s (PublisherOptions.ConsumerDedupTTL; pubsub has no publish-side dedup window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, nil)
			if err != nil {
				t.Fatalf("OpenTopic: %v", err)
			}
			if h := tp.HiddenRetrySpan(); h != 0 {
				t.Errorf("HiddenRetrySpan = %s on a NewClient client, want 0", h)
			}
			p, err := dedupq.NewPublisher(t.Context(), tp, tc.opts)
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("NewPublisher: %v, want accepted", err)
				}
				p.Close(context.Background())
				return
			}
			defer tp.Close()
			var ue *window.UnsafeRetryError
			if !errors.As(err, &ue) || !errors.Is(err, window.ErrUnsafeRetry) {
				t.Fatalf("NewPublisher error %v, want a *window.UnsafeRetryError", err)
			}
			t.Logf("refused as expected: %v", err)
			if !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.refused)
			}
		})
	}
}

// ttlDedup is a Deduplicator that only declares a TTL: the consumer's
// startup check is what is under test.
type ttlDedup time.Duration

func (d ttlDedup) Wrap(h dedupq.Handler) dedupq.Handler { return h }
func (d ttlDedup) TTL() time.Duration                   { return time.Duration(d) }

// TestConsumerFixesNameSubscriptionSettings: the consumer's fixes name the
// subscription's settings, read from the server: the message retention,
// which bounds redelivery, and never max_delivery_attempts, which does not
// (see redelivery_bound_test.go).
func TestConsumerFixesNameSubscriptionSettings(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	const retention = "the subscription's message retention (message_retention_duration, 10m to 31d)"
	for _, tc := range []struct {
		name string
		cfg  subConfig
		ttl  time.Duration
		want string // the fixes
	}{
		// Delivered until 1h after the first, each delivery held 20s:
		// 1h20s, and a 10m retention (10m20s) fits the 24m a 30m TTL leaves.
		{"dead-letter policy: its attempts are no bound", subConfig{ackDeadline: 20 * time.Second, maxDeliveries: 5, retention: time.Hour}, 30 * time.Minute,
			"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 30m to ≥ 1h15m25s" +
				", or lower " + retention + " from 1h to 23m40s"},
		{"no dead-letter policy", subConfig{ackDeadline: 20 * time.Second, retention: time.Hour}, 30 * time.Minute,
			"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 30m to ≥ 1h15m25s" +
				", or lower " + retention + " from 1h to 23m40s"},
		{"no retention short enough: only the TTL", subConfig{ackDeadline: 20 * time.Second}, 10 * time.Minute,
			"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 10m to ≥ 8d18h25s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := srv.create(t.Context(), t, c, tc.cfg)
			sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()
			_, err = dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Dedup: ttlDedup(tc.ttl)})
			var ue *window.UnsafeRetryError
			if !errors.As(err, &ue) {
				t.Fatalf("NewConsumer = %v, want a *window.UnsafeRetryError", err)
			}
			if got := strings.Join(ue.Fixes, ", or "); got != tc.want {
				t.Errorf("fixes:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestHiddenRetrySpan: a client whose Publish calls retry on their own may
// store a message twice within one attempt, which the topic must declare.
func TestHiddenRetrySpan(t *testing.T) {
	srv := pstestServer()
	retrying, err := gpubsub.NewClient(t.Context(), "dedupq-test", optionsFor(srv.addr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer retrying.Close()
	f := srv.create(t.Context(), t, srv.client(t), subConfig{})
	tp, err := dpubsub.OpenTopic(t.Context(), retrying, f.topic, &dpubsub.Options{PublishTimeout: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if h := tp.HiddenRetrySpan(); h != 7*time.Second {
		t.Errorf("HiddenRetrySpan = %s with the client's default retries, want PublishTimeout 7s", h)
	}
	_, err = dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		t.Errorf("NewPublisher without retries on a retrying client: %v, want refused", err)
	}
}

func TestIsRetryable(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", status.Error(codes.Unavailable, "x"), true},
		{"deadline exceeded", status.Error(codes.DeadlineExceeded, "x"), true},
		{"internal", status.Error(codes.Internal, "x"), true},
		{"internal invalid UTF-8", status.Error(codes.Internal, "grpc: error while marshaling: string field contains invalid UTF-8"), false},
		{"invalid argument", status.Error(codes.InvalidArgument, "x"), false},
		{"not found", status.Error(codes.NotFound, "x"), false},
		{"permission denied", status.Error(codes.PermissionDenied, "x"), false},
		{"paused ordering key", gpubsub.ErrPublishingPaused{OrderingKey: "k"}, true},
		{"earlier message failed", dpubsub.ErrEarlierFailed, true},
		{"context deadline", context.DeadlineExceeded, true},
		{"closed", dpubsub.ErrClosed, false},
		{"oversized", gpubsub.ErrOversizedMessage, false},
		{"ack not confirmed", &dpubsub.AckError{Status: gpubsub.AcknowledgeStatusInvalidAckID}, false},
		{"unknown error", errors.New("lost"), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := dpubsub.IsRetryable(tc.err); got != tc.want {
				t.Errorf("IsRetryable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{})
	tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	lim := tp.Limits()
	names := []struct {
		name string
		ok   bool
	}{
		{"color", true},
		{dpubsub.AttrID, false},
		{"dedupq-other", false},
		{"googkey", false},
		{strings.Repeat("k", 256), true},
		{strings.Repeat("k", 257), false},
	}
	for _, n := range names {
		if got := lim.AttributeNameAllowed(n.name); got != n.ok {
			t.Errorf("AttributeNameAllowed(%.20q) = %v, want %v", n.name, got, n.ok)
		}
	}
	if lim.MaxAttributes != 99 || lim.MaxAttributeValueBytes != 1024 || lim.MaxMessageBytes != 10_000_000 || lim.MaxGroupKeyLength != 1024 {
		t.Errorf("Limits = %+v, want Pub/Sub's less the ID attribute", lim)
	}
	checks := []struct {
		name  string
		msg   driver.Message
		field string
	}{
		{"fits", driver.Message{ID: "a", Body: []byte("x")}, ""},
		{"invalid UTF-8 value", driver.Message{ID: "a", Attributes: map[string]string{"k": "\xff"}}, "Attributes"},
		{"over the request size once encoded", driver.Message{ID: strings.Repeat("i", 1024), Body: make([]byte, 10_000_000-1024)}, "Body"},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			field, err := lim.Check(&tc.msg)
			if field != tc.field || (err == nil) != (tc.field == "") {
				t.Errorf("Check = %q, %v; want field %q", field, err, tc.field)
			}
		})
	}
}

// TestSendBatchOrdered: a batch with ordering keys is stored in order, each
// message under its own ID, with the dedup ID in the attribute.
func TestSendBatchOrdered(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{ordering: true})
	tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	msgs := []*driver.Message{
		{ID: "a1", Body: []byte("1"), GroupKey: "a"},
		{ID: "n1", Body: []byte("2")},
		{ID: "a2", Body: []byte("3"), GroupKey: "a"},
		{ID: "b1", Body: []byte("4"), GroupKey: "b"},
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := tp.SendBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.BackendID == "" || r.Duplicate {
			t.Errorf("result %d = %+v, want stored", i, r)
		}
	}
	sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, srv.options())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := map[string]string{}
	var order []string
	for len(got) < len(msgs) {
		ds, err := sub.Receive(ctx, 10)
		if err != nil {
			t.Fatalf("Receive: %v (got %v)", err, got)
		}
		for _, d := range ds {
			got[d.Message.ID] = d.Message.GroupKey
			if d.Message.GroupKey == "a" {
				order = append(order, d.Message.ID)
			}
			if err := sub.Ack(ctx, d); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	if strings.Join(order, ",") != "a1,a2" {
		t.Errorf("key a delivered as %v, want a1 then a2", order)
	}
	if got["b1"] != "b" || got["n1"] != "" {
		t.Errorf("group keys %v, want b1 in b and n1 in none", got)
	}
}

// TestExactlyOnceAck: on an exactly-once subscription the ack of a
// superseded ack ID is refused by the service and reported as an
// *AckError, while the current one is confirmed. Emulator only: pstest
// confirms every ack.
func TestExactlyOnceAck(t *testing.T) {
	srv := emulatorServer(t)
	c := srv.client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	f := srv.create(ctx, t, c, subConfig{exactlyOnce: true, ackDeadline: 10 * time.Second})
	tp, err := dpubsub.OpenTopic(ctx, c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	// The client stops extending after MaxExtension, so the first delivery's
	// ack ID expires and the message comes back under a new one.
	sub, err := dpubsub.OpenSubscription(ctx, c, f.sub, &dpubsub.Options{AckExtension: 10 * time.Second, MaxExtension: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if !sub.Info().ExactlyOnce {
		t.Fatalf("Info().ExactlyOnce = false on an exactly-once subscription")
	}
	if res, err := tp.SendBatch(ctx, []*driver.Message{{ID: "eod-1", Body: []byte("x")}}); err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
	first := receiveOne(ctx, t, sub)
	second := receiveOne(ctx, t, sub)
	if first.BackendID != second.BackendID || second.Attempt != 2 {
		t.Fatalf("redelivery %+v after %+v: want the same message as attempt 2", second, first)
	}
	err = sub.Ack(ctx, first)
	var ae *dpubsub.AckError
	if !errors.As(err, &ae) || ae.Status == gpubsub.AcknowledgeStatusSuccess {
		t.Fatalf("Ack with the superseded ack ID = %v, want an *AckError", err)
	}
	t.Logf("stale ack refused as expected: %v", err)
	if err := sub.Ack(ctx, second); err != nil {
		t.Fatalf("Ack with the current ack ID: %v", err)
	}
}

func receiveOne(ctx context.Context, t *testing.T, sub *dpubsub.Subscription) *driver.Delivery {
	t.Helper()
	ds, err := sub.Receive(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d deliveries, %v", len(ds), err)
	}
	return ds[0]
}

func TestParseURL(t *testing.T) {
	cases := []struct {
		url   string
		param string // the *dedupq.ParamError's; empty means valid
		want  dpubsub.URLConfig
	}{
		{"pubsub://my-project/orders", "", dpubsub.URLConfig{Project: "my-project", ID: "orders"}},
		{"pubsub://p1x/orders?emulator=127.0.0.1:8085&ack_wait=30s&max_extension=10m&max_outstanding=50&publish_timeout=5s", "",
			dpubsub.URLConfig{Project: "p1x", ID: "orders", Emulator: "127.0.0.1:8085", Options: dpubsub.Options{
				AckExtension: 30 * time.Second, MaxExtension: 10 * time.Minute, MaxOutstandingMessages: 50, PublishTimeout: 5 * time.Second}}},
		{"pubsub:///orders", "project", dpubsub.URLConfig{}},
		{"pubsub://Bad_Project/orders", "project", dpubsub.URLConfig{}},
		{"pubsub://p1x:8085/orders", "project", dpubsub.URLConfig{}},
		{"pubsub://p1x", "id", dpubsub.URLConfig{}},
		{"pubsub://p1x/a/b", "id", dpubsub.URLConfig{}},
		{"pubsub://p1x/ab", "id", dpubsub.URLConfig{}},
		{"pubsub://p1x/goog-orders", "id", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?nope=1", "nope", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?emulator=localhost", "emulator", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?ack_wait=5s", "ack_wait", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?max_outstanding=0", "max_outstanding", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?publish_timeout=soon", "publish_timeout", dpubsub.URLConfig{}},
		{"pubsub://p1x/orders?max_outstanding=1&max_outstanding=2", "max_outstanding", dpubsub.URLConfig{}},
		{"pubsub://user:pw@p1x/orders", "credentials", dpubsub.URLConfig{}},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			got, err := dpubsub.ParseURL(u)
			if tc.param == "" {
				if err != nil || got != tc.want {
					t.Errorf("ParseURL = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param {
				t.Errorf("ParseURL error %v, want a *dedupq.ParamError for %q", err, tc.param)
			}
		})
	}
}

// TestOpenByURL: the registered opener reaches pstest through the emulator
// parameter, publishes and consumes.
func TestOpenByURL(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{})
	topicID, subID := f.topic[strings.LastIndex(f.topic, "/")+1:], f.sub[strings.LastIndex(f.sub, "/")+1:]
	base := "pubsub://" + c.Project() + "/"
	q := "?emulator=" + srv.addr
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	pub, err := dedupq.OpenPublisher(ctx, base+topicID+q, dedupq.PublisherOptions{ConsumerDedupTTL: time.Hour})
	if err != nil {
		t.Fatalf("OpenPublisher: %v", err)
	}
	defer pub.Close(context.Background())
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "by-url", Body: []byte("hi")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	con, err := dedupq.OpenConsumer(ctx, base+subID+q, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	defer con.Close(ctx)
	rctx, stop := context.WithCancel(ctx)
	var got string
	err = con.Run(rctx, func(_ context.Context, d *dedupq.Delivery) error {
		got = d.Message.ID
		stop()
		return nil
	})
	if err != nil || got != "by-url" {
		t.Errorf("Run = %v, got %q; want by-url", err, got)
	}
	if _, err := dedupq.OpenPublisher(ctx, base+"missing-topic"+q, dedupq.PublisherOptions{}); err == nil {
		t.Errorf("OpenPublisher on a missing topic succeeded")
	}
}

// TestWindowNamesExactlyOnce: the consumer's window says whether the
// subscription rules out redelivery after a successful ack, so that a
// startup error shows it.
func TestWindowNamesExactlyOnce(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	for _, eo := range []bool{false, true} {
		f := srv.create(t.Context(), t, c, subConfig{exactlyOnce: eo})
		sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, srv.options())
		if err != nil {
			t.Fatal(err)
		}
		w, err := sub.Window(t.Context())
		sub.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: "exactly-once delivery off", true: "exactly-once delivery on"}[eo]
		if !strings.Contains(w.String(), want) || w.Kind != window.KindNone {
			t.Errorf("exactly-once %v: window %q, want KindNone mentioning %q", eo, w, want)
		}
	}
}
