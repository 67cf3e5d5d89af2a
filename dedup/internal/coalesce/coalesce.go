// Package coalesce batches requests made concurrently into one round trip;
// the Redis and PostgreSQL stores share it.
package coalesce

import (
	"context"
	"sync"
	"time"
)

// Batcher coalesces requests made concurrently into one pipeline or
// statement, so that N deliveries in flight cost one round trip instead of N. It has no
// goroutine of its own: a caller that finds a free flush slot flushes the
// queue itself, and keeps doing so while requests keep arriving. A caller
// that finds every slot busy only waits; one of the slot holders picks its
// request up, because a holder checks the queue again after letting go of
// its slot, and an arriving caller tries for a slot after queueing.
type Batcher[R any] struct {
	max   int
	slots chan struct{}
	flush func(ctx context.Context, batch []*R)

	mu    sync.Mutex
	queue []*R
}

// New returns a Batcher that flushes at most maxBatch requests at a time,
// with at most inFlight flushes running at once.
func New[R any](maxBatch, inFlight int, flush func(context.Context, []*R)) *Batcher[R] {
	return &Batcher[R]{max: maxBatch, slots: make(chan struct{}, inFlight), flush: flush}
}

// Submit queues r and returns once some caller has flushed it, which may be
// this one. done is closed by flush when r has its answer.
func (b *Batcher[R]) Submit(r *R, ctxOf func(*R) context.Context, done <-chan struct{}) {
	b.mu.Lock()
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	b.drain(ctxOf)
	<-done
}

func (b *Batcher[R]) drain(ctxOf func(*R) context.Context) {
	for {
		select {
		case b.slots <- struct{}{}:
		default:
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
