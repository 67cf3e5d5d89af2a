package pgstore

import "time"

// QueuedClaims reports how many claims wait for a batch (and completions,
// which share their batches unless AsyncClaims), so that a test can make
// them share one.
func QueuedClaims(s *Store) int { return s.claims.Queued() }

// QueuedCompletes is QueuedClaims for completions, which batch apart from
// claims under Options.AsyncClaims.
func QueuedCompletes(s *Store) int { return s.completes.Queued() }

// SetDoSlack replaces how far past its TTL Do's take sets a record's
// expiry (defaultDoSlack), so that a test can have a transaction outlive
// the slack without taking a minute. Call it before s is used.
func SetDoSlack(s *Store, d time.Duration) {
	s.doSlack = d
	s.prepareSQL()
}

// DoSlack returns how far past its TTL Do's take sets a record's expiry.
func DoSlack(s *Store) time.Duration { return s.doSlack }
