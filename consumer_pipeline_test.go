// Tests of settle pipelining (a Run with Dedup gives a delivery's handler
// slot back before its ack is confirmed) against a channel-fed driver: no
// services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
)

// gatedSub is a chanSub whose acks block until the gate is opened, and
// whose receives record how many deliveries they were asked for (the
// handler slots free at that moment) and can be told to return nothing.
type gatedSub struct {
	*chanSub
	gate    chan struct{} // closed to let the acks through
	empty   chan struct{} // a send makes a pending Receive return no delivery
	entered chan string   // the ID of each ack as it starts waiting
	closed  chan struct{} // closed by Close

	mu   sync.Mutex
	maxs []int // Receive's max, per call
}

func newGatedSub() *gatedSub {
	return &gatedSub{chanSub: newChanSub(), gate: make(chan struct{}), empty: make(chan struct{}),
		entered: make(chan string, 100), closed: make(chan struct{})}
}

func (s *gatedSub) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	s.mu.Lock()
	s.maxs = append(s.maxs, max)
	s.mu.Unlock()
	select {
	case d := <-s.in:
		return []*driver.Delivery{d}, nil
	case <-s.empty:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *gatedSub) receives() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.maxs)
}

func (s *gatedSub) Ack(ctx context.Context, d *driver.Delivery) error {
	s.entered <- d.Message.ID
	select {
	case <-s.gate:
	case <-s.closed: // a bug: the driver closed under a pending ack
	}
	return s.chanSub.Ack(ctx, d)
}

func (s *gatedSub) Close() error {
	close(s.closed)
	return s.chanSub.Close()
}

// With Dedup, a delivery's handler slot is free while its ack waits for
// the broker's confirmation; without, it is held until the ack is
// confirmed. Seen from the receive loop: with Concurrency 2, one delivery
// whose ack is pending, and a receive that comes back empty, the next
// receive asks for as many deliveries as slots are free.
func TestSlotIsReleasedBeforeAckConfirmationOnlyWithDedup(t *testing.T) {
	for _, tt := range []struct {
		name    string
		dedup   Deduplicator
		wantMax int // the free slots while a's ack is pending
	}{
		{"without dedup the slot is held", nil, 1},
		{"with dedup the slot is free", ttlOnly(4 * time.Minute), 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub := newGatedSub()
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Concurrency: 2, Dedup: tt.dedup})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var handled []string
			stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				handled = append(handled, d.Message.ID)
				return nil
			})
			sub.push("a", 0)
			if got := within(t, sub.entered, "a's ack"); got != "a" {
				t.Fatalf("ack of %q, want a", got)
			}
			// The loop has taken the one slot a did not hold, and waits
			// in its second receive.
			testutil.WaitFor(t, func() bool { return len(sub.receives()) == 2 })
			sub.empty <- struct{}{}
			testutil.WaitFor(t, func() bool { return len(sub.receives()) == 3 })
			if got := sub.receives(); got[2] != tt.wantMax {
				t.Fatalf("receives asked for %v while a's ack was pending; want the third to ask for %d", got, tt.wantMax)
			}
			if tt.dedup != nil {
				// The next delivery is handled while a's ack still waits.
				sub.push("b", 0)
				testutil.WaitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 2 })
				if sub.get("a") != "" {
					t.Fatal("a was acked before the gate opened")
				}
			}
			close(sub.gate)
			if tt.dedup == nil {
				sub.push("b", 0)
			}
			testutil.WaitFor(t, func() bool { return sub.get("a") == "ack" && sub.get("b") == "ack" })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Pending settles are part of the graceful drain: Run and Close return, and
// the driver is closed, only after every pending ack was confirmed, each
// exactly once.
func TestShutdownWaitsForPendingSettles(t *testing.T) {
	for _, viaClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("close=%v", viaClose), func(t *testing.T) {
			fake := clock.NewFake(time.Unix(0, 0))
			sub := newGatedSub()
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Dedup: ttlOnly(4 * time.Minute), Clock: fake})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ran := make(chan error, 1)
			go func() { ran <- c.Run(ctx, func(context.Context, *Delivery) error { return nil }) }()
			ids := []string{"a", "b", "c"} // within the 4 settles Concurrency 1 may have pending
			for _, id := range ids {
				sub.push(id, 0)
				within(t, sub.entered, "an ack")
			}
			closed := make(chan error, 1)
			if viaClose {
				go func() { closed <- c.Close(context.Background()) }()
			} else {
				cancel()
				closed <- nil
			}
			// The drain has begun (its ShutdownTimeout watch waits).
			testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
			select {
			case <-ran:
				t.Fatal("Run returned while acks were pending")
			case <-sub.closed:
				t.Fatal("the driver was closed while acks were pending")
			case <-time.After(50 * time.Millisecond): // a bounded negative check
			}
			close(sub.gate)
			if err := within(t, ran, "Run"); err != nil {
				t.Fatalf("Run = %v", err)
			}
			if err := within(t, closed, "Close"); err != nil {
				t.Fatalf("Close = %v", err)
			}
			got := sub.log()
			want := []string{"a ack", "b ack", "c ack"}
			if viaClose {
				want = append(want, "close")
			}
			// The acks in any order, then the close: a close among them
			// fails the comparison.
			slices.Sort(got[:min(len(ids), len(got))])
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("events = %q, want %q", got, want)
			}
			if s := c.Stats(); s.Received != 3 || s.Acked != 3 || s.SettleFailed != 0 {
				t.Fatalf("stats = %+v, want 3 received and acked", s)
			}
			if !viaClose {
				if err := c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// fastAckSub is a chanSub that can also ack unconfirmed: such acks are
// recorded as "fast ack", and the first failFast of them fail unsent.
type fastAckSub struct {
	*chanSub
	failFast int
}

func (s *fastAckSub) AckUnconfirmed(d *driver.Delivery) error {
	s.mu.Lock()
	if s.failFast > 0 {
		s.failFast--
		s.mu.Unlock()
		return errUnavailable
	}
	s.mu.Unlock()
	s.record(d, "fast ack")
	return nil
}

// An unconfirmed ack is used only where a dedup store covers its loss, only
// for an ack, and an unconfirmed ack that could not be sent falls back to
// the confirmed one.
func TestUnconfirmedAckOnlyWithDedup(t *testing.T) {
	for _, tt := range []struct {
		name     string
		dedup    Deduplicator
		failFast int
		want     map[string]string
	}{
		{"without dedup every ack is confirmed", nil, 0, map[string]string{"ok": "ack", "fails": "nack 7s"}},
		{"with dedup an ack is unconfirmed", ttlOnly(4 * time.Minute), 0, map[string]string{"ok": "fast ack", "fails": "nack 7s"}},
		{"an unconfirmed ack not sent is sent confirmed", ttlOnly(4 * time.Minute), 1, map[string]string{"ok": "ack", "fails": "nack 7s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sub := &fastAckSub{chanSub: newChanSub(), failFast: tt.failFast}
			c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Dedup: tt.dedup})
			if err != nil {
				t.Fatal(err)
			}
			stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
				if d.Message.ID == "fails" {
					return fmt.Errorf("handler failed")
				}
				return nil
			})
			sub.push("ok", 0)
			sub.push("fails", 0)
			testutil.WaitFor(t, func() bool { return sub.get("ok") != "" && sub.get("fails") != "" })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			for id, want := range tt.want {
				if got := sub.get(id); got != want {
					t.Errorf("%s settled %q, want %q", id, got, want)
				}
			}
			if s := c.Stats(); s.Acked != 1 || s.Nacked != 1 || s.SettleFailed != 0 {
				t.Errorf("stats = %+v, want 1 acked, 1 nacked", s)
			}
		})
	}
}

// holdingSub is a chanSub whose broker cannot delay a redelivery: the
// Consumer holds its nacks itself (driver.NackHolder), for at most maxHold.
type holdingSub struct {
	*chanSub
	maxHold time.Duration
}

func (s *holdingSub) MaxNackHold(*driver.Delivery) time.Duration { return s.maxHold }

// newHolding returns a Consumer on a holdingSub, on a fake clock.
func newHolding(t *testing.T, maxHold time.Duration) (*clock.Fake, *holdingSub, *Consumer) {
	t.Helper()
	fake := clock.NewFake(time.Unix(0, 0))
	sub := &holdingSub{chanSub: newChanSub(), maxHold: maxHold}
	c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	return fake, sub, c
}

// A nack with a delay, on a driver that cannot delay a redelivery, is held
// by the Consumer for the delay, at most MaxNackHold, the delivery's lease
// extended meanwhile, and the driver's Nack is then called with no delay.
func TestNackHeldWhereTheBrokerCannotDelay(t *testing.T) {
	const lease = 8 * time.Second // extended every 4s
	for _, tt := range []struct {
		name    string
		maxHold time.Duration
		err     error         // the handler's
		held    time.Duration // how long the nack is held; 0 for not at all
	}{
		{"the handler's delay", time.Minute, RetryAfter(errors.New("busy"), 20*time.Second), 20 * time.Second},
		{"capped at MaxNackHold", 10 * time.Second, RetryAfter(errors.New("busy"), time.Minute), 10 * time.Second},
		{"the policy's backoff without a delay", time.Minute, errors.New("failed"), 7 * time.Second},
		{"no hold where MaxNackHold is zero", 0, RetryAfter(errors.New("busy"), time.Minute), 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake, sub, c := newHolding(t, tt.maxHold)
			stop := runConsumer(t, c, func(context.Context, *Delivery) error { return tt.err })
			defer stop()
			sub.push("a", lease)
			if tt.held > 0 {
				// The hold waits on its timer, and the lease scheduler on
				// the first extension's.
				testutil.WaitFor(t, func() bool { return fake.Waiters() == 2 })
				if got := sub.get("a"); got != "" {
					t.Fatalf("settled %q at the start of the hold", got)
				}
				fake.Advance(tt.held - time.Nanosecond)
				testutil.WaitFor(t, func() bool { sub.mu.Lock(); defer sub.mu.Unlock(); return sub.extends["a"] >= 1 })
				if got := sub.get("a"); got != "" {
					t.Fatalf("settled %q before the hold of %s ended", got, tt.held)
				}
				fake.Advance(time.Nanosecond)
			}
			testutil.WaitFor(t, func() bool { return sub.get("a") != "" })
			if got := sub.get("a"); got != "nack 0s" {
				t.Errorf("settled %q, want a nack with no delay", got)
			}
			if s := c.Stats(); s.Nacked != 1 || s.SettleFailed != 0 {
				t.Errorf("stats = %+v, want 1 nacked", s)
			}
		})
	}
}

// The end of the Run ends every hold at once: a Run whose context is done
// nacks the held delivery before it returns, long before its delay; one
// stopped by Close leaves it unsettled for the driver's Close, which gives
// it back.
func TestHeldNacksEndWhenTheRunStops(t *testing.T) {
	for _, tt := range []struct {
		name  string
		close bool
		want  []string
	}{
		{"the Run's context done: nacked", false, []string{"a nack 0s"}},
		{"Close: left to the driver's Close", true, []string{"close"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake, sub, c := newHolding(t, time.Hour)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				done <- c.Run(ctx, func(context.Context, *Delivery) error {
					return RetryAfter(errors.New("busy"), time.Hour)
				})
			}()
			sub.push("a", 0)
			testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 }) // the hold
			if tt.close {
				if err := c.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
			} else {
				cancel()
			}
			if err := within(t, done, "Run's return"); err != nil {
				t.Fatal(err)
			}
			if got := sub.log(); !slices.Equal(got, tt.want) {
				t.Errorf("events = %q, want %q", got, tt.want)
			}
		})
	}
}
