package coalesce

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type req struct {
	id      int
	done    chan struct{}
	flushes atomic.Int32
}

func submit(b *Batcher[req], r *req) {
	b.Submit(r, func(*req) context.Context { return context.Background() }, r.done)
}

func newReq(id int) *req { return &req{id: id, done: make(chan struct{})} }

// queued waits until n requests are queued and no slot is taken.
func queued[R any](b *Batcher[R], n int) {
	for {
		b.mu.Lock()
		l := len(b.queue)
		b.mu.Unlock()
		if l == n {
			return
		}
		runtime.Gosched()
	}
}

// A caller whose request has its answer returns even though requests that
// arrived during its flush are still queued: it must not be kept flushing
// them, or a stream of arrivals (redeliveries of a key in progress) keeps
// the consumer that claimed the key from ever completing it.
func TestAnsweredCallerIsNotHeldByLaterArrivals(t *testing.T) {
	entered := make(chan int)
	gates := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	b := New(8, 1, func(_ context.Context, batch []*req) {
		for _, r := range batch {
			entered <- r.id
			<-gates[r.id]
			r.flushes.Add(1)
			close(r.done)
		}
	})
	r1, r2 := newReq(1), newReq(2)
	ret1, ret2 := make(chan struct{}), make(chan struct{})
	go func() { submit(b, r1); close(ret1) }()
	if id := <-entered; id != 1 {
		t.Fatalf("first flush got request %d, want 1", id)
	}
	go func() { submit(b, r2); close(ret2) }()
	queued(b, 1) // r2 waits behind the busy slot
	close(gates[1])
	select {
	case <-ret1:
	case id := <-entered:
		// Whoever flushes r2 now must not be r1's caller.
		select {
		case <-ret1:
		case <-time.After(10 * time.Second):
			t.Fatalf("caller 1 still busy flushing request %d after its own was answered", id)
		}
		close(gates[2])
		<-ret2
		return
	case <-time.After(10 * time.Second):
		t.Fatal("caller 1 did not return")
	}
	if id := <-entered; id != 2 {
		t.Fatalf("second flush got request %d, want 2", id)
	}
	close(gates[2])
	<-ret2
	if r1.flushes.Load() != 1 || r2.flushes.Load() != 1 {
		t.Fatalf("flushes = %d, %d; want 1 each", r1.flushes.Load(), r2.flushes.Load())
	}
}

// Under a steady stream of arrivals every request is flushed exactly once
// and every caller returns, whatever the batch size and slot count.
func TestEveryRequestFlushedOnce(t *testing.T) {
	for _, tc := range []struct{ max, inFlight int }{{1, 1}, {4, 1}, {128, 1}, {3, 2}, {128, 4}} {
		var batches atomic.Int32
		b := New(tc.max, tc.inFlight, func(_ context.Context, batch []*req) {
			if len(batch) == 0 || len(batch) > tc.max {
				t.Errorf("batch of %d, max %d", len(batch), tc.max)
			}
			batches.Add(1)
			for _, r := range batch {
				r.flushes.Add(1)
				runtime.Gosched()
				close(r.done)
			}
		})
		const callers, each = 32, 200
		reqs := make([]*req, callers*each)
		for i := range reqs {
			reqs[i] = newReq(i)
		}
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range each {
					submit(b, reqs[c*each+i])
				}
			})
		}
		wg.Wait()
		for _, r := range reqs {
			if n := r.flushes.Load(); n != 1 {
				t.Fatalf("max %d inFlight %d: request %d flushed %d times", tc.max, tc.inFlight, r.id, n)
			}
		}
		if len(b.slots) != 0 || len(b.queue) != 0 {
			t.Fatalf("max %d inFlight %d: %d slots taken, %d queued after every caller returned", tc.max, tc.inFlight, len(b.slots), len(b.queue))
		}
		t.Logf("max %d inFlight %d: %d requests in %d batches", tc.max, tc.inFlight, len(reqs), batches.Load())
	}
}
