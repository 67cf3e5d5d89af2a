package dedupq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/settlectx"
)

// ErrOrderingUnsupported is the cause of NewConsumer's refusal of
// ConsumerOptions.Ordered on a subscription that cannot keep the order of
// a group: it wraps the driver's reason, which names the fix.
var ErrOrderingUnsupported = errors.New("dedupq: the subscription cannot keep the order of a group key")

// errGroupHeadFailed is the cause of the nack of a delivery given back
// unhandled because the delivery before it in its group failed: the broker
// hands the group out again from the failed one, in order.
var errGroupHeadFailed = errors.New("dedupq: an earlier message of its group failed; given back to be redelivered after it")

// errGroupBlocked is the cause of the nack of a delivery of a group whose
// earlier message was given back and has not come again yet: run now, it
// would overtake that one.
var errGroupBlocked = errors.New("dedupq: an earlier message of its group was given back and has not come again; given back to come after it")

// errGroupDuplicate is the cause of the nack of a delivery that waited
// behind its group's head and was of the same message: a broker's
// duplicate delivery of a message already settled.
var errGroupDuplicate = errors.New("dedupq: a duplicate delivery of a message of its group that is settled already; given back")

// errTooLate is the cause of the nack of a delivery given back unhandled
// because it waited (behind its group's head, or in the driver's client)
// past its claim deadline: started now, it could claim its key later than
// the startup check counts.
var errTooLate = errors.New("dedupq: waited past its claim deadline before it could start; given back")

// blockSlack is added to the delay of a delivery given back while its
// group waits for an earlier one to come again: due after the earlier
// one, never at the same instant, and never in a tight loop while the
// broker is late with the earlier one (each give-back costs the delivery
// an attempt on most brokers).
const blockSlack = 250 * time.Millisecond

// groupDispatch runs the deliveries of one group key one at a time, in the
// order the broker handed them out, for a driver whose broker keeps that
// order (driver.GroupOrderer). A receive can return several messages of
// one group (SQS FIFO returns up to ten; JetStream and Pub/Sub stream a
// group's later messages while an earlier one runs), which free workers
// would otherwise run at once.
//
// A delivery whose group has one running waits here, holding its handler
// slot (so a receive never outruns Concurrency), until the one before it
// has been settled. If that one succeeded or was terminated, the waiting
// one runs next on the same worker. If it failed, it is nacked with its
// redelivery delay, every delivery waiting behind it is given back
// (nacked, or held by the Consumer for a driver.NackHolder) with the same
// delay, and the group is blocked: every later delivery of the group that
// arrives before the failed one comes again is given back too, due after
// it, so that no broker that goes on streaming a group can make a later
// message overtake an earlier one's redelivery. A waiting delivery runs
// only before its claim deadline (window.ConsumerPlan.ClaimDeadline: it
// holds no claim, and its lease is not renewed while it waits); past it,
// it and every one behind it are given back and the group blocked on it.
// So a stuck group holds its slots for at most one claim deadline, and the
// startup check's model holds for every delivery.
type groupDispatch struct {
	mu      sync.Mutex
	active  map[string][]job        // a group with a delivery running → those waiting behind it
	blocked map[string]blockedGroup // a group whose given-back deliveries must come again first
	swept   time.Time               // when blocked was last rid of expired entries
}

// blockedGroup is a group waiting for deliveries it gave back to come
// again, in the group's order: a delivery of the group other than the
// next of them is given back too, so that none overtakes them (one held
// by the Consumer for a driver.NackHolder is still in flight to its
// broker, which streams the group's later messages past it).
type blockedGroup struct {
	ids  []string        // the given-back messages still to come, in order
	came map[string]bool // those that came again: their duplicates run as any delivery
	// due is when the broker hands ids[0] out again at the earliest;
	// until is when the group is let go without the rest (the broker
	// redelivered them elsewhere, or dropped them).
	due, until time.Time
}

// giveBackJob is a delivery admit refused, and the delay it is given
// back with.
type giveBackJob struct {
	j     job
	delay time.Duration
}

func newGroupDispatch() *groupDispatch {
	return &groupDispatch{active: map[string][]job{}, blocked: map[string]blockedGroup{}}
}

// admitAll queues each of jobs (one receive's, in the broker's order)
// behind its group's running delivery, if its group has one, and returns
// those that may run now, in place, and those to give back: the ones of a
// blocked group that come before the delivery it waits for.
func (g *groupDispatch) admitAll(jobs []job, now time.Time) (run []job, back []giveBackJob) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweep(now)
	run = jobs[:0]
	for _, j := range jobs {
		key := j.d.Message.GroupKey
		if key != "" {
			if delay, ok := g.waitsFor(key, j, now); !ok {
				back = append(back, giveBackJob{j, delay})
				continue
			}
			if waiting, ok := g.active[key]; ok {
				g.active[key] = append(waiting, j)
				continue
			}
			g.active[key] = nil
		}
		run = append(run, j)
	}
	return run, back
}

// waitsFor reports whether j, of group key, may be admitted: its group is
// not blocked, or j is the delivery the block waits for next (or a
// duplicate of one that came already). If not, it returns the delay to
// give j back with: due after the one the group waits for.
func (g *groupDispatch) waitsFor(key string, j job, now time.Time) (time.Duration, bool) {
	b, ok := g.blocked[key]
	if !ok {
		return 0, true
	}
	id := j.d.Message.ID
	switch {
	case !now.Before(b.until):
		delete(g.blocked, key)
		return 0, true
	case id == b.ids[0]:
		b.ids, b.due = b.ids[1:], now
		if len(b.ids) == 0 {
			delete(g.blocked, key)
			return 0, true
		}
		g.blocked[key] = b
		g.cameAgain(key, id)
		return 0, true
	case b.came[id]:
		return 0, true
	}
	delay := max(b.due.Sub(now), 0) + blockSlack
	if !slices.Contains(b.ids, id) {
		b.ids = append(b.ids, id)
	}
	b.until = laterOf(b.until, now.Add(delay+blockGrace(j.d)))
	g.blocked[key] = b
	return delay, false
}

// block makes key wait for ids (given back with delay) to come again
// before anything of the group runs; they come before any the group
// already waits for.
func (g *groupDispatch) block(key string, ids []string, now time.Time, delay, grace time.Duration) {
	if len(ids) == 0 {
		return
	}
	b := g.blocked[key]
	for _, id := range ids {
		delete(b.came, id) // given back again: it must come again first
	}
	b.ids = append(ids, b.ids...)
	b.due = now.Add(delay)
	b.until = laterOf(b.until, now.Add(delay+grace))
	g.blocked[key] = b
}

// cameAgain marks id, of blocked group key, as one whose deliveries no
// longer wait.
func (g *groupDispatch) cameAgain(key, id string) {
	b := g.blocked[key]
	if b.came == nil {
		b.came = map[string]bool{}
	}
	b.came[id] = true
	g.blocked[key] = b
}

// blockGrace is how long after its due time a given-back delivery may
// take to come again before its group is let go without it.
func blockGrace(d *driver.Delivery) time.Duration { return max(d.Lease, time.Second) }

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sweepEvery is how often admitAll forgets blocks that expired without
// an arrival of their group.
const sweepEvery = time.Minute

func (g *groupDispatch) sweep(now time.Time) {
	if len(g.blocked) == 0 || now.Sub(g.swept) < sweepEvery {
		return
	}
	g.swept = now
	for key, b := range g.blocked {
		if !now.Before(b.until) {
			delete(g.blocked, key)
		}
	}
}

// next is called once j, which ran (or was given back as too late, err
// errTooLate), is settled with its handler's result err. It returns the
// delivery of j's group to run next, or false, in which case the group is
// idle again, or blocked, and what waited behind j (if anything) has been
// given back with the reason.
func (g *groupDispatch) next(c *Consumer, p *pipeline, j job, err error) (job, bool) {
	key := j.d.Message.GroupKey
	if key == "" {
		return job{}, false
	}
	now := c.clock.Now()
	// j comes again only if it failed, and not on its last delivery (the
	// Consumer terminates that one, see lastGroupDelivery).
	again := err != nil && !IsPermanent(err) && !c.lastGroupDelivery(p, j.d)
	g.mu.Lock()
	waiting := g.active[key]
	var dups []job
	if !again {
		// Deliveries of j's message that waited behind it (a broker's
		// duplicate) are of a message that is settled: given back, they
		// never come again, so the group must not wait for them.
		waiting, dups = splitByID(waiting, j.d.Message.ID)
	}
	var why error
	var delay time.Duration
	var ids []string // what the group waits for, in order
	switch {
	case again:
		why = errGroupHeadFailed
		if !errors.Is(err, errTooLate) {
			delay = c.nackDelay(p, j.d, err)
		}
		ids = append(ids, j.d.Message.ID)
	case len(waiting) == 0:
	case isDone(p.released):
		why = ErrClosed
	case !now.Before(c.claims.ClaimDeadline(waiting[0].received, waiting[0].d.Lease)):
		why = errTooLate
	default:
		g.active[key] = waiting[1:]
		g.mu.Unlock()
		g.giveBackAll(c, p, dups, errGroupDuplicate)
		return waiting[0], true
	}
	delete(g.active, key)
	if why != nil && why != ErrClosed {
		for _, w := range waiting {
			if !slices.Contains(ids, w.d.Message.ID) {
				ids = append(ids, w.d.Message.ID)
			}
		}
		g.block(key, ids, now, delay, blockGrace(j.d))
		if !again {
			// j is settled: a redelivery of it (its ack lost) runs as a
			// duplicate instead of waiting behind those given back.
			g.cameAgain(key, j.d.Message.ID)
		}
	}
	g.mu.Unlock()
	g.giveBackAll(c, p, dups, errGroupDuplicate)
	for _, w := range waiting {
		c.giveBack(p, w, why, delay)
	}
	return job{}, false
}

// giveBackAll gives back js unhandled at once, for reason why.
func (g *groupDispatch) giveBackAll(c *Consumer, p *pipeline, js []job, why error) {
	for _, w := range js {
		c.giveBack(p, w, why, 0)
	}
}

// splitByID splits js into those of another message than id and those of
// id.
func splitByID(js []job, id string) (others, of []job) {
	for _, w := range js {
		if w.d.Message.ID == id {
			of = append(of, w)
		} else {
			others = append(others, w)
		}
	}
	return others, of
}

// lastGroupDelivery reports whether d, of an ordered group, is its
// message's last delivery (the broker's MaxDeliveries): failed, it is
// terminated rather than nacked, since a nack's delay would hold its group
// past the redelivery span the startup check counts (the broker keeps a
// nacked message until the delay ends, and only then dead-letters it).
func (c *Consumer) lastGroupDelivery(p *pipeline, d *driver.Delivery) bool {
	return p.groups != nil && d.Message.GroupKey != "" &&
		c.redelivery.MaxDeliveries > 0 && d.Attempt >= c.redelivery.MaxDeliveries
}

// nackDelay is how long d, failed with err, is kept from redelivery: the
// redelivery policy's backoff or the handler's RetryAfterError, capped by
// what a driver.NackHolder can hold.
func (c *Consumer) nackDelay(p *pipeline, d *driver.Delivery, err error) time.Duration {
	delay := c.redelivery.BackoffBefore(d.Attempt + 1)
	var ra *RetryAfterError
	if errors.As(err, &ra) {
		delay = ra.Delay
	}
	if p.holder != nil {
		delay = max(min(delay, p.holder.MaxNackHold(d)), 0)
	}
	return delay
}

// giveBack returns j, which did not run, to the broker unhandled after
// delay (a nack, or a hold first for a driver.NackHolder), and frees its
// handler slot.
func (c *Consumer) giveBack(p *pipeline, j job, why error, delay time.Duration) {
	c.stats.received.Add(1)
	if delay > 0 && p.holder != nil {
		c.hold(context.Background(), p, j.d, why, delay, j.received)
	} else {
		sctx := settlectx.New(context.Background(), c.opts.SettleTimeout)
		c.finishSettle(context.Background(), sctx, "nack", j.d, why, delay)
		sctx.Release()
	}
	<-p.slots
}

// giveBackAll gives back, off the receive loop, the deliveries admitAll
// refused; the Run waits for them (p.holds) before it closes the driver.
func (c *Consumer) giveBackAll(p *pipeline, back []giveBackJob) {
	for _, b := range back {
		p.holds.Add(1)
		go func() {
			defer p.holds.Done()
			c.giveBack(p, b.j, errGroupBlocked, b.delay)
		}()
	}
}

// ordersGroups reports whether sub keeps the order of a group key: false
// with a nil error when it cannot say (it does not implement
// driver.GroupOrderer), false with its reason when it says it cannot.
func ordersGroups(ctx context.Context, sub driver.Subscription) (bool, error) {
	o, ok := sub.(driver.GroupOrderer)
	if !ok {
		return false, fmt.Errorf("%w: the backend's driver does not order by group key", ErrOrderingUnsupported)
	}
	if err := o.OrdersGroups(ctx); err != nil {
		return false, fmt.Errorf("%w: %w", ErrOrderingUnsupported, err)
	}
	return true, nil
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
