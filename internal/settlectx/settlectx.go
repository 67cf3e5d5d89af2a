// Package settlectx gives the settle calls made after a handler returned
// (an ack, a dedup completion) a context that is cheap to make.
package settlectx

import (
	"context"
	"sync"
	"time"
)

// Ctx is the context of one settle: its parent's values, no
// cancellation from it, and a deadline. Unlike context.WithTimeout it arms
// no timer until something asks for Done: most drivers ack an in-memory
// or already-received delivery without ever waiting on the context, and
// the timer and its closures were most of a settle's allocations.
type Ctx struct {
	// detached is the parent through context.WithoutCancel. After Init it
	// is nil until a Value asks for it (under mu), since most settles ask
	// for no value and the detaching is an allocation; parent is then the
	// parent as given, and must not answer a Value itself: that would let
	// context.Cause find the parent's cancellation.
	detached context.Context
	parent   context.Context // nil: detached is set
	deadline time.Time
	timers   *Timers // where the timer comes from and goes back to; nil: made afresh

	mu    sync.Mutex
	done  chan struct{}
	timer *expirer
	err   error
}

// New returns a Ctx with parent's values, without its cancellation, that
// expires timeout from now. Call Release once done with it.
func New(parent context.Context, timeout time.Duration) *Ctx {
	c := new(Ctx)
	c.Init(parent, timeout)
	return c
}

// Init is New on a zero Ctx, for one allocated with something else of its
// caller's.
func (c *Ctx) Init(parent context.Context, timeout time.Duration) {
	if parent == nil {
		panic("settlectx: nil parent") // as context.WithoutCancel would
	}
	c.detached, c.parent, c.deadline, c.timers = nil, parent, time.Now().Add(timeout), nil
}

// InitDetached is Init for a caller that has detached the parent from its
// cancellation already (context.WithoutCancel), and may share that among
// its Ctxs: the detaching is an allocation. The timer a Done arms comes
// from timers, and goes back to it on Release; nil timers makes one.
func (c *Ctx) InitDetached(detached context.Context, timeout time.Duration, timers *Timers) {
	c.detached, c.parent, c.deadline, c.timers = detached, nil, time.Now().Add(timeout), timers
}

func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

// Value is the parent's value for key, read through the parent detached
// from its cancellation, so that context.Cause(c) does not report the
// parent's.
func (c *Ctx) Value(key any) any {
	if c.parent == nil {
		return c.detached.Value(key)
	}
	c.mu.Lock()
	if c.detached == nil {
		c.detached = context.WithoutCancel(c.parent)
	}
	d := c.detached
	c.mu.Unlock()
	return d.Value(key)
}

func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil || !time.Now().Before(c.deadline) {
			c.err = context.DeadlineExceeded
			close(c.done)
			return c.done
		}
		c.timer = c.timers.arm(c, time.Until(c.deadline))
	}
	return c.done
}

func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && !time.Now().Before(c.deadline) {
		c.expireLocked()
	}
	return c.err
}

func (c *Ctx) expireLocked() {
	if c.err != nil {
		return
	}
	c.err = context.DeadlineExceeded
	if c.done != nil {
		close(c.done)
	}
}

// Release stops c's timer, if one was armed; c must not be used after.
func (c *Ctx) Release() {
	c.mu.Lock()
	e := c.timer
	c.timer = nil
	c.mu.Unlock()
	if e != nil {
		c.timers.disarm(e)
	}
}

// Timers recycles the timers of the Ctxs initialised with it, so that a
// settle that waits on Done (a driver whose ack is a request and reply)
// costs its done channel only, not a timer and a closure as well. The
// zero value is ready to use; a Timers must not be copied once used.
type Timers struct{ pool sync.Pool }

// expirer is a timer that expires whichever Ctx it is armed for.
type expirer struct {
	t  *time.Timer
	mu sync.Mutex
	c  *Ctx // nil while idle
}

func (e *expirer) fire() {
	e.mu.Lock()
	c := e.c
	e.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expireLocked()
}

// arm starts a timer that expires c after d; ts may be nil.
func (ts *Timers) arm(c *Ctx, d time.Duration) *expirer {
	var e *expirer
	if ts != nil {
		e, _ = ts.pool.Get().(*expirer)
	}
	if e == nil {
		e = &expirer{c: c}
		e.t = time.AfterFunc(d, e.fire)
		return e
	}
	e.mu.Lock()
	e.c = c
	e.mu.Unlock()
	e.t.Reset(d)
	return e
}

// disarm stops e's timer and, when it had not fired, gives it back for
// reuse: one that fired may still be running fire, so it is left alone.
func (ts *Timers) disarm(e *expirer) {
	if !e.t.Stop() || ts == nil {
		return
	}
	e.mu.Lock()
	e.c = nil
	e.mu.Unlock()
	ts.pool.Put(e)
}
