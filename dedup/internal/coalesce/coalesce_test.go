// These tests run the Batcher with scripted flushes in memory; they talk to
// no server.
package coalesce

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type req struct {
	Call
	id      int
	answer  int
	flushes atomic.Int32
	hooked  atomic.Int32
}

func newReq(id int) *req { return &req{id: id} }

// flushed is one flush the script has entered: it settles its requests
// when the test closes proceed.
type flushed struct {
	ctx     context.Context
	reqs    []*req
	proceed chan struct{}
}

// script is a flush that reports each batch on batches and waits for the
// test before answering it, and an abandoned hook that reports on late.
type script struct {
	batches chan *flushed
	late    chan *req
}

func newScript() *script {
	return &script{batches: make(chan *flushed, 16), late: make(chan *req, 64)}
}

func (s *script) batcher(max, inFlight int) *Batcher[*req] {
	return New(max, inFlight, func(ctx context.Context, reqs []*req) {
		f := &flushed{ctx: ctx, reqs: reqs, proceed: make(chan struct{})}
		s.batches <- f
		<-f.proceed
		for _, r := range reqs {
			r.flushes.Add(1)
			r.answer = r.id * 10
			r.Settle()
		}
	}, func(late []*req) {
		for _, r := range late {
			r.hooked.Add(1)
			s.late <- r
		}
	})
}

const patience = 10 * time.Second

// next returns the next batch the script entered.
func (s *script) next(t *testing.T) *flushed {
	t.Helper()
	select {
	case f := <-s.batches:
		return f
	case <-time.After(patience):
		t.Fatal("no flush started")
		return nil
	}
}

func ids(reqs []*req) []int {
	out := make([]int, len(reqs))
	for i, r := range reqs {
		out[i] = r.id
	}
	return out
}

// queued polls until n requests wait in the queue.
func queued[R Request](t *testing.T, b *Batcher[R], n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for b.Queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", b.Queued(), n)
		}
		runtime.Gosched()
	}
}

// async runs b.Do on its own goroutine and returns its error when done.
func async(ctx context.Context, b *Batcher[*req], r *req) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- b.Do(ctx, r) }()
	return ch
}

func wait(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(patience):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

// A caller whose request has its answer returns even though requests that
// arrived during its flush are still queued or in flight: it must not be
// kept flushing them, or a stream of arrivals (redeliveries of a key in
// progress) keeps the consumer that claimed the key from ever completing
// it.
func TestAnsweredCallerIsNotHeldByLaterArrivals(t *testing.T) {
	s := newScript()
	b := s.batcher(8, 1)
	r1, r2 := newReq(1), newReq(2)
	ret1 := async(context.Background(), b, r1)
	f1 := s.next(t)
	ret2 := async(context.Background(), b, r2)
	queued(t, b, 1) // r2 waits behind the busy slot
	close(f1.proceed)
	f2 := s.next(t) // r2's flush, held
	if err := wait(t, "caller 1, while request 2 is in flight", ret1); err != nil || r1.answer != 10 {
		t.Fatalf("caller 1: err %v, answer %d", err, r1.answer)
	}
	close(f2.proceed)
	if err := wait(t, "caller 2", ret2); err != nil || r2.answer != 20 {
		t.Fatalf("caller 2: err %v, answer %d", err, r2.answer)
	}
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
				r.Settle()
			}
		}, nil)
		const callers, each = 32, 200
		reqs := make([]*req, callers*each)
		for i := range reqs {
			reqs[i] = newReq(i)
		}
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range each {
					if err := b.Do(context.Background(), reqs[c*each+i]); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		for _, r := range reqs {
			if n := r.flushes.Load(); n != 1 {
				t.Fatalf("max %d inFlight %d: request %d flushed %d times", tc.max, tc.inFlight, r.id, n)
			}
		}
		idle(t, b)
		t.Logf("max %d inFlight %d: %d requests in %d batches", tc.max, tc.inFlight, len(reqs), batches.Load())
	}
}

// idle polls until no flush runs and nothing is queued.
func idle[R Request](t *testing.T, b *Batcher[R]) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for len(b.slots) != 0 || b.Queued() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d slots taken, %d queued after every caller returned", len(b.slots), b.Queued())
		}
		runtime.Gosched()
	}
}

// A caller without a deadline shares a batch with callers whose contexts
// end while the batch is in flight: they return at once with their own
// context's error, the flush goes on, and the caller without a deadline gets
// its answer. The answers that reached nobody go to the abandoned hook.
func TestCallerOutlivesOthersGivingUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		short func() (context.Context, context.CancelFunc)
		want  error
	}{
		{"Deadline", func() (context.Context, context.CancelFunc) {
			c := &deadlineCtx{Context: context.Background(), at: time.Now().Add(time.Second), done: make(chan struct{})}
			return c, c.expire
		}, context.DeadlineExceeded},
		{"Cancel", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScript()
			b := s.batcher(8, 1)
			r0, r1, r2 := newReq(0), newReq(1), newReq(2)
			ret0 := async(context.Background(), b, r0)
			f0 := s.next(t)
			ret1 := async(context.Background(), b, r1)
			queued(t, b, 1)
			sctx, cancel := tc.short()
			defer cancel()
			ret2 := async(sctx, b, r2)
			queued(t, b, 2)
			close(f0.proceed)
			f1 := s.next(t)
			if got := ids(f1.reqs); len(got) != 2 {
				t.Fatalf("batch %v, want requests 1 and 2 together", got)
			}
			cancel() // caller 2's deadline passes, or it cancels
			if err := wait(t, "the caller that gave up", ret2); !errors.Is(err, tc.want) {
				t.Fatalf("caller 2: err = %v, want %v", err, tc.want)
			}
			if err := f1.ctx.Err(); err != nil {
				t.Fatalf("the flush's context ended (%v) while caller 1 still waits", err)
			}
			close(f1.proceed)
			if err := wait(t, "caller 1", ret1); err != nil || r1.answer != 10 {
				t.Fatalf("caller 1: err %v, answer %d; want its answer 10", err, r1.answer)
			}
			if err := wait(t, "caller 0", ret0); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-s.late:
				if r != r2 || r.answer != 20 {
					t.Fatalf("abandoned hook got request %d (answer %d), want 2 with its answer", r.id, r.answer)
				}
			case <-time.After(patience):
				t.Fatal("the answer of the request whose caller gave up never reached the abandoned hook")
			}
			idle(t, b)
			if r0.hooked.Load() != 0 || r1.hooked.Load() != 0 || r2.hooked.Load() != 1 {
				t.Fatalf("hooked %d, %d, %d times; want 0, 0, 1", r0.hooked.Load(), r1.hooked.Load(), r2.hooked.Load())
			}
		})
	}
}

// deadlineCtx is a context with a deadline that ends when the test says
// so, as if its deadline had passed then: a real deadline could pass before
// the request is sent, and the test needs it to pass while it is in flight.
type deadlineCtx struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.done }
func (c *deadlineCtx) expire()                     { c.once.Do(func() { close(c.done) }) }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// When every caller of a batch has given up, the flush's context ends, and
// the requests still go to the abandoned hook once settled.
func TestFlushEndsWhenEveryCallerGaveUp(t *testing.T) {
	s := newScript()
	b := s.batcher(8, 1)
	r0, r1, r2 := newReq(0), newReq(1), newReq(2)
	ret0 := async(context.Background(), b, r0)
	f0 := s.next(t)
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	ret1, ret2 := async(ctx1, b, r1), async(ctx2, b, r2)
	queued(t, b, 2)
	close(f0.proceed)
	f1 := s.next(t)
	cancel1()
	if err := wait(t, "caller 1", ret1); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller 1: %v", err)
	}
	if f1.ctx.Err() != nil {
		t.Fatal("the flush's context ended while caller 2 still waits")
	}
	cancel2()
	if err := wait(t, "caller 2", ret2); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller 2: %v", err)
	}
	select {
	case <-f1.ctx.Done():
	case <-time.After(patience):
		t.Fatal("the flush's context did not end when its last caller gave up")
	}
	close(f1.proceed)
	if err := wait(t, "caller 0", ret0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case <-s.late:
		case <-time.After(patience):
			t.Fatal("abandoned hook not called for both requests")
		}
	}
}

// A caller that gives up while its request is still queued returns at once
// and its request is never sent.
func TestGivingUpWhileQueuedSendsNothing(t *testing.T) {
	s := newScript()
	b := s.batcher(8, 1)
	r0, r1, r2 := newReq(0), newReq(1), newReq(2)
	ret0 := async(context.Background(), b, r0)
	f0 := s.next(t)
	ctx, cancel := context.WithCancel(context.Background())
	ret1 := async(ctx, b, r1)
	queued(t, b, 1)
	cancel()
	if err := wait(t, "caller 1", ret1); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller 1: %v", err)
	}
	ret2 := async(context.Background(), b, r2)
	queued(t, b, 2)
	close(f0.proceed)
	f := s.next(t)
	if got := ids(f.reqs); len(got) != 1 || got[0] != 2 {
		t.Fatalf("next batch %v, want only request 2", got)
	}
	close(f.proceed)
	for _, ch := range []<-chan error{ret0, ret2} {
		if err := wait(t, "caller", ch); err != nil {
			t.Fatal(err)
		}
	}
	idle(t, b)
	if r1.flushes.Load() != 0 || r1.hooked.Load() != 0 {
		t.Fatalf("request 1 flushed %d times, hooked %d; want neither", r1.flushes.Load(), r1.hooked.Load())
	}
}

// Callers give up at random moments while flushes answer: every caller
// either gets its answer or its context's error, and every request that was
// flushed after its caller gave up reaches the abandoned hook exactly once;
// no answer is lost and none is delivered twice.
func TestGivingUpRacesTheAnswer(t *testing.T) {
	var hooked sync.Map
	b := New(16, 2, func(_ context.Context, batch []*req) {
		for _, r := range batch {
			r.flushes.Add(1)
			if rand.IntN(4) == 0 {
				runtime.Gosched()
			}
			r.answer = r.id * 10
			r.Settle()
		}
	}, func(late []*req) {
		for _, r := range late {
			r.hooked.Add(1)
			hooked.Store(r, true)
		}
	})
	const n = 4000
	reqs := make([]*req, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reqs {
		reqs[i] = newReq(i)
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%2 == 0 {
				go func() {
					for range rand.IntN(8) {
						runtime.Gosched()
					}
					cancel()
				}()
			}
			errs[i] = b.Do(ctx, reqs[i])
		})
	}
	wg.Wait()
	idle(t, b)
	var answered, gaveUp, undone int
	for i, r := range reqs {
		switch {
		case errs[i] == nil:
			answered++
			if r.flushes.Load() != 1 || r.answer != i*10 || r.hooked.Load() != 0 {
				t.Fatalf("request %d answered: flushed %d, answer %d, hooked %d", i, r.flushes.Load(), r.answer, r.hooked.Load())
			}
		case !errors.Is(errs[i], context.Canceled):
			t.Fatalf("request %d: %v", i, errs[i])
		default:
			gaveUp++
			if r.flushes.Load() > 1 {
				t.Fatalf("request %d flushed %d times", i, r.flushes.Load())
			}
			if r.flushes.Load() == 1 {
				undone++
			}
		}
	}
	// The hook runs on goroutines of its own: wait for the calls started.
	deadline := time.Now().Add(patience)
	for {
		count := 0
		hooked.Range(func(any, any) bool { count++; return true })
		if count == undone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests flushed after their callers gave up, %d reached the hook", undone, count)
		}
		runtime.Gosched()
	}
	for _, r := range reqs {
		if h := r.hooked.Load(); h > 1 || (h == 1 && r.flushes.Load() != 1) {
			t.Fatalf("request %d hooked %d times, flushed %d", r.id, h, r.flushes.Load())
		}
	}
	t.Logf("%d answered, %d gave up (%d of them after being sent)", answered, gaveUp, undone)
}

// With Grace, a flush whose last caller gave up goes on for Grace, so that
// the store can still read what it applied, and then ends.
func TestGraceKeepsTheFlushAfterTheLastCallerLeft(t *testing.T) {
	s := newScript()
	b := s.batcher(8, 1)
	b.Grace = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	ret := async(ctx, b, newReq(0))
	f := s.next(t)
	left := time.Now()
	cancel()
	if err := wait(t, "the caller", ret); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller: %v", err)
	}
	select {
	case <-f.ctx.Done():
		if d := time.Since(left); d < b.Grace {
			t.Fatalf("the flush's context ended %s after its last caller left, before the %s grace", d, b.Grace)
		}
	case <-time.After(patience):
		t.Fatal("the flush's context did not end after the grace")
	}
	close(f.proceed)
	select {
	case <-s.late:
	case <-time.After(patience):
		t.Fatal("abandoned hook not called")
	}
}

// goroutineID is the number the runtime gave the calling goroutine.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

// Requests made one after another are flushed by the same goroutines while
// they linger: a fresh goroutine per flush grows its stack anew through the
// store client's call chain. Each request must also be taken at once by
// the lingering flusher, not left queued until its linger ends (the
// deadline below is far shorter than the linger).
func TestFlusherLingersBetweenRequests(t *testing.T) {
	for _, inFlight := range []int{1, 2} {
		var mu sync.Mutex
		flushers := map[string]int{}
		b := New(8, inFlight, func(_ context.Context, reqs []*req) {
			mu.Lock()
			flushers[goroutineID()]++
			mu.Unlock()
			for _, r := range reqs {
				r.Settle()
			}
		}, nil)
		b.linger = time.Hour
		for i := range 50 {
			ctx, cancel := context.WithTimeout(context.Background(), patience)
			err := b.Do(ctx, newReq(i))
			cancel()
			if err != nil {
				t.Fatalf("inFlight %d: request %d: %v (left queued for a flusher that lingered?)", inFlight, i, err)
			}
		}
		mu.Lock()
		// A request that arrives while the flusher is still settling the
		// previous one may start a second one, up to inFlight.
		if len(flushers) > inFlight {
			t.Errorf("inFlight %d: 50 requests in a row flushed by %d goroutines, want at most %d: %v", inFlight, len(flushers), inFlight, flushers)
		}
		mu.Unlock()
	}
}
