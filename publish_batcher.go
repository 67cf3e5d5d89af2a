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

	taken bool // a batch took it, and it may be sent; guarded by publishBatcher.mu

	sent *driver.SendResult // the driver's answer for msg; nil for none
	err  error              // the attempt's error as a whole
}

// first makes msg's first attempt within a batch of concurrent calls. It
// reports the attempt's answer, as SendBatch's for a one-message batch,
// and whether the message was handed to the driver at all: false when ctx
// ended while it was still queued. A ctx that ends during the attempt
// returns at once, with ctx's error and sent true: the attempt goes on for
// the batch's other calls, and may store the message.
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
		if !c.taken {
			// Out of the queue: no batch may send it now.
			if i := slices.Index(b.queue, c); i >= 0 {
				b.queue = slices.Delete(b.queue, i, i+1)
			}
			b.mu.Unlock()
			return nil, context.Cause(ctx), false
		}
		b.mu.Unlock()
		select {
		case <-c.done: // answered as ctx ended: take the answer
		default:
			return nil, context.Cause(ctx), true
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
	var calls []*publishCall
	for len(b.queue) > 0 && len(calls) < limit {
		c := b.queue[0]
		b.queue[0] = nil
		b.queue = b.queue[1:]
		c.taken = true
		calls = append(calls, c)
	}
	if len(calls) == 0 {
		b.running--
		b.mu.Unlock()
		return false
	}
	b.mu.Unlock()

	msgs := make([]*driver.Message, len(calls))
	for i, c := range calls {
		msgs[i] = c.msg
	}
	ctx, cancel := b.attemptContext(calls)
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

// attemptContext is a batch's: it keeps the first call's values (not its
// cancellation), and ends once every call of the batch has given up, so
// that no attempt runs on for nobody. AttemptTimeout bounds it besides
// (Publisher.attempt).
func (b *publishBatcher) attemptContext(calls []*publishCall) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(calls[0].ctx))
	var mu sync.Mutex
	left := len(calls)
	stops := make([]func() bool, len(calls))
	for i, c := range calls {
		stops[i] = context.AfterFunc(c.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if left--; left == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
