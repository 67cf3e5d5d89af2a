// Package coalesce batches requests made concurrently into one round trip;
// the Redis and PostgreSQL stores share it.
package coalesce

import (
	"context"
	"sync"
	"time"
)

// Batcher coalesces requests made concurrently into one pipeline or
// statement, so that N deliveries in flight cost one round trip instead of
// N. It has no goroutine of its own: a caller that finds a free flush slot
// flushes the queue itself. A caller that finds every slot busy only waits;
// a slot holder checks the queue again after letting go of its slot, and an
// arriving caller tries for a slot after queueing, so a queued request is
// always picked up.
//
// A caller flushes other callers' requests only until its own has its
// answer. Were it to go on while requests keep arriving, a steady stream of
// them (the redeliveries of a key in progress, say) would keep it flushing
// for ever, and its caller could never act on the answer: the consumer that
// claimed a key would never complete it, and every redelivery would find
// the key in progress until the lease ran out. So once its own request is
// settled a caller hands its turn to one of the callers still waiting, which
// flushes the next batch; each caller thus waits for the batches ahead of
// its request and at most one more, however many arrive after it.
type Batcher[R any] struct {
	max   int
	slots chan struct{}
	// turn holds at most one hand-off: a waiting caller that receives it
	// tries for a slot and flushes.
	turn  chan struct{}
	flush func(ctx context.Context, batch []*R)

	mu    sync.Mutex
	queue []*R
}

// New returns a Batcher that flushes at most maxBatch requests at a time,
// with at most inFlight flushes running at once.
func New[R any](maxBatch, inFlight int, flush func(context.Context, []*R)) *Batcher[R] {
	return &Batcher[R]{max: maxBatch, slots: make(chan struct{}, inFlight), turn: make(chan struct{}, 1), flush: flush}
}

// Submit queues r and returns once some caller has flushed it, which may be
// this one. done is closed by flush when r has its answer.
func (b *Batcher[R]) Submit(r *R, ctxOf func(*R) context.Context, done <-chan struct{}) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	b.drain(ctxOf, done)
	for {
		select {
		case <-done:
			return
		case <-b.turn:
			if closed(done) {
				// Answered meanwhile: the turn belongs to a caller
				// still waiting.
				b.handOff()
				return
			}
			b.drain(ctxOf, done)
		}
	}
}

// drain flushes batches while it holds a slot, the queue is not empty and
// the caller's own request (done) has no answer yet.
func (b *Batcher[R]) drain(ctxOf func(*R) context.Context, done <-chan struct{}) {
	for {
		select {
		case b.slots <- struct{}{}:
		default:
			// Every slot is busy; its holder checks the queue after
			// letting go of it.
			return
		}
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		batch := make([]*R, n)
		copy(batch, b.queue)
		b.queue = append(b.queue[:0], b.queue[n:]...)
		b.mu.Unlock()
		if n > 0 {
			ctx, cancel := batchContext(batch, ctxOf)
			b.flush(ctx, batch)
			cancel()
		}
		<-b.slots
		b.mu.Lock()
		empty := len(b.queue) == 0
		b.mu.Unlock()
		if empty {
			return
		}
		if closed(done) {
			// Everything still queued was submitted by callers
			// waiting in Submit: wake one of them to flush it.
			b.handOff()
			return
		}
	}
}

// handOff passes the turn to a waiting caller. One pending turn is enough:
// its receiver hands it on in turn if requests remain.
func (b *Batcher[R]) handOff() {
	select {
	case b.turn <- struct{}{}:
	default:
	}
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// batchContext bounds a shared round trip by the earliest deadline among
// its requests. It does not inherit their cancellation: one caller giving
// up must not fail the others' requests riding in the same pipeline.
func batchContext[R any](batch []*R, ctxOf func(*R) context.Context) (context.Context, context.CancelFunc) {
	var earliest time.Time
	for _, r := range batch {
		if d, ok := ctxOf(r).Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	ctx := context.WithoutCancel(ctxOf(batch[0]))
	if earliest.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, earliest)
}
