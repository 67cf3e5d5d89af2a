// Tests of the Consumer's ordered groups against a channel-fed driver that
// orders groups and returns several deliveries per receive, on a fake
// clock where time matters: no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
	"github.com/dedupq/dedupq/window"
)

// orderedSub is a chanSub whose broker orders groups, as SQS FIFO does,
// and whose receive returns a whole batch at once.
type orderedSub struct {
	*chanSub
	batches chan []*driver.Delivery
}

func newOrderedSub() *orderedSub {
	return &orderedSub{chanSub: newChanSub(), batches: make(chan []*driver.Delivery, 10)}
}

func (s *orderedSub) OrdersGroups(context.Context) error { return nil }

func (s *orderedSub) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	select {
	case ds := <-s.batches:
		if len(ds) > max {
			panic(fmt.Sprintf("a batch of %d for a receive of %d", len(ds), max))
		}
		return ds, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pushBatch makes one receive return deliveries of the IDs, each
// "group-n" in group "group".
func (s *orderedSub) pushBatch(ids ...string) {
	var ds []*driver.Delivery
	for _, id := range ids {
		group, _, _ := strings.Cut(id, "-")
		ds = append(ds, &driver.Delivery{Message: driver.Message{ID: id, GroupKey: group}, Attempt: 1, BackendID: "b-" + id})
	}
	s.batches <- ds
}

// pushAgain makes one receive return a redelivery of id.
func (s *orderedSub) pushAgain(id string, attempt int) {
	group, _, _ := strings.Cut(id, "-")
	s.batches <- []*driver.Delivery{{Message: driver.Message{ID: id, GroupKey: group}, Attempt: attempt, BackendID: "b-" + id}}
}

// newOrderedConsumer is a Consumer with opts on a fresh orderedSub.
func newOrderedConsumer(t *testing.T, opts ConsumerOptions) (*orderedSub, *Consumer) {
	t.Helper()
	sub := newOrderedSub()
	c, err := NewConsumer(context.Background(), sub, opts)
	if err != nil {
		t.Fatal(err)
	}
	return sub, c
}

// runLog records handler starts and ends, in order.
type runLog struct {
	mu     sync.Mutex
	events []string
}

func (tr *runLog) add(e string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, e)
}

func (tr *runLog) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.events)
}

// failing is a handler that logs each start and fails every delivery of
// id.
func (tr *runLog) failing(id string) Handler {
	return func(_ context.Context, d *Delivery) error {
		tr.add("start " + d.Message.ID)
		if d.Message.ID == id {
			return errors.New("failed")
		}
		return nil
	}
}

func (tr *runLog) has(e string) bool { return slices.Contains(tr.get(), e) }

// The deliveries of one group run one at a time in the order received,
// each after the one before it succeeded or was terminated, while another
// group runs beside them.
func TestGroupRunsInOrderBesideOtherGroups(t *testing.T) {
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4, Ordered: true})
	var tr runLog
	stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
		id := d.Message.ID
		tr.add("start " + id)
		defer tr.add("end " + id)
		if id == "a-1" {
			// The other group runs meanwhile: a-1 ends only once b-1 has
			// started.
			testutil.WaitFor(t, func() bool { return tr.has("start b-1") })
		}
		if id == "a-2" {
			return Permanent(errors.New("poison")) // terminated: a-3 goes on
		}
		return nil
	})
	defer stop()
	sub.pushBatch("a-1", "a-2", "a-3", "b-1")
	testutil.WaitFor(t, func() bool { return sub.get("a-3") != "" && sub.get("b-1") != "" })
	var order []string
	for _, e := range tr.get() {
		if e[len(e)-3] == 'a' {
			order = append(order, e)
		}
	}
	want := []string{"start a-1", "end a-1", "start a-2", "end a-2", "start a-3", "end a-3"}
	if !slices.Equal(order, want) {
		t.Errorf("group a ran %q, want %q", order, want)
	}
	for id, want := range map[string]string{"a-1": "ack", "a-2": "term", "a-3": "ack", "b-1": "ack"} {
		if got := sub.get(id); got != want {
			t.Errorf("%s settled %q, want %q", id, got, want)
		}
	}
}

// When a group's head fails, the deliveries behind it are given back
// unhandled with the head's delay, to come again after it.
func TestGroupHeadFailureGivesBackTheRest(t *testing.T) {
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4})
	var tr runLog
	stop := runConsumer(t, c, tr.failing("a-1"))
	defer stop()
	sub.pushBatch("a-1", "a-2", "a-3", "b-1")
	testutil.WaitFor(t, func() bool { return sub.get("a-3") != "" && sub.get("b-1") != "" })
	if got := tr.get(); slices.Contains(got, "start a-2") || slices.Contains(got, "start a-3") {
		t.Errorf("ran %q: a delivery behind a failed head ran", got)
	}
	for id, want := range map[string]string{"a-1": "nack 7s", "a-2": "nack 7s", "a-3": "nack 7s", "b-1": "ack"} {
		if got := sub.get(id); got != want {
			t.Errorf("%s settled %q, want %q", id, got, want)
		}
	}
	if s := c.Stats(); s.Received != 4 || s.Nacked != 3 || s.Acked != 1 {
		t.Errorf("stats = %+v, want 4 received, 3 nacked, 1 acked", s)
	}
}

// A broker that goes on streaming a group after its head failed (Pub/Sub,
// JetStream) cannot make a later message overtake the head's redelivery:
// every later arrival is given back, due after the head, until the head
// comes again; then the group runs in order again.
func TestGroupBlockedUntilItsFailedHeadComesAgain(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4, Clock: fake})
	var tr runLog
	stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
		tr.add(fmt.Sprintf("start %s #%d", d.Message.ID, d.Attempt))
		if d.Message.ID == "a-1" && d.Attempt == 1 {
			return errors.New("failed")
		}
		return nil
	})
	defer stop()
	sub.pushBatch("a-1")
	testutil.WaitFor(t, func() bool { return sub.get("a-1") != "" })
	fake.Advance(2 * time.Second)
	sub.pushBatch("a-2", "b-1")
	testutil.WaitFor(t, func() bool { return sub.get("a-2") != "" && sub.get("b-1") != "" })
	if got := sub.get("a-2"); got != "nack 5.25s" {
		t.Errorf("a-2, arriving 2s after a-1 failed with a 7s backoff, settled %q, want given back due after a-1 (nack 5.25s)", got)
	}
	fake.Advance(5 * time.Second)
	sub.pushAgain("a-1", 2)
	testutil.WaitFor(t, func() bool { return sub.get("a-1") == "ack" })
	sub.pushAgain("a-2", 2)
	testutil.WaitFor(t, func() bool { return sub.get("a-2") == "ack" })
	want := []string{"start a-1 #1", "start b-1 #1", "start a-1 #2", "start a-2 #2"}
	if got := tr.get(); !slices.Equal(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}
}

// A group whose given-back delivery does not come again (the broker
// dropped it, or handed it to another consumer) is let go once its lease
// has passed after it was due.
func TestGroupBlockEndsWithoutItsHead(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4, Clock: fake})
	stop := runConsumer(t, c, new(runLog).failing("a-1"))
	defer stop()
	sub.pushBatch("a-1")
	testutil.WaitFor(t, func() bool { return sub.get("a-1") != "" })
	fake.Advance(7*time.Second + 30*time.Second) // the backoff, then the ack wait
	sub.pushBatch("a-2")
	testutil.WaitFor(t, func() bool { return sub.get("a-2") == "ack" })
}

// A delivery that waited behind its group's head past its claim deadline
// (the ack wait, 30s here) is given back with those behind it: started
// then, it would claim its key later than the startup check counts. The
// group then waits for it to come again.
func TestGroupFollowerPastItsClaimDeadlineIsGivenBack(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4, Clock: fake})
	var tr runLog
	release := make(chan struct{})
	stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
		tr.add("start " + d.Message.ID)
		if d.Message.ID == "a-1" {
			<-release
		}
		return nil
	})
	defer stop()
	sub.pushBatch("a-1", "a-2", "a-3")
	testutil.WaitFor(t, func() bool { return tr.has("start a-1") })
	fake.Advance(30 * time.Second)
	close(release)
	testutil.WaitFor(t, func() bool { return sub.get("a-3") != "" })
	if got := tr.get(); !slices.Equal(got, []string{"start a-1"}) {
		t.Errorf("ran %q, want only the head", got)
	}
	for id, want := range map[string]string{"a-1": "ack", "a-2": "nack 0s", "a-3": "nack 0s"} {
		if got := sub.get(id); got != want {
			t.Errorf("%s settled %q, want %q", id, got, want)
		}
	}
	// The group now waits for a-2: a later one arriving first goes back.
	sub.pushBatch("a-4")
	testutil.WaitFor(t, func() bool { return sub.get("a-4") != "" })
	if got := sub.get("a-4"); got != "nack 250ms" {
		t.Errorf("a-4, arriving before the given-back a-2, settled %q, want given back (nack 250ms)", got)
	}
	sub.pushAgain("a-2", 2)
	testutil.WaitFor(t, func() bool { return sub.get("a-2") == "ack" })
}

// The deliveries waiting behind a group's head when the Run stops are
// given back once the head has settled, not started.
func TestGroupFollowersGivenBackWhenTheRunStops(t *testing.T) {
	sub, c := newOrderedConsumer(t, ConsumerOptions{Concurrency: 4})
	var tr runLog
	release := make(chan struct{})
	stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
		tr.add("start " + d.Message.ID)
		if d.Message.ID == "a-1" {
			<-release
		}
		return nil
	})
	sub.pushBatch("a-1", "a-2")
	testutil.WaitFor(t, func() bool { return tr.has("start a-1") })
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	testutil.WaitFor(t, func() bool { return c.isStopping() })
	close(release)
	if err := within(t, stopped, "Run"); err != nil {
		t.Fatal(err)
	}
	if got := tr.get(); !slices.Equal(got, []string{"start a-1"}) {
		t.Errorf("ran %q, want only the head", got)
	}
	if got := sub.get("a-2"); got != "nack 0s" {
		t.Errorf("a-2 settled %q, want given back (nack 0s)", got)
	}
}

// Ordered on a subscription that cannot keep a group's order is refused at
// construction, with the reason; without Ordered such a subscription runs
// a group's deliveries at once, as before.
func TestOrderedRefusedWhereTheBrokerCannotOrder(t *testing.T) {
	_, err := NewConsumer(context.Background(), newChanSub(), ConsumerOptions{Ordered: true})
	if !errors.Is(err, ErrOrderingUnsupported) {
		t.Fatalf("NewConsumer = %v, want ErrOrderingUnsupported", err)
	}
	refusing := &refusingOrderSub{orderedSub: newOrderedSub()}
	_, err = NewConsumer(context.Background(), refusing, ConsumerOptions{Ordered: true})
	if !errors.Is(err, ErrOrderingUnsupported) || !errors.Is(err, errNoSessions) {
		t.Fatalf("NewConsumer = %v, want ErrOrderingUnsupported wrapping the driver's reason", err)
	}
	if _, err := NewConsumer(context.Background(), refusing, ConsumerOptions{}); err != nil {
		t.Fatalf("without Ordered: %v", err)
	}
}

// isStopping reports whether c's Run has begun to stop.
func (c *Consumer) isStopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.active != nil && isDone(c.active.stopping)
}

var errNoSessions = errors.New("the queue was created without sessions; create it with RequiresSession")

type refusingOrderSub struct{ *orderedSub }

func (refusingOrderSub) OrdersGroups(context.Context) error { return errNoSessions }

// An ordered consumer's check counts the head-of-line wait of a resent
// copy (package window, "Ordered groups"): with the publishers' span
// beyond the window, no TTL covers an undeclared GroupBacklog, and a
// declared one needs max(P, R) + (B+1)·R. Unordered, the same TTL passes.
func TestOrderedCheckCountsTheGroupBacklog(t *testing.T) {
	// R = 5 × 30s + 7s × 4 = 2m58s; P = 2m beyond the 1m window.
	const p = 2 * time.Minute
	for _, tc := range []struct {
		name    string
		opts    ConsumerOptions
		refused bool
	}{
		{"unordered", ConsumerOptions{PublisherSpan: p, Dedup: ttlOnly(10 * time.Minute)}, false},
		{"ordered, no backlog declared", ConsumerOptions{Ordered: true, PublisherSpan: p, Dedup: ttlOnly(time.Hour)}, true},
		// 2m58s + 3 × 2m58s = 11m52s, over 0.8 = 14m50s.
		{"ordered, backlog 2, TTL short", ConsumerOptions{Ordered: true, GroupBacklog: 2, PublisherSpan: p, Dedup: ttlOnly(14 * time.Minute)}, true},
		{"ordered, backlog 2, TTL covers it", ConsumerOptions{Ordered: true, GroupBacklog: 2, PublisherSpan: p, Dedup: ttlOnly(15 * time.Minute)}, false},
		{"ordered, publisher span within the window", ConsumerOptions{Ordered: true, PublisherSpan: 30 * time.Second, Dedup: ttlOnly(4 * time.Minute)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewConsumer(context.Background(), newOrderedSub(), tc.opts)
			if tc.refused {
				if !errors.Is(err, window.ErrUnsafeRetry) || !strings.Contains(err.Error(), "GroupBacklog") {
					t.Fatalf("NewConsumer = %v, want an unsafe plan naming GroupBacklog", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewConsumer = %v", err)
			}
			c.Close(context.Background())
		})
	}
}
