// The simulator behind the property test. It talks to nothing outside the
// process: the real in-memory broker (adapters/mem) and the real
// dedup.Guard over memstore, all on one clock.Fake that only this file
// moves.
//
// Why a discrete-event simulation and not dedupq.Publisher/Consumer: both
// wait on their clock in goroutines (backoff, lease extension, shutdown),
// so driving them from a fake clock needs a poll-and-advance loop per wait,
// which costs milliseconds per schedule and makes the interleaving depend
// on the Go scheduler. Here every actor is an event on one heap, run on one
// goroutine in time order, so a schedule costs microseconds and a seed
// replays exactly. What is modelled instead of run:
//   - the Publisher's retry loop (attempt i starts after attempt i−1's
//     duration, at most AttemptTimeout, plus RetryPolicy.Delay; a send
//     reaches the broker within its attempt, or not at all);
//   - the Consumer's settle rules (nil acks, Permanent terminates, an
//     error nacks after RetryAfter's delay or the policy's backoff) and its
//     lease extension, and the Guard's claim extension (see keepAlive);
//   - the Consumer's holds: a delivery whose handler fails with
//     ErrUnavailable is run again after a backoff while the next try
//     starts before its claim deadline (ConsumerPlan.ClaimDeadline, the
//     rule consumer.go's retryUnavailable follows), and until the
//     consumer closes; a nack's delay is held, the lease extended, on
//     brokers that cannot delay a redelivery (driver.NackHolder), and a
//     held nack is left to lapse when the consumer closes;
//   - outages of the store (and of the database the effect is written
//     to): every claim, completion and commit inside one fails;
//   - the transactional store (pgstore.Do): effect and completion commit
//     together or not at all, and the row lock holds the key while the
//     transaction is open;
//   - for an ordered plan, the other messages of the message's group
//     (fillers): the adversary plays their handlers (when each settles,
//     and how), which decides how long each holds the group; mem holds a
//     group behind its head, so each delivery is its own process and the
//     Consumer's dispatcher (groups.go) has nothing to order here.
//
// The mem broker is used as it is: SendBatch decides what its dedup window
// drops, Receive/Ack/Nack/Extend decide leases, redelivery and
// dead-lettering on the fake clock. Receive is only called when
// Broker.Stats says a delivery is ready, so it never blocks.
package exactlyonce

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// plan is one configuration of publisher, broker and consumer, with what
// each side declares about the other. Declarations are truthful: the
// consumer's PublisherSpan is at least the publisher's span and its TTL at
// least the publisher's ConsumerDedupTTL.
type plan struct {
	window        time.Duration // broker dedup window; 0 means none
	retry         window.RetryPolicy
	redelivery    window.RedeliveryPolicy
	ttl           time.Duration // the consumer's dedup TTL
	declaredTTL   time.Duration // the publisher's ConsumerDedupTTL; 0: none declared
	publisherSpan time.Duration // the consumer's PublisherSpan
	margin        float64       // both sides' Margin
	mode          mode
	// ordered: the message has a GroupKey, and the consumer runs its group
	// in order (ConsumerPlan.Ordered). backlog is how many other messages
	// of the group (fillers) the publishers store within the span, and
	// declaredBacklog the consumer's GroupBacklog (0: none declared).
	ordered                  bool
	backlog, declaredBacklog int
}

func (p plan) String() string {
	s := fmt.Sprintf("window %s, retry %+v (span %s), redelivery %v (span %s), ttl %s, declared ttl %s, publisher span %s, margin %v, %s",
		p.window, p.retry, fmtSpan(p.retry.Span()), p.redelivery, fmtSpan(p.redelivery.Span()), p.ttl, p.declaredTTL, fmtSpan(p.publisherSpan), p.margin, p.mode)
	if p.ordered {
		s += fmt.Sprintf(", ordered: %d other message(s) of the group, GroupBacklog %d", p.backlog, p.declaredBacklog)
	}
	return s
}

func fmtSpan(d time.Duration) string {
	if d >= window.Forever {
		return "unbounded"
	}
	return d.String()
}

// mode is the consumer's deduplication.
type mode int

const (
	// modeGuard is the real dedup.Guard over memstore: a store separate
	// from the effect.
	modeGuard mode = iota
	// modeTx is pgstore's transactional path: effect and completion
	// commit together.
	modeTx
	// modeNone runs the handler bare; only used to show that a refused
	// publisher without declared consumer dedup duplicates.
	modeNone
)

func (m mode) String() string {
	return [...]string{"separate store (Guard over memstore)", "transactional store", "no consumer dedup"}[m]
}

// outcome is what one schedule did.
type outcome struct {
	effects     int    // times the message's effect happened (committed)
	unrecorded  uint64 // the Guards' Stats.Unrecorded, summed
	nilReturned bool   // some handler run reported success to the consumer
	stored      int    // copies the broker stored
	deliveries  int
	err         error // the simulation itself went wrong
}

// duplicates is how many effects are not explained by the counted
// Unrecorded gap (always 0 or less in a correct run).
func (o outcome) duplicates() int { return o.effects - 1 - int(o.unrecorded) }

const (
	queueName = "q"
	msgID     = "m-1"
	maxEvents = 200_000 // per schedule: a runaway simulation fails instead of hanging
)

var (
	errStoreDown = errors.New("sim: store unavailable")
	errHandler   = errors.New("sim: handler failed before its effect")
	errCrash     = errors.New("sim: process died")
	errWaiting   = errors.New("sim: waiting for a row lock")
	discard      = slog.New(slog.DiscardHandler)
	bg           = context.Background()
)

// kind is what a handler run does.
type kind int

const (
	runOK          kind = iota
	failBefore          // returns an error before its effect
	crashBefore         // the process dies before its effect
	crashAfter          // the process dies after its effect, before the ack
	completionLost      // the store loses the completion write (or the commit)
)

// proc is one delivery handled by one consumer process.
type proc struct {
	d         *driver.Delivery
	delay     time.Duration // from delivery to handler start (claim), < AckWait
	failClaim bool          // the store is unreachable for the next claim
	kind      kind
	pre, post time.Duration // handler time before and after its effect
	healthy   bool          // leases are extended while the handler runs
	ackLost   bool
	commitOK  bool // modeTx completionLost: the commit landed, its answer was lost
	received  time.Time
	tries     int // runs of the handler on this delivery

	holding bool // held after ErrUnavailable, or its nack held: the lease is kept
	kept    bool // a keepAlive renewal is scheduled

	dead, failComplete, running bool
	waiting                     bool // modeTx: blocked on another transaction's row lock
	token                       string
	// filler: a delivery of another message of the message's group, whose
	// handler the adversary plays (kind, delay) without dedup: all that
	// matters of it is how long it holds the group.
	filler bool
}

// sim is one schedule.
type sim struct {
	p     plan
	adv   adversary
	clk   *clock.Fake
	t0    time.Time
	aw    time.Duration
	b     *mem.Broker
	topic driver.Topic
	sub   driver.Subscription
	store *memstore.Store
	tx    struct {
		holder  *proc
		waiters []*proc   // deliveries whose Do waits for the holder's row lock
		until   time.Time // completed until; zero: not completed
	}
	q      eventHeap
	seq    uint64
	events int
	guards []*dedup.Guard
	// outages are the spans in which the store (and the database the
	// effect is written to) cannot be reached.
	outages []outage
	// closeAt is when the consumer closes, ending every hold; zero: never.
	closeAt time.Time
	// claims is the plan the consumer's check accepted, as NewConsumer
	// keeps it for its holds.
	claims window.ConsumerPlan
	// recordUntil is when the latest completion record expires; the worst
	// adversary times its claims by it.
	recordUntil time.Time
	// Ordered plans: group is the BackendIDs of the group's stored
	// messages in store order (the message's copies and the fillers),
	// copies those of the message's copies, ended those acked, terminated
	// or dead-lettered; pending counts the message's sends still to come.
	group, copies []string
	ended         map[string]bool
	pending       int
	out           outcome
}

// outage is a span [from, until) in which the store cannot be reached.
type outage struct{ from, until time.Time }

// storeDown reports whether the store is unreachable now.
func (s *sim) storeDown() bool {
	now := s.clk.Now()
	for _, o := range s.outages {
		if !now.Before(o.from) && now.Before(o.until) {
			return true
		}
	}
	return false
}

// run plays one schedule of plan p against adversary adv.
func run(p plan, adv adversary) outcome {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &sim{p: p, adv: adv, clk: clock.NewFake(start), t0: start, aw: p.redelivery.AckWait}
	s.outages, s.closeAt = adv.faults(s)
	s.claims = window.ConsumerPlan{Redelivery: p.redelivery, DedupTTL: p.ttl, Margin: p.margin}
	s.b = mem.NewBroker(mem.Options{
		Clock: s.clk, DedupWindow: p.window, AckWait: p.redelivery.AckWait,
		MaxDeliveries: p.redelivery.MaxDeliveries, Backoff: p.redelivery.Backoff,
	})
	s.topic, s.sub = s.b.Topic(queueName), s.b.Subscription(queueName)
	s.store = memstore.New(s.clk)
	sends := adv.sends(s)
	if p.ordered {
		s.ended = map[string]bool{}
		// Scheduled first: a filler sent at the same instant as a copy
		// is stored before it, between it and the copy before.
		for i, at := range adv.fillers(s, sends) {
			s.at(start.Add(at), func() { s.sendFiller(i) })
		}
	}
	s.pending = len(sends)
	for _, at := range sends {
		s.at(start.Add(at), s.send)
	}
	for len(s.q) > 0 && s.out.err == nil {
		s.runUntil(s.q[0].at)
	}
	for _, g := range s.guards {
		s.out.unrecorded += g.Stats().Unrecorded
	}
	st := s.b.Stats(queueName)
	s.out.stored, s.out.deliveries = st.Published, st.Deliveries
	if s.out.err == nil && st.Stored != 0 {
		s.out.err = fmt.Errorf("sim: %d messages left in the broker after the last event", st.Stored)
	}
	return s.out
}

// --- the event loop ---

type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// at schedules fn (nil: only a poll of the broker) at t.
func (s *sim) at(t time.Time, fn func()) {
	s.seq++
	heap.Push(&s.q, &event{at: t, seq: s.seq, fn: fn})
}

// runUntil runs every event due by t in time order, then sets the clock to
// t. Handlers call it to let time pass while they run, so events nest: a
// redelivery can be handled while the first handler is still in flight.
func (s *sim) runUntil(t time.Time) {
	for len(s.q) > 0 && !s.q[0].at.After(t) && s.out.err == nil {
		e := heap.Pop(&s.q).(*event)
		s.advanceTo(e.at)
		if s.events++; s.events > maxEvents {
			s.out.err = fmt.Errorf("sim: more than %d events", maxEvents)
			return
		}
		if e.fn != nil {
			e.fn()
		}
		s.poll()
	}
	s.advanceTo(t)
}

func (s *sim) advanceTo(t time.Time) {
	if d := t.Sub(s.clk.Now()); d > 0 {
		s.clk.Advance(d)
	}
}

func (s *sim) runFor(d time.Duration) { s.runUntil(s.clk.Now().Add(d)) }

// poll hands every ready delivery to a new consumer process.
func (s *sim) poll() {
	for s.out.err == nil && s.b.Stats(queueName).Ready > 0 {
		ds, err := s.sub.Receive(bg, 1)
		if err != nil {
			s.out.err = fmt.Errorf("sim: receive: %w", err)
			return
		}
		for _, d := range ds {
			if s.p.ordered {
				if err := s.checkOrder(d); err != nil {
					s.out.err = err
					return
				}
			}
			p := &proc{d: d, received: s.clk.Now(), filler: d.Message.ID != msgID}
			now := s.clk.Now()
			s.at(now.Add(s.aw), nil) // the lease ends: maybe a redelivery
			if p.filler {
				s.adv.filler(s, p)
				s.at(now.Add(p.delay), func() { s.handleFiller(p) })
				continue
			}
			s.adv.delivery(s, p)
			s.at(now.Add(p.delay), func() { s.handle(p) })
		}
	}
}

// groupKey is the message's GroupKey: "" for an unordered plan.
func (s *sim) groupKey() string {
	if s.p.ordered {
		return "g"
	}
	return ""
}

// send is one publish attempt reaching the broker; its answer is lost.
func (s *sim) send() {
	s.pending--
	s.store1(&driver.Message{ID: msgID, Body: []byte("body"), GroupKey: s.groupKey()}, true)
}

// sendFiller publishes the i-th other message of the group, once.
func (s *sim) sendFiller(i int) {
	s.store1(&driver.Message{ID: fmt.Sprintf("f-%d", i), Body: []byte("filler"), GroupKey: s.groupKey()}, false)
}

// store1 sends m and records where it was stored in its group.
func (s *sim) store1(m *driver.Message, isCopy bool) {
	res, err := s.topic.SendBatch(bg, []*driver.Message{m})
	if err == nil {
		err = res[0].Err
	}
	if err != nil {
		s.out.err = fmt.Errorf("sim: send: %w", err)
		return
	}
	if !s.p.ordered || res[0].Duplicate {
		return
	}
	s.group = append(s.group, res[0].BackendID)
	if isCopy {
		s.copies = append(s.copies, res[0].BackendID)
	}
}

// checkOrder is the order the ordered model rests on, asserted of the
// real broker under the adversaries: a message of the group is handed out
// only once every message stored before it in the group has ended (acked,
// terminated or dead-lettered), so that no effect of the group can come
// before an earlier message's unless that one's handler outlived its lease.
func (s *sim) checkOrder(d *driver.Delivery) error {
	i := slices.Index(s.group, d.BackendID)
	if i < 0 {
		return fmt.Errorf("sim: order: delivery of %s (%s), which was never stored in its group", d.BackendID, d.Message.ID)
	}
	for _, earlier := range s.group[:i] {
		if s.ended[earlier] {
			continue
		}
		for _, dl := range s.b.DeadLetters(queueName) {
			s.ended[dl.BackendID] = true
		}
		if !s.ended[earlier] {
			return fmt.Errorf("sim: order: %s (%s, attempt %d) handed out while %s, stored before it in its group, has not ended",
				d.BackendID, d.Message.ID, d.Attempt, earlier)
		}
	}
	return nil
}

// copyBehind reports whether a later copy of the message is stored behind
// p's, or may still be sent: holding the group then delays that copy.
func (s *sim) copyBehind(p *proc) bool {
	return s.pending > 0 || len(s.copies) > 0 && s.copies[len(s.copies)-1] != p.d.BackendID
}

// handleFiller runs a filler's handler as the adversary chose, after its
// delay, and settles it as the Consumer does; a crash leaves its lease to
// lapse.
func (s *sim) handleFiller(p *proc) {
	p.tries++
	switch p.kind {
	case crashBefore:
		p.dead = true
	case failBefore:
		s.settle(p, errHandler)
	default:
		s.settle(p, nil)
	}
}

// --- the consumer ---

// handle runs one delivery's handler under the plan's dedup and settles it
// as dedupq.Consumer does.
func (s *sim) handle(p *proc) {
	p.tries++
	d := &dedupq.Delivery{
		Message: dedupq.Message{ID: p.d.Message.ID, Body: p.d.Message.Body},
		Attempt: p.d.Attempt, BackendID: p.d.BackendID, Lease: p.d.Lease,
	}
	var err error
	switch s.p.mode {
	case modeGuard:
		g, gerr := dedup.NewGuard(dedup.GuardOptions{
			Store: &procStore{s: s, p: p}, TTL: s.p.ttl, Clock: guardClock{s: s, p: p}, Logger: discard,
		})
		if gerr != nil {
			s.out.err = gerr
			return
		}
		s.guards = append(s.guards, g)
		err = g.Wrap(s.handler(p))(bg, d)
	case modeTx:
		err = s.txHandle(p, d)
	case modeNone:
		err = s.handler(p)(bg, d)
	}
	if errors.Is(err, errWaiting) {
		return // blocked on the row lock; handled again when it is free
	}
	now := s.clk.Now()
	s.at(now.Add(s.aw), nil) // the (extended) lease ends by then
	if p.dead {
		return
	}
	if errors.Is(err, dedupq.ErrUnavailable) && !dedupq.IsPermanent(err) && s.holdUnavailable(p) {
		return
	}
	s.settle(p, err)
}

// holdWait is the Consumer's backoff before the n-th try again of a
// delivery held after ErrUnavailable: receiveBackoff's upper end, the
// latest its jittered draw can be.
func holdWait(n int) time.Duration {
	return min(100*time.Millisecond<<min(n-1, 16), 5*time.Second)
}

// holdUnavailable holds p, whose handler failed with ErrUnavailable, as
// the Consumer does (retryUnavailable): it runs the handler again after a
// backoff if that try starts before p's claim deadline and before the
// consumer closes; it reports false when p must be settled (nacked) now.
// A consumer that closes during the wait nacks p then.
func (s *sim) holdUnavailable(p *proc) bool {
	now := s.clk.Now()
	if !s.closeAt.IsZero() && !now.Before(s.closeAt) {
		return false
	}
	next := now.Add(holdWait(p.tries))
	if !next.Before(s.claims.ClaimDeadline(p.received, p.d.Lease)) && !s.adv.unboundedHold {
		return false
	}
	// No renewal: the hold ends before the Consumer's first renewal of
	// the lease is due (or, unbounded, renews as a running handler).
	if s.adv.unboundedHold {
		p.holding = true
		if p.healthy {
			s.keepAlive(p)
		}
	}
	if !s.closeAt.IsZero() && !next.Before(s.closeAt) {
		s.at(s.closeAt, func() {
			p.holding = false
			if !p.dead {
				s.settle(p, fmt.Errorf("closed while held: %w", dedupq.ErrUnavailable))
			}
		})
		return true
	}
	s.at(next, func() {
		p.holding = false
		if !p.dead {
			s.handle(p)
		}
	})
	return true
}

// settle acks, terminates or nacks p by its handler's result, as the
// Consumer does; a nack's delay is held instead where the adversary plays
// a broker that cannot delay a redelivery.
func (s *sim) settle(p *proc, err error) {
	now := s.clk.Now()
	switch {
	case err == nil:
		if !p.filler {
			s.out.nilReturned = true
		}
		if !p.ackLost && s.sub.Ack(bg, p.d) == nil && s.ended != nil { // ErrLeaseExpired: redelivered anyway
			s.ended[p.d.BackendID] = true
		}
	case dedupq.IsPermanent(err), s.p.ordered && s.p.redelivery.MaxDeliveries > 0 && p.d.Attempt >= s.p.redelivery.MaxDeliveries:
		// The Consumer terminates an ordered group's message on its last
		// delivery rather than nack it (lastGroupDelivery in groups.go).
		if s.sub.Terminate(bg, p.d, err) == nil && s.ended != nil {
			s.ended[p.d.BackendID] = true
		}
	default:
		delay := s.p.redelivery.BackoffBefore(p.d.Attempt + 1)
		var ra *dedupq.RetryAfterError
		if errors.As(err, &ra) {
			delay = ra.Delay
		}
		if s.adv.holdNacks && delay > 0 {
			s.holdNack(p, delay)
			return
		}
		_ = s.sub.Nack(bg, p.d, delay)
		s.at(now.Add(delay), nil)
	}
}

// holdNack is the Consumer's held nack: p's lease kept for delay, then a
// nack with none; a consumer that closes first leaves p unsettled, its
// lease to lapse.
func (s *sim) holdNack(p *proc, delay time.Duration) {
	now := s.clk.Now()
	p.holding = true
	if p.healthy {
		s.keepAlive(p)
	}
	if !s.closeAt.IsZero() && s.closeAt.After(now) && s.closeAt.Before(now.Add(delay)) {
		s.at(s.closeAt, func() {
			p.holding = false
			s.at(s.clk.Now().Add(s.aw), nil) // the lease lapses by then
		})
		return
	}
	s.at(now.Add(delay), func() {
		p.holding = false
		if !p.dead {
			// Redelivered at once, as by a broker that cannot delay it
			// (mem's Nack(0) would wait its own backoff again).
			_ = s.sub.Nack(bg, p.d, time.Nanosecond) // ErrLeaseExpired: redelivered anyway
			s.at(s.clk.Now().Add(time.Nanosecond), nil)
		}
	})
}

// handler is the application's handler: time passes, then the effect.
func (s *sim) handler(p *proc) dedupq.Handler {
	return func(ctx context.Context, d *dedupq.Delivery) error {
		p.running = true
		defer func() { p.running = false }()
		if p.healthy {
			s.keepAlive(p)
		}
		s.runFor(p.pre)
		if s.adv.effectInOutage && s.storeDown() {
			// The effect's database is down with the store.
			return fmt.Errorf("writing the effect: %w", dedupq.ErrUnavailable)
		}
		switch p.kind {
		case failBefore:
			return errHandler
		case crashBefore:
			p.dead = true
			return errCrash
		}
		if s.p.mode != modeTx {
			s.out.effects++
		}
		s.runFor(p.post)
		switch p.kind {
		case crashAfter:
			p.dead = true
		case completionLost:
			p.failComplete = true
		}
		return nil
	}
}

// keepAlive does for a healthy process what the Guard's and the
// Consumer's extension goroutines do: renew the claim and the delivery's
// lease while the handler runs. (guardClock keeps the Guard's own
// goroutine idle, so that nothing races the event loop.)
func (s *sim) keepAlive(p *proc) {
	if p.kept {
		return // one chain of renewals per delivery is enough
	}
	p.kept = true
	s.at(s.clk.Now().Add(s.aw/3), func() {
		p.kept = false
		if !(p.running || p.waiting || p.holding) || p.dead {
			return
		}
		if p.token != "" && !s.storeDown() {
			_ = s.store.Extend(bg, msgID, p.token, s.aw)
		}
		_ = s.sub.Extend(bg, p.d, s.aw)
		s.keepAlive(p)
	})
}

// procStore is the memstore as one consumer process sees it: unreachable
// when the process is dead or the adversary says so.
type procStore struct {
	s *sim
	p *proc
}

func (ps *procStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	if ps.p.dead || ps.p.failClaim || ps.s.storeDown() {
		ps.p.failClaim = false
		return dedup.Claim{}, errStoreDown
	}
	c, err := ps.s.store.Claim(ctx, key, fp, lease)
	if err == nil && c.State == dedup.Acquired {
		ps.p.token = c.Token
	}
	return c, err
}

func (ps *procStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if ps.p.dead || ps.s.storeDown() {
		return errStoreDown
	}
	return ps.s.store.Extend(ctx, key, token, lease)
}

func (ps *procStore) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if ps.p.dead || ps.p.failComplete || ps.s.storeDown() {
		return errStoreDown
	}
	err := ps.s.store.Complete(ctx, key, token, ttl, result)
	if err == nil {
		ps.s.recordUntil = ps.s.clk.Now().Add(ttl)
	}
	return err
}

func (ps *procStore) Release(ctx context.Context, key, token string) error {
	if ps.p.dead || ps.s.storeDown() {
		return errStoreDown
	}
	return ps.s.store.Release(ctx, key, token)
}

// guardClock is the Guard's clock. Its short waits (the retries of a
// failed Complete, 50–200ms) let simulated time pass on the event loop, or
// none for a dead process. Its AfterFuncs (keepClaimed's lease/3, at least
// 1s because AckWait ≥ 3s here) never fire: the claim extension runs as a
// keepAlive event instead, so no Guard timer touches the simulation. This
// leans on guard.go's timers; if the Guard ever waits differently, the
// runaway or the assertions of the property test fail.
type guardClock struct {
	s *sim
	p *proc
}

func (c guardClock) Now() time.Time { return c.s.clk.Now() }

func (c guardClock) NewTimer(d time.Duration) clock.Timer {
	if d >= time.Second {
		return idleTimer{}
	}
	if !c.p.dead {
		c.s.runFor(d)
	}
	ch := make(chan time.Time, 1)
	ch <- c.s.clk.Now()
	return firedTimer(ch)
}

// AfterFunc never calls f: the only AfterFunc the Guard makes is its claim
// extension, which keepAlive stands in for.
func (c guardClock) AfterFunc(time.Duration, func()) clock.Timer { return idleTimer{} }

type idleTimer struct{}

func (idleTimer) C() <-chan time.Time { return nil }
func (idleTimer) Stop() bool          { return true }

type firedTimer chan time.Time

func (t firedTimer) C() <-chan time.Time { return t }
func (t firedTimer) Stop() bool          { return false }

// txHandle is pgstore.TxGuard/Do in miniature: the key's record and the
// effect commit in one transaction; while it is open its row lock holds
// the key (a concurrent Do waits for it); a crash rolls both back. The
// record expires ttl after the commit, as pgstore's Do restarts the TTL
// in its last statement before committing (pgstore's
// TestDoTTLRunsFromCommit); counted from the transaction's start instead,
// accepted plans ran effects twice here.
func (s *sim) txHandle(p *proc, d *dedupq.Delivery) error {
	if p.failClaim || s.storeDown() {
		p.failClaim = false
		return fmt.Errorf("do: %w", dedup.ErrStoreUnavailable)
	}
	now := s.clk.Now()
	if s.tx.holder != nil {
		// Do's INSERT waits for the holder's commit or rollback, while the
		// Consumer keeps the delivery leased.
		p.waiting = true
		s.tx.waiters = append(s.tx.waiters, p)
		s.keepAlive(p)
		return errWaiting
	}
	if !s.tx.until.IsZero() && s.tx.until.After(now) {
		return nil
	}
	s.tx.holder = p
	defer func() {
		// Commit, rollback or the connection dropping frees the row: the
		// waiting statements go on.
		s.tx.holder = nil
		for _, w := range s.tx.waiters {
			w.waiting = false
			s.at(s.clk.Now(), func() { s.handle(w) })
		}
		s.tx.waiters = nil
	}()
	if err := s.handler(p)(bg, d); err != nil {
		return err // rolled back: no effect
	}
	if p.kind == completionLost && !p.commitOK || s.storeDown() {
		return fmt.Errorf("do: commit: %w", dedup.ErrStoreUnavailable)
	}
	s.out.effects++
	commit := s.clk.Now()
	s.tx.until, s.recordUntil = commit.Add(s.p.ttl), commit.Add(s.p.ttl)
	if p.kind == completionLost {
		return fmt.Errorf("do: commit answer lost: %w", dedup.ErrStoreUnavailable)
	}
	return nil // crashAfter: committed; the process is dead, no ack
}

// --- the adversaries ---

// adversary decides when sends reach the broker and what each delivery's
// process does. A nil rand means the worst case, built to break the check's
// bound: see worstSends and worstDelivery. A random adversary mixes in the
// worst case too: its sends are the worst ones when worstSends is set, and
// each delivery follows worstDelivery with probability greed.
type adversary struct {
	r          *rand.Rand
	worstSends bool
	greed      float64
	// outages: the store goes down for random spans (see faults), and
	// effectInOutage takes the effect's database down with it.
	outages, effectInOutage bool
	// holdNacks plays a broker that cannot delay a redelivery: the
	// consumer holds each nack's delay (driver.NackHolder).
	holdNacks bool
	// closes: the consumer closes at a random moment, ending its holds.
	closes bool
	// unboundedHold holds a delivery after ErrUnavailable past its claim
	// deadline, for as long as the store is down: the Consumer before
	// issue 23, which the exploration must catch.
	unboundedHold bool
}

// randomAdversary draws an adversary somewhere between blind chance and
// the worst case.
func randomAdversary(r *rand.Rand) adversary {
	a := adversary{r: r, worstSends: r.IntN(3) == 0,
		outages: r.IntN(2) == 0, effectInOutage: r.IntN(2) == 0, holdNacks: r.IntN(3) == 0, closes: r.IntN(4) == 0}
	switch r.IntN(4) {
	case 0:
	case 1:
		a.greed = 0.5
	case 2:
		a.greed = 0.9
	default:
		a.greed = r.Float64()
	}
	return a
}

// faults draws the store's outages and the moment the consumer closes:
// outages start anywhere in the message's life or just before a
// redelivery, and last from a moment to past the TTL, so that a hold can
// outlive a completion record.
func (a adversary) faults(s *sim) (outs []outage, closeAt time.Time) {
	if a.r == nil {
		return nil, time.Time{}
	}
	r, aw := a.r, s.aw
	horizon := addSat(copySpan(s.p.retry), s.p.redelivery.Span())
	if s.p.ordered {
		// The last copy waits behind the first and the fillers.
		for range s.p.backlog + 1 {
			horizon = addSat(horizon, s.p.redelivery.Span())
		}
	}
	if horizon >= window.Forever/4 {
		horizon = 10 * aw
	}
	if a.outages {
		for range 1 + r.IntN(2) {
			from := pick(r, ms(r, 0, horizon), time.Duration(r.IntN(4))*aw-ms(r, 0, aw/10))
			long := pick(r, ms(r, time.Millisecond, aw), ms(r, aw, 4*aw),
				s.p.ttl+ms(r, 0, aw), ms(r, s.p.ttl, 2*s.p.ttl+aw))
			outs = append(outs, outage{s.t0.Add(max(from, 0)), s.t0.Add(max(from, 0) + long)})
		}
	}
	if a.closes {
		closeAt = s.t0.Add(ms(r, 0, horizon))
	}
	return outs, closeAt
}

// longAttempt stands for an attempt without AttemptTimeout.
func (s *sim) longAttempt() time.Duration {
	return 2*(s.p.window+s.p.ttl) + time.Hour
}

func (a adversary) sends(s *sim) []time.Duration {
	if a.r == nil || a.worstSends {
		return worstSends(s)
	}
	r, rp := a.r, s.p.retry
	attempts := max(rp.MaxAttempts, 1)
	k := attempts
	if r.IntN(2) == 0 {
		k = 1 + r.IntN(attempts)
	}
	var out []time.Duration
	start, lastStored := time.Duration(0), time.Duration(-1)
	for i := 1; i <= k; i++ {
		full := rp.AttemptTimeout
		if full <= 0 {
			full = s.longAttempt()
		}
		dur := full
		if r.IntN(4) == 0 {
			dur = 1 + time.Duration(r.Int64N(int64(full)))
		}
		at := time.Duration(-1)
		switch c := r.IntN(8); {
		case c == 0: // the request is lost
		case c == 1:
			at = start
		case c == 2 && s.p.window > 0 && lastStored >= 0: // exactly when the window lets go
			at = lastStored + s.p.window
		case c == 3 && s.p.window > 0 && lastStored >= 0: // the last moment it still drops
			at = lastStored + s.p.window - 1
		case c == 4:
			at = start + time.Duration(r.Int64N(int64(dur)))
		default: // the end of the attempt
			at = start + dur - 1
		}
		if at >= start && at < start+dur {
			out = append(out, at)
			if s.p.window <= 0 || lastStored < 0 || at-lastStored >= s.p.window {
				lastStored = at
			}
		}
		u := 0.0
		if r.IntN(2) == 0 {
			u = r.Float64()
		}
		start += dur + rp.Delay(i, u)
	}
	return out
}

// fillers says when the other messages of an ordered plan's group are
// sent, from t0: within the span of the message's sends, where they can
// stand between two of its copies. The worst case sends them all at the
// last send's instant, just before it, so that the last copy waits behind
// them all and the first copy's deliveries hold none of them up.
func (a adversary) fillers(s *sim, sends []time.Duration) []time.Duration {
	last := time.Duration(0)
	if len(sends) > 0 {
		last = slices.Max(sends)
	}
	out := make([]time.Duration, s.p.backlog)
	for i := range out {
		out[i] = last
		if a.r != nil && !a.worstSends && a.r.IntN(2) == 0 {
			out[i] = time.Duration(a.r.Int64N(int64(last) + 1))
		}
	}
	return out
}

// worstSends stores the first send at t0 and lands the last attempt's send
// at the last moment it may: the end of the last attempt, P − 1ns after t0.
func worstSends(s *sim) []time.Duration {
	rp := s.p.retry
	out := []time.Duration{0}
	attempts := max(rp.MaxAttempts, 1)
	if attempts == 1 {
		return out
	}
	full := rp.AttemptTimeout
	if full <= 0 {
		full = s.longAttempt()
	}
	start := time.Duration(0)
	for i := 1; i < attempts; i++ {
		start += full + rp.Backoff(i)
	}
	return append(out, start+full-1)
}

// filler decides what a delivery of a filler does: when its handler
// settles it, and how. The worst case holds the group for as long as the
// redelivery policy lets one message hold it: every delivery kept to the
// end of its lease, then failed with the policy's backoff (as the
// Consumer nacks it, the last delivery's included), or left to lapse when
// there is no backoff. Where deliveries are unlimited it gives up after
// three, so that the schedule ends (the check refuses those plans anyway).
func (a adversary) filler(s *sim, p *proc) {
	aw, j := s.aw, p.d.Attempt
	unlimited := s.p.redelivery.MaxDeliveries <= 0
	if a.r == nil || a.r.Float64() < a.greed {
		switch {
		case s.out.effects >= 2 || unlimited && j >= 3: // the point is made, or never: settle
			p.kind = runOK
		case s.p.redelivery.BackoffBefore(j+1) > 0:
			p.delay, p.kind, p.healthy = aw-1, failBefore, true
		default:
			p.delay, p.kind = aw-1, crashBefore
		}
		return
	}
	r := a.r
	p.delay = pick(r, 0, aw-1, time.Duration(r.Int64N(int64(aw))))
	switch c := r.IntN(10); {
	case c < 4:
		p.kind = runOK
	case c < 7:
		p.kind = failBefore
	case c < 9:
		p.kind = crashBefore
	default:
		p.kind, p.ackLost = runOK, true
	}
	p.healthy = r.IntN(2) == 0
	if unlimited && j >= 4 {
		p.kind, p.ackLost = runOK, false
	}
}

func (a adversary) delivery(s *sim, p *proc) {
	if a.r == nil || a.r.Float64() < a.greed {
		worstDelivery(s, p)
		return
	}
	r, aw := a.r, s.aw
	switch c := r.IntN(10); {
	case c < 6:
	case c < 8:
		p.delay = aw - 1 // the handler starts at the end of the lease
	default:
		p.delay = time.Duration(r.Int64N(int64(aw)))
	}
	p.failClaim = r.IntN(10) == 0
	switch c := r.IntN(10); {
	case c < 5:
		p.kind = runOK
	case c == 5:
		p.kind = failBefore
	case c == 6:
		p.kind = crashBefore
	case c == 7:
		p.kind = crashAfter
	default:
		p.kind = completionLost
		p.commitOK = r.IntN(2) == 0
	}
	dur := func() time.Duration {
		if r.IntN(5) < 3 {
			return 0
		}
		return time.Duration(r.Int64N(int64(2 * aw)))
	}
	p.pre, p.post = dur(), dur()
	p.healthy = r.IntN(2) == 0 // otherwise leases expire mid-handler
	p.ackLost = r.IntN(3) == 0
}

// worstDelivery keeps every copy's deliveries going as long as the
// redelivery policy allows while the key is recorded, and claims the key
// the moment its record has expired:
//   - before any completion: run at once and lose the ack, so that the
//     record starts as early as it can and the copy comes back;
//   - when the record expires before this delivery's lease ends: claim
//     then, and run the effect again;
//   - otherwise, if more deliveries follow, or (ordered) a later copy
//     waits behind this one in the group: end the lease as late as
//     possible (store unreachable at the last moment, so a nack with the
//     policy's backoff; or a lost ack when there is no backoff);
//   - on the last delivery: claim at the end of the lease.
//
// Once the effect ran twice, every delivery just runs and acks.
func worstDelivery(s *sim, p *proc) {
	aw, x, j, n := s.aw, s.clk.Now(), p.d.Attempt, s.p.redelivery.MaxDeliveries
	p.kind = runOK
	switch {
	case s.p.mode == modeNone || s.out.effects >= 2: // nothing to stretch, or the point is made: settle
	case s.recordUntil.IsZero():
		p.ackLost = true
	case !s.recordUntil.After(x.Add(aw - 1)):
		p.delay = max(s.recordUntil.Sub(x), 0)
	case n <= 0 || j < n || s.p.ordered && s.copyBehind(p):
		if s.p.redelivery.BackoffBefore(j+1) > 0 {
			p.delay, p.failClaim = aw-1, true
		} else {
			p.ackLost = true
		}
	default:
		p.delay = aw - 1
	}
}
