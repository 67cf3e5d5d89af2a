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
	context.Context // the parent, through context.WithoutCancel
	deadline        time.Time

	mu    sync.Mutex
	done  chan struct{}
	timer *time.Timer
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
	c.Context, c.deadline = context.WithoutCancel(parent), time.Now().Add(timeout)
}

func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, true }

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
		c.timer = time.AfterFunc(time.Until(c.deadline), func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.expireLocked()
		})
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
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
	}
}
