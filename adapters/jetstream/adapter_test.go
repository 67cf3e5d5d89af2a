package jetstream

// Driver behaviour against real NATS servers: the embedded nats-server that
// TestMain starts and the local server at 127.0.0.1:4222 (see
// servers_test.go for when the latter is skipped).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// eventually polls cond until it holds, failing t after a deadline with
// cond's last description of the state.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still %s after 5s", what, state)
		}
		<-tick.C
	}
}

func openTopic(t *testing.T, nc *nats.Conn, cfg Config) *Topic {
	t.Helper()
	top, err := OpenTopic(ctxT(t), nc, cfg)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	t.Cleanup(func() { top.Close() })
	// As dedupq.NewPublisher does once its check passed.
	if err := top.Provision(ctxT(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return top
}

func openSub(t *testing.T, nc *nats.Conn, cfg Config) *Subscription {
	t.Helper()
	sub, err := OpenSubscription(ctxT(t), nc, cfg)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	t.Cleanup(func() { sub.Close() })
	// As dedupq.NewConsumer does once its check passed.
	if err := sub.Provision(ctxT(t)); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return sub
}

func send(t *testing.T, top *Topic, msgs ...*driver.Message) []driver.SendResult {
	t.Helper()
	res, err := top.SendBatch(ctxT(t), msgs)
	if err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	if len(res) != len(msgs) {
		t.Fatalf("SendBatch returned %d results for %d messages", len(res), len(msgs))
	}
	return res
}

// receiveN receives until n deliveries arrived, within a deadline.
func receiveN(t *testing.T, sub *Subscription, n int) []*driver.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []*driver.Delivery
	for len(out) < n {
		ds, err := sub.Receive(ctx, n-len(out))
		if err != nil {
			t.Fatalf("Receive after %d of %d deliveries: %v", len(out), n, err)
		}
		out = append(out, ds...)
	}
	return out
}

// expectNone checks that nothing is delivered within d.
func expectNone(t *testing.T, sub *Subscription, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := sub.Receive(ctx, 10)
	if len(ds) > 0 {
		t.Fatalf("got %d unexpected deliveries, first %q attempt %d", len(ds), ds[0].Message.ID, ds[0].Attempt)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive on an empty consumer: %v, want the context's deadline", err)
	}
}

func TestSendBatchDedup(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		top := openTopic(t, connect(t, srv), testConfig(t, srv))
		a := &driver.Message{ID: "a", Body: []byte("A")}
		b := &driver.Message{ID: "b", Body: []byte("B")}
		res := send(t, top, a, a, b)
		want := []driver.SendResult{{BackendID: "1"}, {BackendID: "1", Duplicate: true}, {BackendID: "2"}}
		for i := range want {
			if res[i] != want[i] {
				t.Errorf("result %d = %+v, want %+v", i, res[i], want[i])
			}
		}
		if again := send(t, top, b); again[0] != (driver.SendResult{BackendID: "2", Duplicate: true}) {
			t.Errorf("resend in a later batch = %+v, want a duplicate of sequence 2", again[0])
		}
	})
}

func TestSendBatchPerMessageOutcome(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		top := openTopic(t, connect(t, srv), testConfig(t, srv))
		msgs := []*driver.Message{
			{ID: "ok-1", Body: []byte("1")},
			{ID: "bad-value", Body: []byte("2"), Attributes: map[string]string{"a": "line\r\nNats-Rollup: all"}},
			{ID: "ok-2", Body: []byte("3"), GroupKey: "eu"},
		}
		res := send(t, top, msgs...)
		if res[0].Err != nil || res[2].Err != nil || res[0].BackendID != "1" || res[2].BackendID != "2" {
			t.Errorf("valid messages: %+v and %+v, want sequences 1 and 2", res[0], res[2])
		}
		if res[1].Err == nil || top.IsRetryable(res[1].Err) {
			t.Errorf("message with a CRLF header value: %+v, want a non-retryable error", res[1])
		}
		if top.MaxBatch() != DefaultMaxBatch {
			t.Errorf("MaxBatch = %d, want %d", top.MaxBatch(), DefaultMaxBatch)
		}
		tooMany := make([]*driver.Message, top.MaxBatch()+1)
		if _, err := top.SendBatch(ctxT(t), tooMany); err == nil {
			t.Errorf("SendBatch over MaxBatch succeeded")
		}
	})
}

func TestSendBatchCancelled(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		top := openTopic(t, connect(t, srv), testConfig(t, srv))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		res, err := top.SendBatch(ctx, []*driver.Message{{ID: "x", Body: []byte("x")}})
		if err != nil || res[0].Err == nil || !top.IsRetryable(res[0].Err) {
			t.Errorf("SendBatch with a cancelled context = %+v, %v; want a retryable per-message error", res, err)
		}
	})
}

func TestWindowDiscovered(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		top := openTopic(t, nc, cfg)
		sub := openSub(t, nc, cfg)
		want := window.Window{Backend: "jetstream", Duration: cfg.Duplicates, Kind: window.KindConfigured,
			Source: window.SourceDiscovered, Scope: "stream " + cfg.Stream, Settings: settings()}
		for name, w := range map[string]func(context.Context) (window.Window, error){"topic": top.Window, "subscription": sub.Window} {
			got, err := w(ctxT(t))
			if err != nil || got != want {
				t.Errorf("%s Window = %+v, %v; want %+v", name, got, err, want)
			}
		}

		// A publisher whose span fits the 2s window, until the window
		// shrinks under it.
		pub, err := dedupq.NewPublisher(ctxT(t), top, dedupq.PublisherOptions{Retry: &window.RetryPolicy{
			MaxAttempts: 2, InitialBackoff: 100 * time.Millisecond, AttemptTimeout: 500 * time.Millisecond,
		}})
		if err != nil {
			t.Fatalf("NewPublisher: %v", err)
		}
		js, _ := jetstream.New(nc)
		stream, err := js.Stream(ctxT(t), cfg.Stream)
		if err != nil {
			t.Fatal(err)
		}
		sc := stream.CachedInfo().Config
		sc.Duplicates = time.Second
		if _, err := js.UpdateStream(ctxT(t), sc); err != nil {
			t.Fatalf("UpdateStream: %v", err)
		}
		err = pub.Recheck(ctxT(t))
		if !errors.Is(err, window.ErrUnsafeRetry) {
			t.Errorf("Recheck after the window shrank to 1s: %v, want an unsafe retry error", err)
		}
		if got := pub.Window().Duration; got != time.Second {
			t.Errorf("window after Recheck = %s, want the new 1s", got)
		}
	})
}

func TestLimitsFromServer(t *testing.T) {
	ctx := ctxT(t)
	url, stop, err := embedded.Start(ctx, embedded.Options{MaxPayload: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	small := server{"embedded-4k", url}
	cases := []struct {
		name      string
		srv       server
		maxMsg    int32
		wantBelow int64
	}{
		{"max_payload 1 MiB", server{"embedded", embeddedURL}, 0, 1 << 20},
		{"max_payload 4 KiB", small, 0, 4096},
		{"stream max_msg_size 2 KiB", server{"embedded", embeddedURL}, 2048, 2048},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc := connect(t, tc.srv)
			cfg := testConfig(t, tc.srv)
			if tc.maxMsg > 0 {
				js, _ := jetstream.New(nc)
				_, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Subject, cfg.Subject + ".>"},
					Storage: jetstream.MemoryStorage, Duplicates: cfg.Duplicates, MaxMsgSize: tc.maxMsg})
				if err != nil {
					t.Fatal(err)
				}
			}
			top := openTopic(t, nc, cfg)
			lim := top.Limits()
			if int64(lim.MaxMessageBytes) >= tc.wantBelow || int64(lim.MaxMessageBytes) < tc.wantBelow-1024 {
				t.Fatalf("MaxMessageBytes = %d, want just below %d", lim.MaxMessageBytes, tc.wantBelow)
			}
			// The largest message the limits allow is stored...
			m := &driver.Message{ID: strings.Repeat("i", lim.MaxIDLength), Attributes: map[string]string{}}
			for i := range lim.MaxAttributes {
				m.Attributes["k"+strconv.Itoa(i)] = "v"
			}
			m.Body = bytes.Repeat([]byte("x"), lim.MaxMessageBytes-m.Size())
			if res := send(t, top, m); res[0].Err != nil {
				t.Errorf("message of exactly MaxMessageBytes: %v", res[0].Err)
			}
			// ...and the Publisher refuses one byte more before sending.
			pub, err := dedupq.NewPublisher(ctxT(t), top, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
			if err != nil {
				t.Fatal(err)
			}
			big := &dedupq.Message{ID: "big", Body: make([]byte, lim.MaxMessageBytes+1)}
			if _, err := pub.Publish(ctxT(t), big); !errors.Is(err, dedupq.ErrInvalidMessage) {
				t.Errorf("Publish of MaxMessageBytes+1: %v, want a validation error", err)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)
		msgs := []*driver.Message{
			{ID: "with-everything", Body: []byte(`{"n":1}`), Attributes: map[string]string{"color": "blue", "Trace-Id": "a b c", "empty": ""}, GroupKey: "eu-1"},
			{ID: "plain", Body: []byte("x")},
			{ID: "empty-body"},
			{ID: `id:with/punctuation!"#$%&'()*+,-.;<=>?@[\]^_{|}~`, Body: []byte("p")},
		}
		res := send(t, top, msgs...)
		ds := receiveN(t, sub, len(msgs))
		for i, d := range ds {
			m := msgs[i]
			if d.Message.ID != m.ID || !bytes.Equal(d.Message.Body, m.Body) || d.Message.GroupKey != m.GroupKey {
				t.Errorf("delivery %d = %+v, want %+v", i, d.Message, *m)
			}
			if len(d.Message.Attributes) != len(m.Attributes) {
				t.Errorf("delivery %d attributes = %v, want %v", i, d.Message.Attributes, m.Attributes)
			}
			for k, v := range m.Attributes {
				if got, ok := d.Message.Attributes[k]; !ok || got != v {
					t.Errorf("delivery %d attribute %q = %q, want %q", i, k, got, v)
				}
			}
			if d.Attempt != 1 || d.BackendID != res[i].BackendID || d.Lease != cfg.AckWait {
				t.Errorf("delivery %d: attempt %d, BackendID %q, lease %s; want 1, %q, %s", i, d.Attempt, d.BackendID, d.Lease, res[i].BackendID, cfg.AckWait)
			}
			if err := sub.Ack(ctxT(t), d); err != nil {
				t.Errorf("Ack: %v", err)
			}
		}
	})
}

func TestSettle(t *testing.T) {
	// A check runs after the settle call, which started at settledAt.
	type check func(t *testing.T, sub *Subscription, d *driver.Delivery, settledAt time.Time)
	redelivered := func(minDelay time.Duration) check {
		return func(t *testing.T, sub *Subscription, d *driver.Delivery, start time.Time) {
			again := receiveN(t, sub, 1)[0]
			if again.Message.ID != d.Message.ID || again.Attempt != 2 {
				t.Errorf("redelivery %q attempt %d, want %q attempt 2", again.Message.ID, again.Attempt, d.Message.ID)
			}
			if waited := time.Since(start); waited < minDelay {
				t.Errorf("redelivered after %s, want at least %s", waited, minDelay)
			}
			if err := sub.Ack(ctxT(t), again); err != nil {
				t.Errorf("Ack of the redelivery: %v", err)
			}
		}
	}
	settled := func(t *testing.T, sub *Subscription, d *driver.Delivery, _ time.Time) {
		// Nothing pending at the server: settled for good. The server
		// applies fire-and-forget acks (Term) asynchronously, so poll.
		eventually(t, "nothing pending or redelivered", func() (bool, string) {
			info, err := sub.cons.Info(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			return info.NumAckPending == 0 && info.NumRedelivered == 0,
				fmt.Sprintf("%d pending, %d redelivered", info.NumAckPending, info.NumRedelivered)
		})
	}
	cases := []struct {
		name   string
		settle func(ctx context.Context, sub *Subscription, d *driver.Delivery) error
		after  check
	}{
		{"ack", func(ctx context.Context, s *Subscription, d *driver.Delivery) error { return s.Ack(ctx, d) }, settled},
		{"ack unconfirmed", func(_ context.Context, s *Subscription, d *driver.Delivery) error { return s.AckUnconfirmed(d) }, settled},
		{"nack", func(ctx context.Context, s *Subscription, d *driver.Delivery) error { return s.Nack(ctx, d, 0) }, redelivered(0)},
		{"nack with delay", func(ctx context.Context, s *Subscription, d *driver.Delivery) error {
			return s.Nack(ctx, d, 300*time.Millisecond)
		}, redelivered(300 * time.Millisecond)},
		{"terminate", func(ctx context.Context, s *Subscription, d *driver.Delivery) error {
			return s.Terminate(ctx, d, errors.New("poison:\nbad payload"))
		}, settled},
		{"terminate without reason", func(ctx context.Context, s *Subscription, d *driver.Delivery) error {
			return s.Terminate(ctx, d, nil)
		}, settled},
		{"not settled: redelivered after the ack wait", func(context.Context, *Subscription, *driver.Delivery) error { return nil },
			redelivered(900 * time.Millisecond)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, srv server) {
				nc := connect(t, srv)
				cfg := testConfig(t, srv)
				top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)
				send(t, top, &driver.Message{ID: "m", Body: []byte("m")})
				d := receiveN(t, sub, 1)[0]
				start := time.Now()
				if err := tc.settle(ctxT(t), sub, d); err != nil {
					t.Fatalf("settle: %v", err)
				}
				tc.after(t, sub, d, start)
			})
		})
	}
}

func TestExtendKeepsDelivery(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)
		send(t, top, &driver.Message{ID: "long", Body: []byte("x")})
		d := receiveN(t, sub, 1)[0]
		// Extend at half the lease for three leases; the message must
		// not come back meanwhile.
		ticker := time.NewTicker(d.Lease / 2)
		defer ticker.Stop()
		deadline := time.After(3 * d.Lease)
	extend:
		for {
			select {
			case <-ticker.C:
				if err := sub.Extend(ctxT(t), d, d.Lease); err != nil {
					t.Fatalf("Extend: %v", err)
				}
			case <-deadline:
				break extend
			}
		}
		info, err := sub.cons.Info(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered != 0 || info.NumAckPending != 1 {
			t.Errorf("after extending: %d redelivered, %d pending; want 0 and 1", info.NumRedelivered, info.NumAckPending)
		}
		if err := sub.Ack(ctxT(t), d); err != nil {
			t.Errorf("Ack: %v", err)
		}
	})
}

func TestRedeliveryWithBackOff(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		cfg.AckWait, cfg.MaxDeliver = 0, 3
		cfg.BackOff = []time.Duration{300 * time.Millisecond, 700 * time.Millisecond}
		top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)
		r, err := sub.Redelivery(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		want := window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 700 * time.Millisecond}
		if r.MaxDeliveries != want.MaxDeliveries || r.AckWait != want.AckWait || len(r.Backoff) != 0 {
			t.Errorf("Redelivery = %v, want %v", r, want)
		}
		send(t, top, &driver.Message{ID: "m", Body: []byte("m")})
		// Each delivery's lease is the BackOff entry the server holds it
		// for; left unsettled, it comes back until MaxDeliver.
		for i, lease := range []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, 700 * time.Millisecond} {
			d := receiveN(t, sub, 1)[0]
			if d.Attempt != i+1 || d.Lease != lease {
				t.Errorf("delivery %d: attempt %d lease %s, want attempt %d lease %s", i+1, d.Attempt, d.Lease, i+1, lease)
			}
		}
		expectNone(t, sub, 1500*time.Millisecond)
	})
}

func TestReceive(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		// Long enough to tell a message given back at once from one
		// redelivered after its ack wait.
		cfg.AckWait = 5 * time.Second
		top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)

		t.Run("honours max", func(t *testing.T) {
			var msgs []*driver.Message
			for i := range 10 {
				msgs = append(msgs, &driver.Message{ID: "m" + strconv.Itoa(i), Body: []byte("x")})
			}
			send(t, top, msgs...)
			ds, err := sub.Receive(ctxT(t), 3)
			if err != nil || len(ds) < 1 || len(ds) > 3 {
				t.Fatalf("Receive(3) = %d deliveries, %v; want 1 to 3", len(ds), err)
			}
			rest := receiveN(t, sub, 10-len(ds))
			for _, d := range append(ds, rest...) {
				if err := sub.Ack(ctxT(t), d); err != nil {
					t.Fatal(err)
				}
			}
		})
		t.Run("empty: returns at the deadline", func(t *testing.T) {
			start := time.Now()
			expectNone(t, sub, 300*time.Millisecond)
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("Receive took %s past a 300ms deadline", took)
			}
		})
		t.Run("waits for a message published later", func(t *testing.T) {
			got := make(chan []*driver.Delivery, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				ds, _ := sub.Receive(ctx, 5)
				got <- ds
			}()
			// Publish once the pull is (very likely) waiting; either
			// order must work.
			send(t, top, &driver.Message{ID: "late", Body: []byte("x")})
			ds := <-got
			if len(ds) != 1 || ds[0].Message.ID != "late" {
				t.Fatalf("Receive = %d deliveries, want the late message", len(ds))
			}
			if err := sub.Ack(ctxT(t), ds[0]); err != nil {
				t.Fatal(err)
			}
		})
		t.Run("a message for an abandoned pull comes back at once", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { _, err := sub.Receive(ctx, 1); done <- err }()
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Receive after cancel: %v, want context.Canceled", err)
			}
			send(t, top, &driver.Message{ID: "after-cancel", Body: []byte("x")})
			// Whether the abandoned pull caught it (then it was nacked)
			// or not, it arrives well within the 5s ack wait.
			ctx2, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel2()
			var d *driver.Delivery
			for d == nil {
				ds, err := sub.Receive(ctx2, 1)
				if err != nil {
					t.Fatalf("message not back within 3s: %v", err)
				}
				d = ds[0]
			}
			if d.Message.ID != "after-cancel" {
				t.Fatalf("got %q", d.Message.ID)
			}
			if err := sub.Ack(ctxT(t), d); err != nil {
				t.Fatal(err)
			}
		})
	})
}

func TestOpenChecks(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		base := testConfig(t, srv)
		openTopic(t, nc, base) // creates the stream
		openSub(t, nc, base)   // creates the durable
		js, _ := jetstream.New(nc)
		other := uniqueName("O")
		deleteStreamAtCleanup(t, srv, other)
		if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: other, Subjects: []string{"dedupq.narrow." + other + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			open func(cfg Config) error
			edit func(c *Config)
			want string
		}{
			{"missing stream", topicOpener(nc), func(c *Config) { c.Stream, c.CreateStream = uniqueName("MISSING"), false }, "does not exist"},
			{"window differs", topicOpener(nc), func(c *Config) { c.Duplicates = time.Minute }, "not the 1m configured"},
			{"subject not covered", topicOpener(nc), func(c *Config) { c.Stream, c.Subject, c.Duplicates = other, "dedupq.narrow."+other, 0 }, "does not take"},
			{"ack wait differs", subOpener(nc), func(c *Config) { c.AckWait = 3 * time.Second }, "AckWait is 1s, not 3s"},
			{"max deliver differs", subOpener(nc), func(c *Config) { c.MaxDeliver = 9 }, "MaxDeliver is 5, not 9"},
			{"backoff differs", subOpener(nc), func(c *Config) { c.BackOff = []time.Duration{time.Second} }, "BackOff"},
			{"no durable", subOpener(nc), func(c *Config) { c.Durable = "" }, "Config.Durable: missing"},
			{"bad stream name", topicOpener(nc), func(c *Config) { c.Stream = "a.b" }, "Config.Stream"},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				cfg := base
				tc.edit(&cfg)
				err := tc.open(cfg)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("open: %v, want an error mentioning %s", err, tc.want)
				}
			})
		}
		t.Run("connection with a reconnect buffer", func(t *testing.T) {
			buffered, err := nats.Connect(srv.url)
			if err != nil {
				t.Fatal(err)
			}
			defer buffered.Close()
			if _, err := OpenTopic(ctxT(t), buffered, base); err == nil || !strings.Contains(err.Error(), "ReconnectBufSize") {
				t.Errorf("OpenTopic on a buffering connection: %v, want a refusal naming ReconnectBufSize", err)
			}
		})
	})
}

func topicOpener(nc *nats.Conn) func(Config) error {
	return func(cfg Config) error {
		top, err := OpenTopic(context.Background(), nc, cfg)
		if err == nil {
			top.Close()
		}
		return err
	}
}

func subOpener(nc *nats.Conn) func(Config) error {
	return func(cfg Config) error {
		sub, err := OpenSubscription(context.Background(), nc, cfg)
		if err == nil {
			sub.Close()
		}
		return err
	}
}

// TestServerGone runs on a server of its own, which it shuts down.
func TestServerGone(t *testing.T) {
	u, stop, err := embedded.Run(ctxT(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	srv := server{"embedded-private", u}
	nc := connect(t, srv)
	cfg := testConfig(t, srv)
	top := openTopic(t, nc, cfg)
	send(t, top, &driver.Message{ID: "before", Body: []byte("x")})
	stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := top.SendBatch(ctx, []*driver.Message{{ID: "during", Body: []byte("x")}})
	if err != nil || res[0].Err == nil || !top.IsRetryable(res[0].Err) {
		t.Errorf("send while the server is gone: %+v, %v; want a retryable per-message error", res, err)
	}
	if _, err := top.Window(ctx); err == nil {
		t.Errorf("Window with the server gone: no error")
	}
	nc.Close()
	res, err = top.SendBatch(context.Background(), []*driver.Message{{ID: "closed", Body: []byte("x")}})
	if err != nil || res[0].Err == nil || top.IsRetryable(res[0].Err) {
		t.Errorf("send on a closed connection: %+v, %v; want a final per-message error", res, err)
	}
}

func TestURLOpener(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		cfg := testConfig(t, srv)
		raw := cfg.URL(srv.url)
		u, _ := url.Parse(raw)
		top, err := URLOpener{}.OpenTopic(ctxT(t), u)
		if err != nil {
			t.Fatalf("OpenTopic(%s): %v", raw, err)
		}
		defer top.Close()
		sub, err := URLOpener{}.OpenSubscription(ctxT(t), u)
		if err != nil {
			t.Fatalf("OpenSubscription(%s): %v", raw, err)
		}
		defer sub.Close()

		noDurable := cfg
		noDurable.Durable = ""
		u2, _ := url.Parse(noDurable.URL(srv.url))
		_, err = URLOpener{}.OpenSubscription(ctxT(t), u2)
		var pe *dedupq.ParamError
		if !errors.As(err, &pe) || pe.Param != "durable" {
			t.Errorf("OpenSubscription without durable: %v, want a ParamError for durable", err)
		}
	})
}

// TestEndToEndEffectsOnce drives the adapter the way a user does, through
// the URL registry, a Publisher and a Consumer behind a dedup guard: every
// message is published twice and a fifth of them fail their first
// delivery, and still each effect runs exactly once.
func TestEndToEndEffectsOnce(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		cfg := testConfig(t, srv)
		cfg.Duplicates = 0 // the server's default two minutes covers the default retry policy
		raw := cfg.URL(srv.url)
		ctx := ctxT(t)
		pub, err := dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
		if err != nil {
			t.Fatalf("OpenPublisher(%s): %v", raw, err)
		}
		defer pub.Close(context.Background())
		const n = 50
		msgs := make([]*dedupq.Message, n)
		for i := range msgs {
			msgs[i] = &dedupq.Message{ID: "order-" + strconv.Itoa(i), Body: []byte("x"), GroupKey: "g" + strconv.Itoa(i%3)}
		}
		for round := range 2 {
			res, err := pub.PublishBatch(ctx, msgs)
			if err != nil {
				t.Fatalf("PublishBatch round %d: %v", round, err)
			}
			for i, r := range res {
				if r.Duplicate != (round == 1) {
					t.Errorf("round %d message %d: Duplicate %v", round, i, r.Duplicate)
				}
			}
		}

		guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		con, err := dedupq.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{
			Concurrency: 8, Dedup: guard, PublisherSpan: pub.RetryPolicy().Span(),
		})
		if err != nil {
			t.Fatalf("OpenConsumer(%s): %v", raw, err)
		}
		defer con.Close(ctx)
		var mu sync.Mutex
		effects := map[string]int{}
		done := make(chan struct{})
		runCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		go func() {
			<-done
			cancel()
		}()
		err = con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
			i, _ := strconv.Atoi(strings.TrimPrefix(d.Message.ID, "order-"))
			if i%5 == 0 && d.Attempt == 1 {
				return errors.New("first delivery fails")
			}
			mu.Lock()
			defer mu.Unlock()
			effects[d.Message.ID]++
			if len(effects) == n {
				select {
				case <-done:
				default:
					close(done)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(effects) != n {
			t.Fatalf("%d of %d messages took effect before the deadline", len(effects), n)
		}
		for id, c := range effects {
			if c != 1 {
				t.Errorf("%s took effect %d times", id, c)
			}
		}
		if s := guard.Stats(); s.Ran != n || s.Failed != n/5 {
			t.Errorf("guard stats %+v, want %d runs and %d failures", s, n, n/5)
		}
	})
}

func TestWindowOfMirror(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		origin := testConfig(t, srv)
		openTopic(t, nc, origin) // creates the origin stream, window 2s
		mirror := uniqueName("M")
		deleteStreamAtCleanup(t, srv, mirror)
		js, _ := jetstream.New(nc)
		if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
			Name: mirror, Storage: jetstream.MemoryStorage, Mirror: &jetstream.StreamSource{Name: origin.Stream},
		}); err != nil {
			t.Fatalf("creating the mirror: %v", err)
		}
		cfg := origin
		cfg.Stream, cfg.CreateStream, cfg.Duplicates = mirror, false, 0
		sub := openSub(t, nc, cfg)
		w, err := sub.Window(ctxT(t))
		want := window.Window{Backend: "jetstream", Duration: origin.Duplicates, Kind: window.KindConfigured,
			Source: window.SourceDiscovered, Scope: "stream " + origin.Stream + " (mirrored by " + mirror + ")", Settings: settings()}
		want.Settings.Window = "the Duplicates of stream " + origin.Stream + ", which " + mirror + " mirrors"
		if err != nil || w != want {
			t.Errorf("mirror Window = %+v, %v; want %+v", w, err, want)
		}
	})
}
