package jetstream

// Durables with request limits and priority groups (issue 29, item 3),
// against real NATS servers: the embedded nats-server that TestMain starts
// and the local server at 127.0.0.1:4222 (see servers_test.go for when the
// latter is skipped); priority groups, which 2.11 introduced, on the
// embedded server only.
//
// What the server does with a pull that breaks a durable's limits is in
// the NATS documentation, "Consumers", pull-specific configuration
// (https://docs.nats.io/nats-concepts/jetstream/consumers#pull-specific):
// MaxRequestExpires is "the maximum duration a single pull request will
// wait for messages to be available to pull", MaxWaiting "the maximum
// number of waiting pull requests"; the server answers a pull over either
// with a 409 ("Exceeded MaxRequestExpires of …", "Exceeded MaxWaiting",
// nats-server/server/consumer.go processNextMsgRequest). Priority groups
// (ADR-42, https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-42.md):
// a pull on a durable with a PriorityPolicy must name one of its groups,
// else 400 "Bad Request - Priority Group missing".

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// durableFor creates cfg's stream and, with the settings cfg checks,
// a durable edited by edit, as an operator would make it.
func durableFor(t *testing.T, nc *nats.Conn, cfg Config, edit func(*jetstream.ConsumerConfig)) (*Topic, jetstream.Consumer) {
	t.Helper()
	top := openTopic(t, nc, cfg)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cc := consumerConfig(cfg)
	edit(&cc)
	cons, err := js.CreateConsumer(ctxT(t), cfg.Stream, cc)
	if err != nil {
		t.Fatalf("creating the durable: %v", err)
	}
	return top, cons
}

// receiveIdle receives on an empty durable for d: a Receive must wait out
// its context, or fail with an error IsRetryable calls transient. It
// returns that error.
func receiveIdle(t *testing.T, sub *Subscription, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if len(ds) > 0 {
		t.Fatalf("Receive on an empty durable got %d deliveries", len(ds))
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return nil
	case err == nil:
		t.Fatal("Receive returned nothing and no error")
	case !sub.IsRetryable(err):
		t.Fatalf("Receive on an idle durable: %v, which IsRetryable calls permanent: a Consumer's Run stops on it", err)
	}
	return err
}

// TestDurableRequestLimits: a durable's MaxRequestExpires below the
// adapter's pull wait is fitted, one too short to work with is refused at
// open with the setting to change, and a pull refused for MaxWaiting is
// transient.
func TestDurableRequestLimits(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		cases := []struct {
			name string
			edit func(*jetstream.ConsumerConfig)
			// refused: the text OpenSubscription's error must have; empty
			// when the open must work.
			refused string
			// hold: occupy the durable's waiting pulls from elsewhere
			// before receiving.
			hold bool
		}{
			{name: "MaxRequestExpires below the pull wait: pulls fit it",
				edit: func(c *jetstream.ConsumerConfig) { c.MaxRequestExpires = time.Second }},
			{name: "MaxRequestExpires of 2s: pulls fit it",
				edit: func(c *jetstream.ConsumerConfig) { c.MaxRequestExpires = 2 * time.Second }},
			{name: "MaxRequestExpires too short: refused at open",
				edit:    func(c *jetstream.ConsumerConfig) { c.MaxRequestExpires = 200 * time.Millisecond },
				refused: "its MaxRequestExpires is 200ms"},
			{name: "MaxWaiting reached: transient",
				edit: func(c *jetstream.ConsumerConfig) { c.MaxWaiting = 1 },
				hold: true},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				nc := connect(t, srv)
				cfg := testConfig(t, srv)
				top, _ := durableFor(t, nc, cfg, tc.edit)
				sub, err := OpenSubscription(ctxT(t), nc, cfg)
				if tc.refused != "" {
					var de *DurableError
					if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.refused) {
						t.Fatalf("OpenSubscription: %v, want a *DurableError saying %q", err, tc.refused)
					}
					if !strings.Contains(err.Error(), "MaxRequestExpires to "+minPullWait.String()) {
						t.Errorf("OpenSubscription: %v, want the fix (raise MaxRequestExpires to %s)", err, minPullWait)
					}
					return
				}
				if err != nil {
					t.Fatalf("OpenSubscription: %v", err)
				}
				t.Cleanup(func() { sub.Close() })
				if tc.hold {
					holdWaitingPull(t, nc, cfg)
					err := receiveIdle(t, sub, time.Second)
					if err == nil || !strings.Contains(err.Error(), "Exceeded MaxWaiting") {
						t.Fatalf("Receive with every waiting pull taken: %v, want the server's Exceeded MaxWaiting", err)
					}
					return
				}
				// Longer than the durable's MaxRequestExpires: the
				// Receive spans several pulls, each within the limit.
				if err := receiveIdle(t, sub, 2500*time.Millisecond); err != nil {
					t.Fatalf("Receive: %v, want it to wait out its context", err)
				}
				send(t, top, &driver.Message{ID: "after-idle", Body: []byte("x")})
				if ds := receiveN(t, sub, 1); ds[0].Message.ID != "after-idle" {
					t.Fatalf("got %q", ds[0].Message.ID)
				}
			})
		}
	})
}

// holdWaitingPull sends a pull on another connection that waits at the
// durable until the test ends: with MaxWaiting 1 it is the only one the
// durable takes.
func holdWaitingPull(t *testing.T, nc *nats.Conn, cfg Config) {
	t.Helper()
	other, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	js, err := jetstream.New(other)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctxT(t), cfg.Stream, cfg.Durable)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cons.Fetch(1, jetstream.FetchMaxWait(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the other pull to wait at the server", func() (bool, string) {
		info, err := cons.Info(ctxT(t))
		if err != nil {
			return false, err.Error()
		}
		return info.NumWaiting == 1, fmt.Sprintf("%d waiting pulls", info.NumWaiting)
	})
}

// TestDurableLimitLoweredWhileRunning: a durable whose MaxRequestExpires
// an operator lowers after the open refuses the next pull; the Receive
// fails transiently, having read the new limit, and the pulls after it fit.
func TestDurableLimitLoweredWhileRunning(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		_, cons := durableFor(t, nc, cfg, func(*jetstream.ConsumerConfig) {})
		sub := openSub(t, nc, cfg)
		js, _ := jetstream.New(nc)
		cc := cons.CachedInfo().Config
		cc.MaxRequestExpires = time.Second
		if _, err := js.UpdateConsumer(ctxT(t), cfg.Stream, cc); err != nil {
			t.Fatalf("lowering MaxRequestExpires: %v", err)
		}
		err := receiveIdle(t, sub, 2500*time.Millisecond)
		if err == nil {
			// The first pull had the old limit: the server refused it.
			t.Fatal("Receive waited out its context on pulls over the durable's new MaxRequestExpires")
		}
		if err := receiveIdle(t, sub, 2500*time.Millisecond); err != nil {
			t.Fatalf("Receive after the refused pull: %v, want the pulls fitted to the new limit", err)
		}
	})
}

// TestDurableRequestLimitsRun: a Consumer on a durable with a
// MaxRequestExpires of 1s, idle for longer than that, runs until its
// context ends instead of stopping with "receive failed for good".
func TestDurableRequestLimitsRun(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		cfg.MaxDeliver = 0
		durableFor(t, nc, cfg, func(c *jetstream.ConsumerConfig) { c.MaxRequestExpires = time.Second })
		con, err := dedupq.OpenConsumer(ctxT(t), cfg.URL(srv.url), dedupq.ConsumerOptions{})
		if err != nil {
			t.Fatalf("OpenConsumer: %v", err)
		}
		defer con.Close(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		if err := con.Run(ctx, func(context.Context, *dedupq.Delivery) error { return nil }); err != nil {
			t.Fatalf("Run on an idle durable with MaxRequestExpires 1s: %v, want nil once its context ends", err)
		}
	})
}

// TestPriorityGroupDurableRefused: a durable with a PriorityPolicy (server
// 2.11+) is refused at open, naming the setting, for each policy the
// embedded server knows.
func TestPriorityGroupDurableRefused(t *testing.T) {
	srv := servers()[0]
	cases := []struct {
		name string
		edit func(*jetstream.ConsumerConfig)
		want string
	}{
		{"overflow", func(c *jetstream.ConsumerConfig) {
			c.PriorityPolicy, c.PriorityGroups = jetstream.PriorityPolicyOverflow, []string{"jobs"}
		}, "its PriorityPolicy is overflow"},
		{"pinned client", func(c *jetstream.ConsumerConfig) {
			c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL = jetstream.PriorityPolicyPinned, []string{"jobs"}, time.Minute
		}, "its PriorityPolicy is pinned_client"},
		{"prioritized", func(c *jetstream.ConsumerConfig) {
			c.PriorityPolicy, c.PriorityGroups = jetstream.PriorityPolicyPrioritized, []string{"jobs"}
		}, "its PriorityPolicy is prioritized"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc := connect(t, srv)
			cfg := testConfig(t, srv)
			durableFor(t, nc, cfg, tc.edit)
			sub, err := OpenSubscription(ctxT(t), nc, cfg)
			if err == nil {
				defer sub.Close()
				_, rerr := sub.Receive(ctxT(t), 1)
				t.Fatalf("OpenSubscription worked; then Receive: %v (IsRetryable %v)", rerr, sub.IsRetryable(rerr))
			}
			var de *DurableError
			if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "without PriorityPolicy") {
				t.Fatalf("OpenSubscription: %v, want a *DurableError saying %q and the fix", err, tc.want)
			}
		})
	}
}

// TestPriorityGroupAddedWhileRunning: a durable given a PriorityPolicy
// after the open refuses every pull (400); Receive reads the durable again
// and fails with the *DurableError an open would have given, which stops
// the Consumer with the fix rather than with "bad request".
func TestPriorityGroupAddedWhileRunning(t *testing.T) {
	srv := servers()[0]
	nc := connect(t, srv)
	cfg := testConfig(t, srv)
	_, cons := durableFor(t, nc, cfg, func(*jetstream.ConsumerConfig) {})
	sub := openSub(t, nc, cfg)
	js, _ := jetstream.New(nc)
	cc := cons.CachedInfo().Config
	cc.PriorityPolicy, cc.PriorityGroups = jetstream.PriorityPolicyOverflow, []string{"jobs"}
	if _, err := js.UpdateConsumer(ctxT(t), cfg.Stream, cc); err != nil {
		t.Fatalf("adding a PriorityPolicy: %v", err)
	}
	_, err := sub.Receive(ctxT(t), 1)
	var de *DurableError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "its PriorityPolicy is overflow") {
		t.Fatalf("Receive: %v, want a *DurableError naming the PriorityPolicy", err)
	}
	if sub.IsRetryable(err) {
		t.Errorf("IsRetryable(%v) = true, want false", err)
	}
}
