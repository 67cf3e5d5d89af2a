package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
)

// markingStore is a dedup.Store that tells mark each key whose completion
// the store accepted, so that the effect the handler wrote before it can
// be marked recorded. An effect never marked is one the Guard left
// unrecorded: the completion failed, the lease was lost, or the process
// died first. (A process that dies between Complete and mark leaves a
// recorded effect unmarked: the count errs on the side of more gaps,
// never fewer.)
type markingStore struct {
	dedup.Store
	mark func(ctx context.Context, key string)
}

func (s markingStore) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	err := s.Store.Complete(ctx, key, token, ttl, result)
	if err == nil {
		s.mark(ctx, key)
	}
	return err
}

// countingDedup counts every delivery that reaches the deduplicator, so
// that a consumer can show it is still receiving after a server restart.
// It passes Check through, so the consumer's startup check still asks the
// store.
type countingDedup struct {
	dedupq.Deduplicator
	deliveries *atomic.Int64
}

func (c countingDedup) Wrap(h dedupq.Handler) dedupq.Handler {
	inner := c.Deduplicator.Wrap(h)
	return func(ctx context.Context, d *dedupq.Delivery) error {
		c.deliveries.Add(1)
		return inner(ctx, d)
	}
}

func (c countingDedup) Check(ctx context.Context) error {
	if ch, ok := c.Deduplicator.(dedupq.Checker); ok {
		return ch.Check(ctx)
	}
	return nil
}
