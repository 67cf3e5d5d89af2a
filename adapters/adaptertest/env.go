package adaptertest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/window"
	"go.opentelemetry.io/otel/trace"
)

// env is one subtest's entity with a Publisher and a Consumer on it, and a
// record of every delivery the consumer's handler saw.
type env struct {
	t       *testing.T
	s       *suite
	cfg     Config
	ent     Entity
	fake    *clock.Fake
	pub     *dedupq.Publisher
	con     *dedupq.Consumer
	rec     recorder
	prefix  string
	markers atomic.Int64
}

// newEnv opens a fresh entity and wraps it. The publisher makes one attempt
// per message: the suite tests the backend, and a retry policy would have
// to fit windows as short as the suite's.
func (s *suite) newEnv(t *testing.T, cfg Config, concurrency int) *env {
	t.Helper()
	return s.newTracedEnv(t, cfg, concurrency, nil)
}

// newTracedEnv is newEnv whose publisher and consumer trace to tp (nil:
// the global provider).
func (s *suite) newTracedEnv(t *testing.T, cfg Config, concurrency int, tp trace.TracerProvider) *env {
	t.Helper()
	ent := s.open(t, cfg)
	e := &env{t: t, s: s, cfg: cfg, ent: ent, prefix: nonce()}
	e.rec.changed = make(chan struct{})
	e.fake, _ = ent.Clock.(*clock.Fake)
	ctx := t.Context()
	pub, err := dedupq.NewPublisher(ctx, ent.Topic, dedupq.PublisherOptions{
		Retry: &window.RetryPolicy{MaxAttempts: 1}, Clock: ent.Clock, TracerProvider: tp,
	})
	if err != nil {
		ent.Topic.Close()
		ent.Subscription.Close()
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	con, err := dedupq.NewConsumer(ctx, ent.Subscription, dedupq.ConsumerOptions{
		Concurrency: concurrency, Clock: ent.Clock, TracerProvider: tp, Ordered: s.caps.OrdersGroups,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		ent.Subscription.Close()
		t.Fatalf("NewConsumer: %v", err)
	}
	// Registered after the cleanup that stops a running consumer (start
	// registers it later, so it runs first).
	t.Cleanup(func() { con.Close(context.Background()) })
	e.pub, e.con = pub, con
	return e
}

// id makes a dedup ID unique to this env.
func (e *env) id(name string) string { return name + "-" + e.prefix }

// group is the group key of the suite's messages: set on every message, so
// that backends that require one (SQS FIFO) accept them and ordered ones
// deliver a marker after the message under test.
const group = "g1"

func (e *env) msg(name string) *dedupq.Message {
	return &dedupq.Message{ID: e.id(name), Body: []byte("body of " + name), GroupKey: group}
}

// publish sends m and fails the test unless the broker stored it or
// dropped it as a duplicate.
func (e *env) publish(m *dedupq.Message) dedupq.Result {
	e.t.Helper()
	res, err := e.pub.Publish(e.t.Context(), m)
	if err != nil {
		e.t.Fatalf("Publish(%q): %v", m.ID, err)
	}
	return res
}

// timeout is how long to wait for an expected delivery: the capability's
// bound plus the backend's own lease and nack backoff.
func (e *env) timeout() time.Duration {
	r := e.con.Redelivery()
	return e.s.caps.WaitTimeout + r.AckWait + r.BackoffBefore(2)
}

// recorder keeps every delivery a handler saw, in order, and wakes waiters
// on each one.
type recorder struct {
	mu      sync.Mutex
	ds      []dedupq.Delivery
	changed chan struct{}
}

func (r *recorder) add(d *dedupq.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ds = append(r.ds, *d)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) snapshot() ([]dedupq.Delivery, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ds), r.changed
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ds)
}

func describe(ds []dedupq.Delivery) string {
	if len(ds) == 0 {
		return "none"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%s#%d", d.Message.ID, d.Attempt)
	}
	return strings.Join(parts, ", ")
}

// waitFor waits, without polling, until cond holds for the deliveries
// recorded so far, and returns them.
func (e *env) waitFor(what string, cond func([]dedupq.Delivery) bool) []dedupq.Delivery {
	e.t.Helper()
	deadline := time.NewTimer(e.timeout())
	defer deadline.Stop()
	for {
		ds, changed := e.rec.snapshot()
		if cond(ds) {
			return ds
		}
		select {
		case <-changed:
		case <-deadline.C:
			e.t.Fatalf("timed out after %s waiting for %s; deliveries so far: %s", e.timeout(), what, describe(ds))
		case <-e.t.Context().Done():
			e.t.Fatalf("test context done waiting for %s", what)
		}
	}
}

// deliveredOf returns the deliveries of one dedup ID.
func deliveredOf(ds []dedupq.Delivery, id string) []dedupq.Delivery {
	var out []dedupq.Delivery
	for _, d := range ds {
		if d.Message.ID == id {
			out = append(out, d)
		}
	}
	return out
}

func has(id string) func([]dedupq.Delivery) bool {
	return func(ds []dedupq.Delivery) bool { return len(deliveredOf(ds, id)) > 0 }
}

// running is one Consumer.Run in progress.
type running struct {
	e      *env
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs the consumer with h, recording each delivery before h sees it.
// The run is stopped at the latest when the test ends.
func (e *env) start(h dedupq.Handler) *running {
	ctx, cancel := context.WithCancel(context.WithoutCancel(e.t.Context()))
	r := &running{e: e, cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- e.con.Run(ctx, func(ctx context.Context, d *dedupq.Delivery) error {
			e.rec.add(d)
			return h(ctx, d)
		})
	}()
	e.t.Cleanup(r.stop)
	return r
}

// stop cancels the run and waits for Run to return, which it does only once
// every in-flight handler has finished and its delivery is settled.
func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		deadline := time.NewTimer(r.e.timeout())
		defer deadline.Stop()
		select {
		case err := <-r.done:
			if err != nil {
				r.e.t.Errorf("Consumer.Run returned %v, want nil after its context was cancelled", err)
			}
		case <-deadline.C:
			r.e.t.Fatalf("Consumer.Run did not return within %s of its context being cancelled", r.e.timeout())
		}
	})
}

func ack(context.Context, *dedupq.Delivery) error { return nil }

// consume runs the consumer with h until cond holds, then stops it.
func (e *env) consume(what string, h dedupq.Handler, cond func([]dedupq.Delivery) bool) []dedupq.Delivery {
	e.t.Helper()
	r := e.start(h)
	e.waitFor(what, cond)
	r.stop()
	ds, _ := e.rec.snapshot()
	return ds
}

// elapse lets d pass on the backend's clock: an advance of a fake clock, a
// bounded real wait otherwise. Only call it while no consumer runs, so that
// no handler's lease runs out under it.
func (e *env) elapse(d time.Duration) {
	e.t.Helper()
	if e.fake != nil {
		e.fake.Advance(d)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-e.t.Context().Done():
		e.t.Fatal("test context done while letting time pass")
	}
}

// redeliveryDelay bounds how long a message that was not settled, or was
// wrongly kept, takes to come back.
func (e *env) redeliveryDelay() time.Duration {
	r := e.con.Redelivery()
	var backoff time.Duration
	for _, b := range r.Backoff {
		backoff = max(backoff, b)
	}
	return r.AckWait + backoff + max(r.AckWait/2, 250*time.Millisecond)
}

// expectOnlyMarker proves that nothing published or delivered before is
// delivered (again): with elapse, it first lets the redelivery delay pass;
// then it publishes a marker and consumes until the marker arrives. Every
// other delivery in that run fails the test. Call it with no consumer
// running.
func (e *env) expectOnlyMarker(why string, elapse bool) {
	e.t.Helper()
	if elapse {
		e.elapse(e.redeliveryDelay())
	}
	before := e.rec.len()
	m := e.msg(fmt.Sprintf("marker%d", e.markers.Add(1)))
	e.publish(m)
	ds := e.consume("the marker "+m.ID, ack, has(m.ID))[before:]
	if len(ds) != 1 || ds[0].Message.ID != m.ID {
		e.t.Errorf("%s: want only the marker %s delivered, got %s", why, m.ID, describe(ds))
	}
}
