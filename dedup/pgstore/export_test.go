package pgstore

// QueuedClaims reports how many claims wait for a batch (and completions,
// which share their batches unless AsyncClaims), so that a test can make
// them share one.
func QueuedClaims(s *Store) int { return s.claims.Queued() }

// QueuedCompletes is QueuedClaims for completions, which batch apart from
// claims under Options.AsyncClaims.
func QueuedCompletes(s *Store) int { return s.completes.Queued() }
