package redisstore

// Queued reports how many calls wait for a pipeline, so that a test can
// make calls share one.
func Queued(s *Store) int { return s.batch.Queued() }

// CheckKey is the dedup key of Check's probe record.
const CheckKey = checkKey
