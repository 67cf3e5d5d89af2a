// Tests of the Consumer's holds (a delivery held while its handler's
// dependency is unavailable, a nack held for a broker that cannot delay a
// redelivery) against channel-fed drivers on a fake clock: no services.
// Each is a regression test of a defect of issue 23.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
)

// unavailableForever is a handler whose dependency never comes back; it
// records when each try started.
type unavailableForever struct {
	clk       clock.Clock
	mu        sync.Mutex
	tries     []time.Time
	deadlines []time.Time // each try's Delivery.ClaimDeadline
}

func (u *unavailableForever) handle(_ context.Context, d *Delivery) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.tries = append(u.tries, u.clk.Now())
	u.deadlines = append(u.deadlines, d.ClaimDeadline)
	return fmt.Errorf("store: %w", ErrUnavailable)
}

func (u *unavailableForever) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.tries)
}

// Issue 23, defect 1: a delivery held while its dependency is unavailable
// is tried again only until its claim deadline, then nacked with the
// policy's backoff, as the startup check's model assumes of every
// delivery: the earliest of the broker's ack wait from its receipt (30s
// here), half its lease (when the lease would first be renewed, though no
// claim is held), and the dedup TTL less the margin (one delivery, which
// the check lets use any TTL: a TxGuard whose commit answer was lost must
// still find its record when it tries again). Before, it was held until
// the dependency came back, however long, and its claim could come after
// the first delivery's completion record had expired.
func TestUnavailableHoldEndsAtTheClaimDeadline(t *testing.T) {
	for _, tt := range []struct {
		name     string
		dedup    Deduplicator
		one      bool // a single delivery, no backoff
		lease    time.Duration
		deadline time.Duration // from the receipt
		want     string
	}{
		{"the ack wait", nil, false, 2 * time.Minute, 30 * time.Second, "nack 7s"},
		{"the ack wait, shorter than the TTL", ttlOnly(4 * time.Minute), false, 0, 30 * time.Second, "nack 7s"},
		{"half the lease, before its first renewal", ttlOnly(4 * time.Minute), false, 20 * time.Second, 10 * time.Second, "nack 7s"},
		{"the TTL less the margin, shorter than the ack wait", ttlOnly(10 * time.Second), true, 2 * time.Minute, 8 * time.Second, "nack 0s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			sub := newChanSub() // AckWait 30s, backoff 7s
			if tt.one {
				sub.redelivery.MaxDeliveries, sub.redelivery.Backoff = 1, nil
			}
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake, Dedup: tt.dedup})
			if err != nil {
				t.Fatal(err)
			}
			h := &unavailableForever{clk: fake}
			stop := runConsumer(t, c, h.handle)
			defer stop()
			received := fake.Now()
			sub.push("a", tt.lease)
			testutil.WaitFor(t, func() bool { return h.count() == 1 })
			const limit = 2 * time.Minute
			waiters := 1 // the hold's backoff
			if tt.lease > 0 {
				waiters++ // and the lease's first renewal
			}
			for sub.get("a") == "" && fake.Now().Sub(received) < limit {
				// The hold's backoff, the lease's extension and the idle
				// receive may all wait.
				testutil.WaitFor(t, func() bool { return sub.get("a") != "" || fake.Waiters() >= waiters })
				fake.Advance(time.Second)
			}
			if got := sub.get("a"); got != tt.want {
				t.Fatalf("after %s of outage the delivery is settled %q, want %q: held past its claim deadline", fake.Now().Sub(received), got, tt.want)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.tries) < 3 {
				t.Errorf("%d tries, want the delivery held for several", len(h.tries))
			}
			for i, at := range h.tries {
				if at.Sub(received) >= tt.deadline {
					t.Errorf("try %d started %s after the receipt, at or after the claim deadline (%s)", i+1, at.Sub(received), tt.deadline)
				}
				// The handler (a Deduplicator) is told the deadline, to
				// bound its claim by it.
				if got := h.deadlines[i]; !got.Equal(received.Add(tt.deadline)) {
					t.Errorf("try %d saw ClaimDeadline %s after the receipt, want %s", i+1, got.Sub(received), tt.deadline)
				}
			}
			// Where the renewal is due after the deadline anyway, none may
			// come (at the deadline itself, the test's steps of fake time
			// can wake the hold and the renewal together).
			sub.mu.Lock()
			defer sub.mu.Unlock()
			if n := sub.extends["a"]; n != 0 && tt.lease/2 > tt.deadline {
				t.Errorf("the lease was renewed %d times during the hold, which holds no claim", n)
			}
		})
	}
}

// Issue 23, defect 3: Close ends a hold at once, as cancelling Run's
// context does, even when the handler keeps failing fast with
// ErrUnavailable (an open circuit breaker) and ignores its context. Before,
// the hold waited only on Run's context: Close did not return.
func TestCloseEndsAnUnavailableHold(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	h := &unavailableForever{clk: fake}
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(context.Background(), h.handle) }()
	sub.push("a", 0)
	testutil.WaitFor(t, func() bool { return h.count() == 1 && fake.Waiters() >= 1 })
	closed := make(chan error, 1)
	go func() { closed <- c.Close(context.Background()) }()
	if err := within(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	if err := within(t, runDone, "Run"); err != nil {
		t.Fatal(err)
	}
	if got, want := sub.log(), []string{"a nack 7s", "close"}; !slices.Equal(got, want) {
		t.Errorf("events = %q, want %q", got, want)
	}
}

// fatalAfterFirst delivers what was pushed once, then fails every receive
// for good.
type fatalAfterFirst struct {
	*holdingSub
	mu       sync.Mutex
	received bool
}

var errGone = errors.New("subscription deleted")

func (s *fatalAfterFirst) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	s.mu.Lock()
	done := s.received
	s.received = true
	s.mu.Unlock()
	if done {
		return nil, errGone
	}
	return s.holdingSub.Receive(ctx, max)
}

// Issue 23, defect 4: a receive that fails for good ends every hold at
// once, nacking its delivery, as the end of Run does: a nack held for an
// hour, and a delivery held while its dependency is down. Before, Run
// waited for each to end on its own.
func TestFatalReceiveEndsTheHolds(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error // the handler's
	}{
		{"a held nack", RetryAfter(errors.New("busy"), time.Hour)},
		{"a delivery held while its dependency is down", fmt.Errorf("store: %w", ErrUnavailable)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			sub := &fatalAfterFirst{holdingSub: &holdingSub{chanSub: newChanSub(), maxHold: time.Hour}}
			sub.redelivery.AckWait = 2 * time.Hour // no claim deadline ends the hold here
			// A second slot, so that the receive after the held delivery's
			// happens (and fails).
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake, Concurrency: 2})
			if err != nil {
				t.Fatal(err)
			}
			sub.push("a", 0)
			done := make(chan error, 1)
			go func() { done <- c.Run(context.Background(), func(context.Context, *Delivery) error { return tt.err }) }()
			if err := within(t, done, "Run"); !errors.Is(err, errGone) {
				t.Fatalf("Run = %v, want the receive's error", err)
			}
			if got, want := sub.log(), []string{"a nack 0s"}; !slices.Equal(got, want) {
				t.Errorf("events = %q, want %q", got, want)
			}
		})
	}
}

// Issue 23, defect 6: a held nack keeps the lease on the rhythm of the
// handler's extensions: its first renewal is due half a lease after the
// handler's last one, not half a lease after the hold starts. A 40s lease
// renewed at 20s expires at 60s; the handler fails at 39.99s; the hold must
// renew at 40s, not at 59.99s, 10ms before the lock lapses.
func TestHeldNackRenewsOnTheLeaseRhythm(t *testing.T) {
	const lease = 40 * time.Second
	fake, sub, c := newHolding(t, time.Hour)
	fail := make(chan struct{})
	stop := runConsumer(t, c, func(context.Context, *Delivery) error {
		<-fail
		return RetryAfter(errors.New("busy"), 5*time.Minute)
	})
	defer stop()
	extends := func() int { sub.mu.Lock(); defer sub.mu.Unlock(); return sub.extends["a"] }
	sub.push("a", lease)
	testutil.WaitFor(t, func() bool { return fake.Waiters() >= 1 }) // the first extension's timer
	fake.Advance(lease / 2)
	testutil.WaitFor(t, func() bool { return extends() == 1 })
	fake.Advance(lease/2 - 10*time.Millisecond)
	close(fail)
	// The hold's timer and the lease scheduler's.
	testutil.WaitFor(t, func() bool { return fake.Waiters() >= 2 })
	if got := sub.get("a"); got != "" {
		t.Fatalf("settled %q at the start of the hold", got)
	}
	fake.Advance(10 * time.Millisecond)
	// A renewal due later than 40s never comes: WaitFor fails.
	testutil.WaitFor(t, func() bool { return extends() == 2 })
}

// A delivery that the driver held before handing it over
// (driver.Delivery.Received: a client that receives ahead, as Pub/Sub's)
// has its lease and claim deadline counted from when the broker handed it
// out: one that waited past its deadline is given back unhandled (a nack
// with no delay), one still within it runs.
func TestDeliveryHeldByTheDriverCountsFromItsReceipt(t *testing.T) {
	for _, tt := range []struct {
		name   string
		waited time.Duration // in the driver, before Receive returned it
		want   string
		ran    bool
	}{
		{"within its claim deadline", 4 * time.Second, "ack", true},
		{"past its claim deadline", 5 * time.Second, "nack 0s", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := clock.NewFake(time.Unix(1000, 0))
			sub := newChanSub() // AckWait 30s
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake})
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Bool
			stop := runConsumer(t, c, func(context.Context, *Delivery) error { ran.Store(true); return nil })
			defer stop()
			// A lease of 10s: its first renewal, and so the claim
			// deadline, is 5s after the broker handed it out.
			sub.in <- &driver.Delivery{Message: driver.Message{ID: "a"}, Attempt: 1, Lease: 10 * time.Second, Received: fake.Now().Add(-tt.waited)}
			testutil.WaitFor(t, func() bool { return sub.get("a") != "" })
			if got := sub.get("a"); got != tt.want || ran.Load() != tt.ran {
				t.Errorf("settled %q, handler ran %v; want %q, %v", got, ran.Load(), tt.want, tt.ran)
			}
		})
	}
}
