package dedupq

import (
	"context"
	"slices"
	"sync"

	"github.com/dedupq/dedupq/driver"
)

// publishBatchesInFlight bounds the batches of concurrent Publish calls
// whose first attempt is on its way at once. While that many are, later
// calls queue, and the next batch takes every queued call (up to the
// driver's MaxBatch): the busier the broker, the bigger the batches, with
// no linger added to a call that finds the broker idle.
const publishBatchesInFlight = 4

// publishBatcher makes the first attempts of concurrent Publish calls
// together, one SendBatch for many calls, the way Go CDK's batcher does
// for its topics. Only first attempts: a message's retries (and their
// backoff) stay its caller's own, under its own context, so that nothing
// queued between two attempts can stretch a message's retry span past the
// one the startup check accepted. Waiting before a first attempt is
// harmless: nothing has been sent.
type publishBatcher struct {
	p *Publisher

	mu      sync.Mutex
	queue   []*publishCall
	running int // batches taken and not yet answered
}

// publishCall is one Publish call's message waiting for its first attempt.
type publishCall struct {
	ctx  context.Context
	msg  *driver.Message
	done chan struct{} // closed once sent and err are set

	// batch is the batch that took it (it may be sent); nil while it is
	// queued. Guarded by publishBatcher.mu.
	batch *publishBatch

	sent *driver.SendResult // the driver's answer for msg; nil for none
	err  error              // the attempt's error as a whole
}

// publishBatch is one SendBatch of several calls.
type publishBatch struct {
	mu     sync.Mutex
	left   int                // calls whose caller still waits
	cancel context.CancelFunc // ends the attempt's context
}

// giveUp records that one caller stopped waiting, and reports whether it
// was the last: the attempt, which runs for nobody now, is then cancelled.
func (pb *publishBatch) giveUp() (last bool) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.left--; pb.left == 0 {
		pb.cancel()
		return true
	}
	return false
}

// first makes msg's first attempt within a batch of concurrent calls. It
// reports the attempt's answer, as SendBatch's for a one-message batch,
// and whether the message was handed to the driver at all: false when ctx
// ended while it was still queued. A ctx that ends during the attempt
// returns with ctx's error and sent true (the message may be stored): at
// once, the attempt going on for the batch's other calls; or, for the last
// caller of its batch, once the attempt, cancelled, has returned, so that
// nothing of it is left running after the call.
func (b *publishBatcher) first(ctx context.Context, msg *driver.Message) (res []driver.SendResult, err error, sent bool) {
	c := &publishCall{ctx: ctx, msg: msg, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.running < publishBatchesInFlight {
		// A batch of its own on a goroutine, not this caller's: a caller
		// whose ctx ends returns at once, whatever the batch it sent.
		b.running++
		b.p.enterBatch()
		go func() {
			defer b.p.exit()
			for b.runBatch() {
			}
		}()
	}
	b.mu.Unlock()
	select {
	case <-c.done:
	case <-ctx.Done():
		b.mu.Lock()
		pb := c.batch
		if pb == nil {
			// Out of the queue: no batch may send it now.
			if i := slices.Index(b.queue, c); i >= 0 {
				b.queue = slices.Delete(b.queue, i, i+1)
			}
			b.mu.Unlock()
			return nil, context.Cause(ctx), false
		}
		b.mu.Unlock()
		if pb.giveUp() {
			<-c.done
			if c.err != nil || c.sent == nil || c.sent.Err != nil {
				// Most likely the cancellation's own answer: the
				// caller's deadline is what it needs to see.
				return nil, context.Cause(ctx), true
			}
		} else {
			select {
			case <-c.done: // answered as ctx ended: take the answer
			default:
				return nil, context.Cause(ctx), true
			}
		}
	}
	if c.sent == nil {
		return nil, c.err, true
	}
	return []driver.SendResult{*c.sent}, c.err, true
}

// runBatch takes the queued calls (up to MaxBatch) and makes their first
// attempt in one SendBatch, then answers each. It reports whether it sent
// anything; with nothing queued it frees its batch slot, in the same hold
// of the lock in which it found the queue empty (a call queued after that
// starts a batch of its own), and reports false.
func (b *publishBatcher) runBatch() bool {
	limit := max(b.p.topic.MaxBatch(), 1)
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return false
	}
	calls := make([]*publishCall, min(len(b.queue), limit))
	n := copy(calls, b.queue)
	clear(b.queue[:n])
	b.queue = b.queue[n:]
	// The first call's values (not its cancellation): the attempt ends
	// when its last caller gives up, or at AttemptTimeout
	// (Publisher.attempt).
	ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
	pb := &publishBatch{left: len(calls), cancel: cancel}
	for _, c := range calls {
		c.batch = pb
	}
	b.mu.Unlock()

	msgs := make([]*driver.Message, len(calls))
	for i, c := range calls {
		msgs[i] = c.msg
	}
	sent, err := b.p.attempt(ctx, msgs)
	cancel()
	for i, c := range calls {
		c.err = err
		if err == nil && i < len(sent) {
			c.sent = &sent[i]
		}
		close(c.done)
	}
	return true
}
