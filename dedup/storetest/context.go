package storetest

import (
	"context"
	"sync"
	"time"
)

// DeadlineContext returns a context that reports deadline at and ends, with
// context.DeadlineExceeded, when the test calls expire, which stands for
// the moment that deadline passes. A test of a batching store needs the
// deadline of one call to pass while the call is in flight with others,
// not before it is sent; a real timer cannot promise that on a loaded
// machine. Code that reads Deadline sees at, as it would on a real
// deadline.
func DeadlineContext(at time.Time) (ctx context.Context, expire func()) {
	c := &deadlineCtx{Context: context.Background(), at: at, done: make(chan struct{})}
	return c, func() { c.once.Do(func() { close(c.done) }) }
}

type deadlineCtx struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.at, true }
func (c *deadlineCtx) Done() <-chan struct{}       { return c.done }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
