package dedupq

import "context"

// Checker is implemented by a Deduplicator that can tell before the first
// delivery whether its store works (package dedup's Guard and pgstore's
// TxGuard do). NewConsumer calls Check and fails on its error: a dedup
// store that is down or not set up would otherwise pass startup silently
// and then nack every delivery.
//
// The check lives here, at consumer startup, rather than in the stores'
// constructors, because this is where a context bounds it and where its
// failure can stop the program before it consumes anything; a store's
// constructor takes no context and stays free of I/O.
type Checker interface {
	// Check returns nil if the deduplicator can work, else an error that
	// says what is wrong and what to do.
	Check(ctx context.Context) error
}
