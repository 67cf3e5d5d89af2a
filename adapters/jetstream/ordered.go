package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// An ordered durable (Config.Ordered; "Ordered groups" in the package doc)
// is one with a pinned priority group: the server hands its messages to
// one client at a time, and to another only once that one has not pulled
// for PinnedTTL. This file is what consuming one takes beyond an ordinary
// durable: pulls that name the group, a pin kept while deliveries are out,
// a takeover that waits for the previous owner's deliveries, and
// redeliveries that come back in stream order.

// PriorityGroup is the priority group of the ordered durables this package
// creates, and the one it pulls as.
const PriorityGroup = "dedupq"

// OrderedServerVersion is the oldest nats-server with priority groups and
// pinned clients, which ordered durables need.
const OrderedServerVersion = "2.11.0"

// pinSlack is added to PinnedTTL beyond the pull wait and the ack wait for
// the server's own lags: the pending check that moves an expired delivery
// to the redelivery queue runs on a timer, and the pin's timer starts when
// the pull arrives, not when the client sent it.
const pinSlack = time.Second

// takeWait is the expiry of a pull that takes what waits: a pull that
// names a priority group cannot be a no-wait pull in the client
// (FetchNoWait takes no options, and the server refuses a pull without
// the group), so it is a pull that the server ends this soon, having
// handed out what it had.
const takeWait = 20 * time.Millisecond

// collectBatch is the size of the pulls that gather every redelivery due
// after a takeover (inStreamOrder).
const collectBatch = 256

// orderedPullWait is the pull wait (MaxRequestExpires) of an ordered
// durable created with ack wait hold: half of it, within [minPullWait,
// pollWait], so that a short ack wait makes a short PinnedTTL.
func orderedPullWait(hold time.Duration) time.Duration {
	return min(max(hold/2, minPullWait), pollWait)
}

// MinPinnedTTL is the shortest PinnedTTL that keeps a group's order on an
// ordered durable created with ackWait (zero: the server's 30s): the
// longest pull (the durable's MaxRequestExpires, which this package sets
// to half of ackWait, from 1s to 5s), plus ackWait, plus a second of slack.
// A pin that lasts that long after the owner's last pull outlives every
// delivery the owner may still hold: they are all due for redelivery
// before another client can be pinned, and redeliveries go out before new
// messages.
func MinPinnedTTL(ackWait time.Duration) time.Duration {
	if ackWait <= 0 {
		ackWait = DefaultAckWait
	}
	return orderedPullWait(ackWait) + ackWait + pinSlack
}

// minPinnedTTL is MinPinnedTTL for a durable as it is: its pull wait and
// its longest hold.
func minPinnedTTL(c jetstream.ConsumerConfig) time.Duration {
	return pullWait(c) + redeliveryPolicy(c).AckWait + pinSlack
}

// maxNackDelay is the longest delay a nack keeps on durable c: a delivery
// nacked for longer might still be waiting when the pin has moved on, and
// the new owner would be handed later messages of its group first.
func maxNackDelay(c jetstream.ConsumerConfig) time.Duration {
	return max(c.PinnedTTL-pullWait(c)-pinSlack, 0)
}

// standbyPoll is how often a client that another one's pin keeps out asks
// whether the pin is gone. Waiting pulls would do that too, but the server
// moves a redelivery it pops for them to the end of its redelivery queue
// (it may not hand it to a client that is not pinned), and a group's
// redeliveries would come back out of order.
func standbyPoll(c jetstream.ConsumerConfig) time.Duration {
	return min(max(c.PinnedTTL/4, 100*time.Millisecond), time.Second)
}

// pinnedGroup is the priority group to pull as on durable c: its one group
// when its policy is pinned_client, else "".
func pinnedGroup(c jetstream.ConsumerConfig) string {
	if c.PriorityPolicy == jetstream.PriorityPolicyPinned && len(c.PriorityGroups) == 1 {
		return c.PriorityGroups[0]
	}
	return ""
}

// orderedConfig adds to c what an ordered durable is created with.
func orderedConfig(c *jetstream.ConsumerConfig, cfg Config) {
	hold := cfg.AckWait
	if hold == 0 {
		hold = DefaultAckWait
	}
	c.PriorityPolicy = jetstream.PriorityPolicyPinned
	c.PriorityGroups = []string{PriorityGroup}
	c.MaxRequestExpires = orderedPullWait(hold)
	c.PinnedTTL = cfg.PinnedTTL
	if c.PinnedTTL == 0 {
		c.PinnedTTL = MinPinnedTTL(hold)
	}
}

// orderProblems says what keeps pinned durable c from keeping a group's
// order, and where it differs from cfg's PinnedTTL.
func orderProblems(c jetstream.ConsumerConfig, cfg Config) []string {
	var problems []string
	if len(c.BackOff) > 0 {
		problems = append(problems, fmt.Sprintf("it has BackOff %v, with which a nack's delay and a redelivery's hold depend on the delivery count, so a group's messages can come back out of order: an ordered durable has none", c.BackOff))
	}
	if least := minPinnedTTL(c); c.PinnedTTL < least {
		problems = append(problems, fmt.Sprintf("its PinnedTTL is %s, shorter than its pull wait (%s) plus its longest hold (%s) plus %s of slack: another consumer could be pinned while a delivery of the last one is not yet due for redelivery, and be handed a later message of its group first; raise PinnedTTL to %s or more",
			window.FormatDuration(c.PinnedTTL), window.FormatDuration(pullWait(c)), window.FormatDuration(redeliveryPolicy(c).AckWait), pinSlack, window.FormatDuration(least)))
	}
	if cfg.PinnedTTL != 0 && c.PinnedTTL != cfg.PinnedTTL {
		problems = append(problems, fmt.Sprintf("its PinnedTTL is %s, not %s", window.FormatDuration(c.PinnedTTL), window.FormatDuration(cfg.PinnedTTL)))
	}
	return problems
}

// checkOrderedServer refuses an ordered durable on a server without
// priority groups, which would take the consumer's priority fields for
// unknown ones and create a durable without them.
func checkOrderedServer(version string) error {
	if serverAtLeast(version, 2, 11, 0) {
		return nil
	}
	return fmt.Errorf("jetstream: ordering by GroupKey needs nats-server %s or later (a durable consumer with a pinned priority group); the server runs %s", OrderedServerVersion, version)
}

var _ driver.GroupOrderer = (*Subscription)(nil)

// OrdersGroups reports nil when the durable keeps a group's order: it has
// a pinned priority group whose PinnedTTL outlasts the deliveries of a
// consumer that stopped (see MinPinnedTTL), or will be created so
// (Config.Ordered). Otherwise it says why not and what would
// (driver.GroupOrderer).
func (s *Subscription) OrdersGroups(context.Context) error {
	if err := checkOrderedServer(s.nc.ConnectedServerVersion()); err != nil {
		return err
	}
	_, cons := s.current()
	s.mu.Lock()
	c := s.consCfg
	s.mu.Unlock()
	if pinnedGroup(c) == "" {
		if cons == nil {
			return fmt.Errorf("jetstream: durable consumer %s on stream %s will be created without a pinned priority group, so every consumer would pull from it at once: add ordered=true (Config.Ordered)", s.cfg.Durable, s.cfg.Stream)
		}
		return fmt.Errorf("jetstream: durable consumer %s on stream %s has no pinned priority group, so every consumer pulls from it at once: give it PriorityPolicy pinned_client, PriorityGroups [%s] and a PinnedTTL of %s or more (an update can), or consume from a new durable with ordered=true (Config.Ordered), which is created so", s.cfg.Durable, s.cfg.Stream, PriorityGroup, window.FormatDuration(minPinnedTTL(c)))
	}
	if problems := orderProblems(c, Config{}); problems != nil {
		return &DurableError{Stream: s.cfg.Stream, Durable: s.cfg.Durable, Problems: problems}
	}
	return nil
}

// Ordering is how an ordered durable hands out a group's messages, as
// dedupq check prints it.
type Ordering struct {
	// Group is the priority group pulled as; "" when the durable has no
	// pinned priority group and so does not keep a group's order.
	Group string
	// PinnedTTL is how long the server keeps the pin of a consumer that
	// stopped pulling.
	PinnedTTL time.Duration
	// Takeover is the longest a group waits after its consumer stopped:
	// PinnedTTL and the standby's poll.
	Takeover time.Duration
	// MaxNackDelay is the longest delay a nack keeps; longer ones are
	// shortened to it.
	MaxNackDelay time.Duration
	// Problem is why the durable does not keep a group's order, when it
	// does not.
	Problem string
}

func (o Ordering) String() string {
	if o.Problem != "" {
		return "none: " + strings.TrimPrefix(o.Problem, "jetstream: ")
	}
	return fmt.Sprintf("priority group %q pinned to one consumer at a time; after the consumer stops, another takes its groups over within %s (PinnedTTL %s, then a poll); a nack waits at most %s",
		o.Group, window.FormatDuration(o.Takeover), window.FormatDuration(o.PinnedTTL), window.FormatDuration(o.MaxNackDelay))
}

// Ordering reports how the durable orders groups, as it is or as
// Provision will create it.
func (s *Subscription) Ordering(ctx context.Context) Ordering {
	s.mu.Lock()
	c := s.consCfg
	s.mu.Unlock()
	if err := s.OrdersGroups(ctx); err != nil {
		return Ordering{Group: pinnedGroup(c), Problem: err.Error()}
	}
	return Ordering{Group: pinnedGroup(c), PinnedTTL: c.PinnedTTL, Takeover: c.PinnedTTL + standbyPoll(c), MaxNackDelay: maxNackDelay(c)}
}

// orderState is what consuming an ordered durable keeps; Subscription.mu
// guards it.
type orderState struct {
	// active is set once Receive pulled as a priority group: the Extend
	// and Nack of other subscriptions skip the bookkeeping below.
	active atomic.Bool
	// pin is the pin ID of this subscription's last delivery: "" until it
	// is pinned, and again once a pull learned that another client is.
	pin string
	// holdPinUntil is when the last delivery this subscription holds or
	// nacked is due for redelivery at the latest: until then its pin must
	// not lapse, or another client could be handed a later message of
	// its group (keepPin).
	holdPinUntil time.Time
	// lastPull is when this subscription last sent a pull, which renews
	// its pin.
	lastPull time.Time
	// keeperStop and keeperDone stop keepPin's goroutine; nil until it
	// runs.
	keeperStop, keeperDone chan struct{}
}

// seqLess orders two stream sequences as the server writes them: decimal,
// without leading zeros.
func seqLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func seqCompare(a, b *driver.Delivery) int {
	switch {
	case seqLess(a.BackendID, b.BackendID):
		return -1
	case seqLess(b.BackendID, a.BackendID):
		return 1
	}
	return 0
}

// pullGroup is the priority group Receive pulls as, "" on a durable
// without a pinned one.
func (s *Subscription) pullGroup() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pinnedGroup(s.consCfg)
}

// receiveOrdered is Receive on an ordered durable. It takes what waits
// (take), or waits for the first message; a subscription that another
// client's pin keeps out polls for the pin's end instead of pulling (see
// standbyPoll). The pull that pins it (at its start, at a takeover, after
// a server restart, which forgets pins) gathers the redeliveries the
// previous owner left and hands them out in stream order
// (inStreamOrder).
func (s *Subscription) receiveOrdered(ctx context.Context, cons jetstream.Consumer, group string, n int) ([]*driver.Delivery, error) {
	s.ord.active.Store(true)
	s.keepPin(cons, group)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		pinned := s.ord.pin != ""
		s.mu.Unlock()
		if !pinned {
			wait, err := s.pinnedElsewhere(ctx, cons, group)
			if err != nil {
				return nil, err
			}
			if wait > 0 {
				if !sleep(ctx, wait) {
					return nil, ctx.Err()
				}
				continue
			}
		}
		asked := n
		ds, err := s.take(cons, group, n)
		if len(ds) == 0 && err == nil {
			var d *driver.Delivery
			asked = 1
			s.pulled()
			d, err = s.waitOne(ctx, cons, jetstream.FetchPriorityGroup(group))
			if d != nil {
				ds = []*driver.Delivery{d}
			}
		}
		if len(ds) > 0 {
			if !pinned && slices.ContainsFunc(ds, redelivered) {
				ds = s.inStreamOrder(ctx, cons, group, ds, asked, n)
			}
			s.handOut(ds)
			return ds, nil
		}
		if errors.Is(err, jetstream.ErrPinIDMismatch) {
			// Another client is pinned: stand by.
			s.setPin("")
			continue
		}
		if err != nil {
			return nil, s.refused(ctx, cons, err)
		}
	}
}

// take takes up to n of what waits, in one pull that the server ends
// after takeWait.
func (s *Subscription) take(cons jetstream.Consumer, group string, n int) ([]*driver.Delivery, error) {
	s.pulled()
	batch, err := cons.Fetch(n, jetstream.FetchPriorityGroup(group), jetstream.FetchMaxWait(takeWait))
	return s.fetched(batch, err, n)
}

func redelivered(d *driver.Delivery) bool { return d.Attempt > 1 }

// inStreamOrder returns ds, the deliveries of one pull of asked, with
// every other redelivery due now, in stream order, and gives back (nacks,
// in stream order) those beyond the n asked for: each of those costs one
// delivery more.
//
// It runs on the pull that pinned the subscription: what the previous
// owner left is then due (PinnedTTL outlasts its deliveries), and nothing
// in this process knows which of a group came first, so the server's
// order is all there is, and the server's is not the stream's. The
// deliveries a consumer leaves become due one by one, each at its own ack
// deadline (one extended while its handler ran, the ones waiting behind
// it not), and the server moves a redelivery to the end of its queue when
// it pops one that no waiting pull may take. Redeliveries go out before
// new messages, so once a pull brings fewer than it asked for, or a
// message delivered for the first time, every due one is in hand.
func (s *Subscription) inStreamOrder(ctx context.Context, cons jetstream.Consumer, group string, ds []*driver.Delivery, asked, n int) []*driver.Delivery {
	s.mu.Lock()
	batch := collectBatch
	if limit := s.consCfg.MaxRequestBatch; limit > 0 {
		batch = min(batch, limit)
	}
	s.mu.Unlock()
	all, last := ds, ds
	for len(last) == asked && !slices.ContainsFunc(last, func(d *driver.Delivery) bool { return !redelivered(d) }) {
		more, err := s.take(cons, group, batch)
		if err != nil {
			break
		}
		all, last, asked = append(all, more...), more, batch
	}
	slices.SortStableFunc(all, seqCompare)
	if len(all) > n {
		s.giveBack(ctx, all[n:])
		all = all[:n]
	}
	return all
}

// giveBack nacks ds in order, so that the server queues them for
// redelivery in that order. A nack that fails leaves its delivery to its
// ack deadline, as any lost settle.
func (s *Subscription) giveBack(ctx context.Context, ds []*driver.Delivery) {
	for _, d := range ds {
		m, _ := msgOf(d)
		_ = m.Nak()
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	_ = s.nc.FlushWithContext(ctx)
}

// handOut extends the pin's hold to the leases of ds, and notes the pin
// the server gave them.
func (s *Subscription) handOut(ds []*driver.Delivery) {
	now := time.Now()
	pin := ""
	if m, err := msgOf(ds[len(ds)-1]); err == nil {
		pin = m.Headers().Get("Nats-Pin-Id")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range ds {
		s.holdPinLocked(now.Add(d.Lease))
	}
	if pin != "" {
		s.ord.pin = pin
	}
}

func (s *Subscription) holdPinLocked(until time.Time) {
	if until.After(s.ord.holdPinUntil) {
		s.ord.holdPinUntil = until
	}
}

// extended holds the pin for d's lease, renewed now.
func (s *Subscription) extended(d *driver.Delivery) {
	if !s.ord.active.Load() {
		return
	}
	s.mu.Lock()
	s.holdPinLocked(time.Now().Add(d.Lease))
	s.mu.Unlock()
}

// nackDelay is the delay to nack d with: on an ordered durable, delay cut
// to its MaxNackDelay, with the pin held until the nacked delivery is due.
func (s *Subscription) nackDelay(delay time.Duration) time.Duration {
	if !s.ord.active.Load() {
		return delay
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if pinnedGroup(s.consCfg) == "" {
		return delay
	}
	delay = min(delay, maxNackDelay(s.consCfg))
	s.holdPinLocked(time.Now().Add(delay))
	return delay
}

func (s *Subscription) pulled() {
	s.mu.Lock()
	s.ord.lastPull = time.Now()
	s.mu.Unlock()
}

func (s *Subscription) setPin(pin string) {
	s.mu.Lock()
	s.ord.pin = pin
	s.mu.Unlock()
}

// pinnedElsewhere reads the durable: when another client holds the pin of
// group, it returns how long to wait before asking again.
func (s *Subscription) pinnedElsewhere(ctx context.Context, cons jetstream.Consumer, group string) (time.Duration, error) {
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("jetstream: reading consumer info: %w", err)
	}
	s.mu.Lock()
	s.consCfg = info.Config
	s.mu.Unlock()
	for _, g := range info.PriorityGroups {
		if g.Group == group && g.PinnedClientID != "" {
			return standbyPoll(info.Config), nil
		}
	}
	return 0, nil
}

// keepPin starts, once, the goroutine that keeps this subscription's pin
// while it holds deliveries (or nacked ones are not yet due) and sends no
// pulls: a Consumer whose handlers are all busy does not receive, and
// without a pull the pin would lapse after PinnedTTL while a delivery of a
// group is still running here. It renews the pin every half pull wait
// with a pull that can take nothing (one byte at most: every message is
// larger, and the server leaves it for the next pull). Close stops it.
func (s *Subscription) keepPin(cons jetstream.Consumer, group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ord.keeperStop != nil || s.closed {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	s.ord.keeperStop, s.ord.keeperDone = stop, done
	every := pullWait(s.consCfg) / 2
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			now := time.Now()
			s.mu.Lock()
			due := s.ord.pin != "" && now.Before(s.ord.holdPinUntil) && now.Sub(s.ord.lastPull) >= every
			s.mu.Unlock()
			if due {
				s.renewPin(cons, group)
			}
		}
	}()
}

// renewPin sends the pull that renews the pin and takes nothing.
func (s *Subscription) renewPin(cons jetstream.Consumer, group string) {
	s.pulled()
	batch, err := cons.Fetch(1, jetstream.FetchPriorityGroup(group), jetstream.FetchMaxBytes(1), jetstream.FetchMaxWait(takeWait))
	if err != nil {
		return
	}
	for m := range batch.Messages() {
		// No message fits in a byte; should the server send one anyway,
		// it goes back rather than wait out its ack deadline.
		_ = m.Nak()
	}
	if errors.Is(batch.Error(), jetstream.ErrPinIDMismatch) {
		s.setPin("")
	}
}

// stopKeeper stops keepPin's goroutine, if it runs.
func (s *Subscription) stopKeeper() {
	s.mu.Lock()
	stop, done := s.ord.keeperStop, s.ord.keeperDone
	s.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// sleep waits d or until ctx ends; false when ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
