package pgstore

// QueuedClaims reports how many claims wait for a batch, so that a test can
// make claims share one.
func QueuedClaims(s *Store) int { return s.claims.Queued() }
