// Package coalesce batches requests made concurrently into one round trip;
// the Redis and PostgreSQL stores share it.
package coalesce

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Call is the Batcher's part of a request: every request type embeds it,
// and the flush calls Settle once the request has its answer.
type Call struct {
	ctx   context.Context
	done  chan struct{}
	state atomic.Int32
	// batch is the batch that carries the request, nil while it is
	// queued. Set under Batcher.mu before the flush starts.
	batch *batch
}

// The states of a Call. A caller that stops waiting moves its request from
// pending to abandoned; the flush moves it from pending to answered, or from
// abandoned to late. Both moves are compare-and-swaps, so exactly one side
// knows that the answer reached nobody.
const (
	pending int32 = iota
	answered
	abandoned
	late
)

func (c *Call) call() *Call { return c }

// Request is what a Batcher batches: a pointer to a struct that embeds
// Call.
type Request interface{ call() *Call }

// Settle says that the request's answer (or error) is written and hands it
// to its caller. The flush calls it exactly once for every request of its
// batch, before it returns. A request whose caller had already given up is
// handed to the Batcher's abandoned function instead.
func (c *Call) Settle() {
	for {
		switch s := c.state.Load(); s {
		case pending:
			if !c.state.CompareAndSwap(pending, answered) {
				continue // its caller gave up meanwhile
			}
			c.batch.leave(true)
		case abandoned:
			if !c.state.CompareAndSwap(abandoned, late) {
				continue
			}
		default:
			panic("coalesce: request settled twice")
		}
		close(c.done)
		return
	}
}

// batch is what the requests of one flush share.
type batch struct {
	// live counts the requests whose callers still wait for their answer;
	// when it reaches zero nobody does, and the flush's context ends, after
	// grace.
	live atomic.Int32
	// gone says that a caller gave up while its request was in flight
	// (set before that caller leaves): only then does the flush need its
	// Grace.
	gone   atomic.Bool
	grace  time.Duration
	cancel context.CancelFunc
	// timer ends the flush's context Grace after the last caller left; done
	// stops it, so that a flush that returned leaves no timer behind (one
	// per flush, for Grace, in a busy store).
	mu    sync.Mutex
	timer *time.Timer
	over  bool
}

// leave is called once per request, when it is answered or its caller
// gives up.
func (b *batch) leave(answered bool) {
	if b.live.Add(-1) == 0 {
		if answered && !b.gone.Load() {
			// Every caller has its answer, so the flush has nothing
			// left to learn and returns shortly; done ends its context.
			// Starting the Grace timer here, on every flush, cost a
			// timer per batch (a batch of one at concurrency 1) for
			// nothing.
			return
		}
		if b.grace > 0 {
			b.mu.Lock()
			if !b.over {
				b.timer = time.AfterFunc(b.grace, b.cancel)
			}
			b.mu.Unlock()
			return
		}
		b.cancel()
	}
}

// done ends the flush's context once the flush has returned.
func (b *batch) done() {
	b.mu.Lock()
	b.over = true
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	b.cancel()
}

// Batcher coalesces requests made concurrently into one pipeline or
// statement, so that N deliveries in flight cost one round trip instead of
// N. A caller that finds a free flush slot starts a goroutine that flushes
// the queue until it is empty; a caller that finds every slot busy only
// queues, and the holder of a slot checks the queue again after letting go
// of it, so a queued request is always picked up.
//
// Callers never flush: each waits for its own answer or its own context,
// whichever comes first, so neither a stream of other callers' requests
// (the redeliveries of a key in progress, say) nor another caller's deadline
// decides when or how a caller returns. A flush runs under a context of its
// own, which carries the values of its first request's context but ends
// only when every caller in the batch has given up (and Grace has passed
// since): one caller's deadline
// must not fail the others' requests riding in the same round trip, and a
// round trip whose answers nobody waits for any more need not go on.
//
// A caller that gives up does not take its request back: it may already be
// on its way, and the store may apply it after the caller has returned.
// Such a request is passed, once settled, to the abandoned function given
// to New, which undoes what only its caller could have undone (a claim that
// was acquired for a caller who was told it failed).
type Batcher[R Request] struct {
	// Grace is how long a flush goes on after the last caller of its batch
	// gave up, so that it can still learn what the store applied: a store
	// that cut a statement short at once would not know whether a claim
	// committed, and an undo sent meanwhile could reach the store before
	// the claim does. Set it before the first Do; zero ends the flush at
	// once.
	Grace time.Duration

	max   int
	slots chan struct{}
	// wake rouses a flusher that waits for work (for linger); idle counts
	// those that do.
	wake      chan struct{}
	idle      atomic.Int32
	linger    time.Duration
	flush     func(ctx context.Context, batch []R)
	abandoned func(late []R)

	mu    sync.Mutex
	queue []R
}

// New returns a Batcher that flushes at most maxBatch requests at a time,
// with at most inFlight flushes running at once. flush must Settle every
// request of its batch before it returns. abandoned (may be nil) is called,
// on a goroutine of its own, with the requests of a flush that were settled
// after their callers gave up.
func New[R Request](maxBatch, inFlight int, flush func(context.Context, []R), abandoned func(late []R)) *Batcher[R] {
	return &Batcher[R]{max: maxBatch, slots: make(chan struct{}, inFlight), wake: make(chan struct{}, 1), linger: linger, flush: flush, abandoned: abandoned}
}

// linger is how long a flusher whose queue ran dry waits for more work
// before it lets go of its slot and ends. A fresh goroutine per flush grew
// its stack anew through the client's call chain every time: at
// concurrency 1, a sixth of a redisstore claim's CPU went to copying
// stacks.
const linger = 50 * time.Millisecond

// Do queues r and waits until a flush has settled it, then returns nil and
// r holds its answer; or until ctx is done, then it returns ctx's error and
// r belongs to the Batcher (see Batcher and New).
func (b *Batcher[R]) Do(ctx context.Context, r R) error {
	c := r.call()
	c.ctx, c.done, c.batch = ctx, make(chan struct{}), nil
	c.state.Store(pending)
	b.mu.Lock()
	b.queue = append(b.queue, r)
	b.mu.Unlock()
	b.kick()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.state.CompareAndSwap(pending, abandoned) {
		if c.batch != nil {
			c.batch.gone.Store(true)
			c.batch.leave(false)
		}
		return ctx.Err()
	}
	if c.state.Load() == answered {
		// Answered as the context ended: the answer is there, and
		// nobody else will act on it.
		return nil
	}
	return ctx.Err() // dropped from the queue (see take)
}

// Queued reports how many requests wait for a flush, for tests that need
// requests to share a batch.
func (b *Batcher[R]) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// kick starts a flusher if a slot is free. A caller calls it after queueing,
// and a flusher checks the queue after letting go of its slot, so one of
// them always sees a request that arrives while every slot is busy.
func (b *Batcher[R]) kick() {
	if b.idle.Load() > 0 {
		// A flusher waits for work: it takes the request (and one that
		// stops waiting meanwhile still finds the queue; see run).
		select {
		case b.wake <- struct{}{}:
		default:
		}
		return
	}
	select {
	case b.slots <- struct{}{}:
		go b.run()
	default:
	}
}

// run holds a slot and flushes batches until the queue is empty.
func (b *Batcher[R]) run() {
	woke := 0
	var idle *time.Timer
	for {
		if woke > 1 {
			// The flush just woke several callers, and each has its next
			// request to make (a claim's completion, say). Let them run
			// first: otherwise the next batch holds the few requests
			// queued this instant, the rest wait a whole round trip for
			// the slot, and batches come out small and uneven (measured:
			// a third more claims and completions per second at
			// concurrency 16 and 64 on 2 cores). After a batch of one
			// there is nobody to wait for, and yielding only moved the
			// flusher behind its own caller's next request (slower at
			// concurrency 1).
			runtime.Gosched()
		}
		reqs, bt, ctx := b.take()
		woke = len(reqs)
		if len(reqs) == 0 {
			if idle == nil {
				idle = time.NewTimer(b.linger)
			} else {
				idle.Reset(b.linger)
			}
			b.idle.Add(1)
			if b.Queued() > 0 {
				// Queued before the count was up, so its caller
				// kicked nobody awake.
				b.idle.Add(-1)
				idle.Stop()
				continue
			}
			select {
			case <-b.wake:
				b.idle.Add(-1)
				idle.Stop()
				continue
			case <-idle.C:
			}
			// A request queued after the take and before this line was
			// kicked to a flusher it saw waiting, which was this one:
			// the check below, after the slot is free, finds it.
			b.idle.Add(-1)
			<-b.slots
			if b.Queued() == 0 {
				return
			}
			select {
			case b.slots <- struct{}{}:
				continue
			default:
				return // the holder of a slot will see the queue
			}
		}
		b.flush(ctx, reqs)
		bt.done()
		var gone []R
		for _, r := range reqs {
			switch r.call().state.Load() {
			case late:
				gone = append(gone, r)
			case pending, abandoned:
				panic("coalesce: flush returned without settling a request")
			}
		}
		if len(gone) > 0 && b.abandoned != nil {
			go b.abandoned(gone)
		}
	}
}

// take removes the next batch from the queue. Requests whose callers gave
// up while they were queued, or whose contexts have ended, are dropped
// unsent: nothing of them reached the store, so nothing needs undoing.
func (b *Batcher[R]) take() ([]R, *batch, context.Context) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var reqs []R
	i := 0
	for ; i < len(b.queue) && len(reqs) < b.max; i++ {
		c := b.queue[i].call()
		if c.ctx.Err() != nil {
			// Its caller is leaving, or will find it dropped.
			c.state.CompareAndSwap(pending, abandoned)
		}
		if c.state.Load() == pending {
			reqs = append(reqs, b.queue[i])
		}
	}
	n := copy(b.queue, b.queue[i:])
	clear(b.queue[n:]) // let the taken requests go
	b.queue = b.queue[:n]
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	bt := &batch{grace: b.Grace}
	ctx, cancel := context.WithCancel(context.WithoutCancel(reqs[0].call().ctx))
	bt.cancel = cancel
	bt.live.Store(int32(len(reqs)))
	for _, r := range reqs {
		r.call().batch = bt
	}
	return reqs, bt, ctx
}
