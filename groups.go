package dedupq

import (
	"context"
	"errors"
	"fmt"
	"sync"

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

// errTooLate is the cause of the nack of a delivery given back unhandled
// because it waited (behind its group's head, or in the driver's client)
// past its claim deadline: started now, it could claim its key later than
// the startup check counts.
var errTooLate = errors.New("dedupq: waited past its claim deadline before it could start; given back")

// groupDispatch runs the deliveries of one group key one at a time, in the
// order the broker handed them out, for a driver whose broker keeps that
// order (driver.GroupOrderer): a receive can return several messages of
// one group (SQS FIFO returns up to ten), which free workers would
// otherwise run at once.
//
// A delivery whose group has one running waits here, holding its handler
// slot (so a receive never outruns Concurrency), until the one before it
// has been settled. If that one succeeded or was terminated, the waiting
// one runs next on the same worker; if it failed, every delivery waiting
// behind it is given back unhandled (a nack), to come back after it. A
// waiting delivery runs only before its claim deadline
// (window.ConsumerPlan.ClaimDeadline: it holds no claim, and its lease is
// not renewed while it waits); past it, it and every one behind it are
// given back. So a stuck group holds its slots for at most one claim
// deadline, and the startup check's model holds for every delivery.
type groupDispatch struct {
	mu     sync.Mutex
	active map[string][]job // a group with a delivery running → those waiting behind it
}

// admitAll queues each of jobs (one receive's, in the broker's order)
// behind its group's running delivery, if its group has one, and returns
// those that may run now, in place.
func (g *groupDispatch) admitAll(jobs []job) []job {
	g.mu.Lock()
	defer g.mu.Unlock()
	run := jobs[:0]
	for _, j := range jobs {
		key := j.d.Message.GroupKey
		if key != "" {
			if waiting, ok := g.active[key]; ok {
				g.active[key] = append(waiting, j)
				continue
			}
			g.active[key] = nil
		}
		run = append(run, j)
	}
	return run
}

// next is called once j, which ran, is settled with its handler's result
// err. It returns the delivery of j's group to run next, or false, in
// which case the group is idle again and what waited behind j (if
// anything) has been returned in giveBack with the reason.
func (g *groupDispatch) next(c *Consumer, p *pipeline, j job, err error) (job, bool) {
	key := j.d.Message.GroupKey
	if key == "" {
		return job{}, false
	}
	g.mu.Lock()
	waiting := g.active[key]
	var why error
	switch {
	case len(waiting) == 0:
	case err != nil && !IsPermanent(err):
		why = errGroupHeadFailed
	case isDone(p.released):
		why = ErrClosed
	case !c.clock.Now().Before(c.claims.ClaimDeadline(waiting[0].received, waiting[0].d.Lease)):
		why = errTooLate
	default:
		g.active[key] = waiting[1:]
		g.mu.Unlock()
		return waiting[0], true
	}
	delete(g.active, key)
	g.mu.Unlock()
	for _, w := range waiting {
		c.giveBack(p, w, why)
	}
	return job{}, false
}

// giveBack returns j, which waited behind its group's head, to the broker
// unhandled (a nack with no delay: the broker hands the group out again
// in order), and frees its handler slot.
func (c *Consumer) giveBack(p *pipeline, j job, why error) {
	c.stats.received.Add(1)
	sctx := settlectx.New(context.Background(), c.opts.SettleTimeout)
	c.finishSettle(context.Background(), sctx, "nack", j.d, why, 0)
	sctx.Release()
	<-p.slots
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
