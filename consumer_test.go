// Tests of the portable Consumer against a channel-fed driver: no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
	"github.com/dedupq/dedupq/window"
)

// chanSub delivers what is pushed into in and records every settlement.
type chanSub struct {
	in         chan *driver.Delivery
	redelivery window.RedeliveryPolicy
	mu         sync.Mutex
	settled    map[string]string // ID → "ack" | "nack <delay>" | "term"
	extends    map[string]int
	ackErrs    int // fail this many acks with a retryable error first
	recvErr    error
	recvFails  int      // fail this many receives with a retryable error first
	events     []string // settlements and closes, in order
}

func newChanSub() *chanSub {
	return &chanSub{
		in:         make(chan *driver.Delivery, 100),
		redelivery: window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second, Backoff: []time.Duration{7 * time.Second}},
		settled:    map[string]string{}, extends: map[string]int{},
	}
}

func (s *chanSub) push(id string, lease time.Duration) {
	s.in <- &driver.Delivery{Message: driver.Message{ID: id}, Attempt: 1, BackendID: "b-" + id, Lease: lease}
}

func (s *chanSub) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	if s.recvErr != nil {
		return nil, s.recvErr
	}
	s.mu.Lock()
	if s.recvFails > 0 {
		s.recvFails--
		s.mu.Unlock()
		return nil, errUnavailable
	}
	s.mu.Unlock()
	select {
	case d := <-s.in:
		return []*driver.Delivery{d}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *chanSub) record(d *driver.Delivery, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled[d.Message.ID] = what
	s.events = append(s.events, d.Message.ID+" "+what)
}

func (s *chanSub) log() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

func (s *chanSub) get(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settled[id]
}

func (s *chanSub) Ack(_ context.Context, d *driver.Delivery) error {
	s.mu.Lock()
	if s.ackErrs > 0 {
		s.ackErrs--
		s.mu.Unlock()
		return errUnavailable
	}
	s.mu.Unlock()
	s.record(d, "ack")
	return nil
}

func (s *chanSub) Nack(_ context.Context, d *driver.Delivery, delay time.Duration) error {
	s.record(d, fmt.Sprintf("nack %s", delay))
	return nil
}

func (s *chanSub) Terminate(_ context.Context, d *driver.Delivery, _ error) error {
	s.record(d, "term")
	return nil
}

func (s *chanSub) Extend(_ context.Context, d *driver.Delivery, _ time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.extends[d.Message.ID]++
	return nil
}

func (s *chanSub) Window(context.Context) (window.Window, error) {
	return window.Window{Backend: "chan", Duration: time.Minute, Kind: window.KindConfigured}, nil
}
func (s *chanSub) Redelivery(context.Context) (window.RedeliveryPolicy, error) {
	return s.redelivery, nil
}
func (s *chanSub) IsRetryable(err error) bool { return errors.Is(err, errUnavailable) }
func (s *chanSub) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, "close")
	return nil
}

// runConsumer starts Run and returns a stop func that cancels it and
// returns Run's error.
func runConsumer(t *testing.T, c *Consumer, h Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	return func() error { cancel(); return <-done }
}

func TestConsumerSettlesByHandlerResult(t *testing.T) {
	sub := newChanSub()
	c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]error{
		"ok":    nil,
		"fail":  errors.New("transient"),
		"later": RetryAfter(errors.New("busy"), 3*time.Second),
		"perm":  Permanent(errors.New("bad payload")),
		"panic": nil,
	}
	want := map[string]string{"ok": "ack", "fail": "nack 7s", "later": "nack 3s", "perm": "term", "panic": "nack 7s"}
	stop := runConsumer(t, c, func(ctx context.Context, d *Delivery) error {
		if d.Message.ID == "panic" {
			panic("boom")
		}
		return results[d.Message.ID]
	})
	for id := range results {
		sub.push(id, 0)
	}
	testutil.WaitFor(t, func() bool {
		for id, w := range want {
			if sub.get(id) != w {
				return false
			}
		}
		return true
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestConsumerRetriesFailedAck(t *testing.T) {
	sub := newChanSub()
	sub.ackErrs = 2
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{})
	stop := runConsumer(t, c, func(context.Context, *Delivery) error { return nil })
	sub.push("a", 0)
	testutil.WaitFor(t, func() bool { return sub.get("a") == "ack" })
	_ = stop()
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	sub := newChanSub()
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{})
	started, release := make(chan struct{}), make(chan struct{})
	var handlerErr error
	stop := runConsumer(t, c, func(ctx context.Context, d *Delivery) error {
		close(started)
		<-release
		handlerErr = ctx.Err()
		return nil
	})
	sub.push("a", 0)
	<-started
	stopped := make(chan error)
	go func() { stopped <- stop() }()
	select {
	case <-stopped:
		t.Fatal("Run returned while a handler was in flight")
	case <-time.After(50 * time.Millisecond): // a bounded negative check
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if handlerErr != nil || sub.get("a") != "ack" {
		t.Fatalf("handler ctx err = %v, settled = %q; want a live context and an ack", handlerErr, sub.get("a"))
	}
}

func TestShutdownTimeoutCancelsHandler(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{ShutdownTimeout: time.Minute, Clock: fake})
	started := make(chan struct{})
	stop := runConsumer(t, c, func(ctx context.Context, d *Delivery) error {
		close(started)
		<-ctx.Done()
		return context.Cause(ctx)
	})
	sub.push("a", 0)
	<-started
	stopped := make(chan error)
	go func() { stopped <- stop() }()
	testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
	fake.Advance(time.Minute)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := sub.get("a"); got != "nack 7s" {
		t.Fatalf("settled = %q, want the cancelled handler's delivery nacked", got)
	}
}

// TestCloseStopsRunAndDrains checks that Close stops a running Run, that
// its ctx bounds the graceful drain (ShutdownTimeout, an hour on a fake
// clock that is never advanced for it, cannot be what ends it), that what
// was acked stays acked, and that the driver is closed only after the last
// settlement.
func TestCloseStopsRunAndDrains(t *testing.T) {
	background := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	cancelled := func() (context.Context, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel
	}
	tests := []struct {
		name     string
		closeCtx func() (context.Context, context.CancelFunc)
		obeys    bool   // the in-flight handler returns when its context is cancelled
		wantSlow string // how the in-flight delivery is settled
		wantErr  error  // what Close's error matches; nil for none
	}{
		{"live ctx lets the handler finish", background, true, "ack", nil},
		{"cancelled ctx cancels the handler at once", cancelled, true, "nack 7s", nil},
		{"handler ignoring cancellation outlives Close", cancelled, false, "ack", context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			sub := newChanSub()
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Concurrency: 2, ShutdownTimeout: time.Hour, Clock: fake})
			if err != nil {
				t.Fatal(err)
			}
			started, release := make(chan struct{}), make(chan struct{})
			var cause error
			ran := make(chan error, 1)
			go func() {
				ran <- c.Run(context.Background(), func(ctx context.Context, d *Delivery) error {
					if d.Message.ID == "fast" {
						return nil
					}
					close(started)
					if !tt.obeys {
						<-release
						return nil
					}
					select {
					case <-ctx.Done():
						cause = context.Cause(ctx)
						return cause
					case <-release:
						return nil
					}
				})
			}()
			sub.push("fast", 0)
			testutil.WaitFor(t, func() bool { return sub.get("fast") == "ack" })
			sub.push("slow", 0)
			<-started

			ctx, cancel := tt.closeCtx()
			defer cancel()
			closed := make(chan error, 1)
			go func() { closed <- c.Close(ctx) }()
			// Close has begun: whatever the handler does now happens
			// during the drain.
			testutil.WaitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.closed })
			if tt.wantSlow == "ack" && tt.obeys {
				close(release)
			}
			if !tt.obeys {
				// Close's wait for the cancelled handler, beside the
				// ShutdownTimeout watch.
				testutil.WaitFor(t, func() bool { return fake.Waiters() == 2 })
				fake.Advance(c.opts.SettleTimeout)
			}
			if err = within(t, closed, "Close"); !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("Close = %v, want %v", err, tt.wantErr)
			}
			if !tt.obeys {
				if got := sub.log(); len(got) != 1 {
					t.Fatalf("events before the handler returned = %q, want only the fast ack", got)
				}
				close(release)
			}
			if err := within(t, ran, "Run"); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			want := []string{"fast ack", "slow " + tt.wantSlow, "close"}
			if got := sub.log(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("events = %q, want %q", got, want)
			}
			if tt.wantSlow != "ack" && !errors.Is(cause, ErrShutdownTimeout) {
				t.Fatalf("handler's cancellation cause = %v, want ErrShutdownTimeout", cause)
			}
			if err := c.Run(context.Background(), nil); !errors.Is(err, ErrClosed) {
				t.Fatalf("Run after Close = %v, want ErrClosed", err)
			}
			if err := c.Close(context.Background()); !errors.Is(err, ErrClosed) {
				t.Fatalf("second Close = %v, want ErrClosed", err)
			}
		})
	}
}

// within receives from ch, failing t if nothing comes within 10s: what
// the Consumer waits for here is all in memory, so 10s means a hang.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10s", what)
		panic("unreachable")
	}
}

// TestCloseWithoutHandlers checks Close on a Consumer that is not running
// and on one whose Run waits for deliveries: neither has anything to drain,
// so even a done ctx closes the driver and reports success.
func TestCloseWithoutHandlers(t *testing.T) {
	for _, running := range []bool{false, true} {
		t.Run(fmt.Sprintf("running=%v", running), func(t *testing.T) {
			sub := newChanSub()
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan error, 1)
			if running {
				go func() { ran <- c.Run(context.Background(), func(context.Context, *Delivery) error { return nil }) }()
				testutil.WaitFor(t, func() bool { c.mu.Lock(); defer c.mu.Unlock(); return c.active != nil })
			} else {
				ran <- nil
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			closed := make(chan error, 1)
			go func() { closed <- c.Close(ctx) }()
			if err := within(t, closed, "Close"); err != nil {
				t.Fatalf("Close = %v, want nil", err)
			}
			if err := within(t, ran, "Run"); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}
			if got := sub.log(); fmt.Sprint(got) != "[close]" {
				t.Fatalf("events = %q, want one close", got)
			}
		})
	}
}

func TestLeaseIsExtendedWhileHandlerRuns(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake})
	release := make(chan struct{})
	stop := runConsumer(t, c, func(ctx context.Context, d *Delivery) error { <-release; return nil })
	sub.push("a", 30*time.Second)
	for i := 1; i <= 3; i++ {
		testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
		fake.Advance(15 * time.Second)
		testutil.WaitFor(t, func() bool { sub.mu.Lock(); defer sub.mu.Unlock(); return sub.extends["a"] == i })
	}
	close(release)
	testutil.WaitFor(t, func() bool { return sub.get("a") == "ack" })
	_ = stop()
}

func TestFatalReceiveErrorEndsRun(t *testing.T) {
	sub := newChanSub()
	sub.recvErr = errors.New("subscription deleted")
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{})
	err := c.Run(context.Background(), func(context.Context, *Delivery) error { return nil })
	if err == nil || !errors.Is(err, sub.recvErr) {
		t.Fatalf("Run = %v, want the receive error", err)
	}
}

type ttlOnly time.Duration

func (d ttlOnly) Wrap(h Handler) Handler { return h }
func (d ttlOnly) TTL() time.Duration     { return time.Duration(d) }

func TestNewConsumerChecksDedupTTL(t *testing.T) {
	tests := []struct {
		name          string
		ttl           time.Duration
		publisherSpan time.Duration
		ok            bool
	}{
		{"ttl covers 5×(30s)+4×7s", 4 * time.Minute, 0, true},
		{"ttl too short", time.Minute, 0, false},
		{"publisher span beyond the 1m window", 4 * time.Minute, 3 * time.Minute, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewConsumer(context.Background(), newChanSub(), ConsumerOptions{Dedup: ttlOnly(tt.ttl), PublisherSpan: tt.publisherSpan})
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, window.ErrUnsafeRetry)) {
				t.Fatalf("NewConsumer = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

// logRecords keeps every log record, for tests of what the consumer logs.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// lines returns "LEVEL message" of every record at level or above.
func (l *logRecords) lines(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level >= level {
			out = append(out, r.Level.String()+" "+r.Message)
		}
	}
	return out
}

// A broker that goes away and comes back (here: 40 failed receives, a
// long outage on the consumer's capped backoff) must not end Run; the
// outage is logged once when it starts, once a minute while it lasts and
// once when it ends, not once per attempt.
func TestReceiveOutageIsRiddenThrough(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	const fails = 40
	sub.recvFails = fails
	logs := &logRecords{}
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake, Logger: slog.New(logs)})
	stop := runConsumer(t, c, func(context.Context, *Delivery) error { return nil })
	var waited time.Duration
	for i := 1; i <= fails; i++ {
		testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
		// Each wait is at most the cap, and at least half the cap once
		// the backoff has grown to it.
		before := fake.Now()
		fake.Advance(receiveBackoffMax)
		waited += fake.Now().Sub(before)
	}
	sub.push("after", 0)
	testutil.WaitFor(t, func() bool { return sub.get("after") == "ack" })
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil after an outage and a cancel", err)
	}
	got := logs.lines(slog.LevelInfo)
	// 40 waits of the 5s cap span 200s: a start line, reminders at 1m, 2m
	// and 3m, and the recovery.
	want := []string{
		"WARN dedupq: receive failed; retrying with backoff until the broker answers",
		"WARN dedupq: receive still failing; retrying",
		"WARN dedupq: receive still failing; retrying",
		"WARN dedupq: receive still failing; retrying",
		"INFO dedupq: receive recovered",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("logged %d lines at Info or above over %s of outage:\n%s\nwant:\n%s",
			len(got), waited, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestReceiveBackoffIsBounded(t *testing.T) {
	for n := 1; n <= 100; n++ {
		want := min(receiveBackoffMin<<min(n-1, 16), receiveBackoffMax)
		for range 20 {
			if got := receiveBackoff(n); got < want/2 || got > want {
				t.Fatalf("receiveBackoff(%d) = %s, want within [%s, %s]", n, got, want/2, want)
			}
		}
	}
}

// An ack that fails while the broker is away is retried until it gets
// through, within SettleTimeout, rather than given up after a few tries.
func TestSettleRetriesThroughAnOutage(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	sub.ackErrs = 20
	c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake, SettleTimeout: time.Hour})
	stop := runConsumer(t, c, func(context.Context, *Delivery) error { return nil })
	sub.push("a", 0)
	for sub.get("a") != "ack" {
		// Both the settle retry and the idle receive may be waiting.
		testutil.WaitFor(t, func() bool { return sub.get("a") == "ack" || fake.Waiters() >= 1 })
		fake.Advance(settleBackoffMax)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// A handler that fails because something it depends on is down
// (ErrUnavailable, which dedup.ErrStoreUnavailable matches) is run again on
// the same delivery until it succeeds, and the delivery is acked: nacking
// it would spend one of the message's deliveries per failed try, and a
// broker that redelivers at once would dead-letter it within seconds.
// Once Run is told to stop, such a delivery is nacked instead.
func TestUnavailableDependencyHoldsTheDelivery(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failures  int // tries that fail before one succeeds; -1 never
		stopFirst bool
		want      string
	}{
		{name: "outage ends", failures: 3, want: "ack"},
		{name: "consumer stops during the outage", failures: -1, stopFirst: true, want: "nack 7s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			sub := newChanSub()
			c, _ := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake})
			var mu sync.Mutex
			var tries []int
			stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				tries = append(tries, d.Attempt)
				if tc.failures < 0 || len(tries) <= tc.failures {
					return fmt.Errorf("store: %w", ErrUnavailable)
				}
				return nil
			})
			sub.push("a", 0)
			triesSoFar := func() int { mu.Lock(); defer mu.Unlock(); return len(tries) }
			if tc.stopFirst {
				testutil.WaitFor(t, func() bool { return triesSoFar() == 1 })
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			} else {
				for sub.get("a") == "" {
					// The held delivery's backoff and the idle receive may both wait.
					testutil.WaitFor(t, func() bool { return sub.get("a") != "" || fake.Waiters() >= 1 })
					fake.Advance(receiveBackoffMax)
				}
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			}
			if got := sub.get("a"); got != tc.want {
				t.Fatalf("settled = %q, want %q", got, tc.want)
			}
			mu.Lock()
			defer mu.Unlock()
			if !tc.stopFirst && len(tries) != tc.failures+1 {
				t.Fatalf("handler ran %d times, want %d", len(tries), tc.failures+1)
			}
			for _, a := range tries {
				if a != 1 {
					t.Fatalf("tries saw attempts %v; want every try on the first delivery", tries)
				}
			}
		})
	}
}
