package pgstore

import (
	"context"
	"fmt"
	"time"
)

// DefaultSweepBatch is how many rows one sweep statement deletes at most
// when the caller does not say.
const DefaultSweepBatch = 1000

// Sweep deletes expired rows — completions past their TTL and claims past
// their lease — of every namespace in the table, in statements of at most
// batch rows (0 means DefaultSweepBatch), until none is left or ctx ends.
// It returns how many rows it deleted.
//
// Each statement is its own short transaction that locks only the rows it
// deletes and skips rows locked by claims in flight, so sweeping never
// blocks claims for long and never takes a table-wide lock. The deleted
// rows still cost vacuum work. At very large volumes dropping whole time
// partitions is far cheaper than any DELETE, but PostgreSQL wants the
// partition column in a partitioned table's primary key, so (namespace,
// key) could no longer be unique across partitions; the way there is to
// rotate tables per period longer than the TTL and claim against the
// current and the previous one, dropping older ones whole. This store does
// not do that yet.
func (s *Store) Sweep(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = DefaultSweepBatch
	}
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.sweepSQL, batch)
		if err != nil {
			if retryable(err) {
				continue
			}
			return total, fmt.Errorf("pgstore: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// RunSweeper calls Sweep every interval until ctx is done, then returns
// ctx's error. A failed sweep is retried at the next tick: expired rows do
// no harm while they wait, because a claim takes them over in place.
// onError, if not nil, hears of each failure.
func (s *Store) RunSweeper(ctx context.Context, interval time.Duration, batch int, onError func(error)) error {
	if interval <= 0 {
		return fmt.Errorf("pgstore: sweep interval %s is not positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if _, err := s.Sweep(ctx, batch); err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
	}
}
