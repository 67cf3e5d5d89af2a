package dedupq

import (
	"errors"
	"sync/atomic"
)

// PublisherStats counts what a Publisher did, per message. Read them with
// Publisher.Stats; each read is a handful of atomic loads.
type PublisherStats struct {
	// Stored counts messages the broker stored on this publish.
	Stored uint64
	// Duplicates counts messages the broker dropped as duplicates of an
	// earlier send: already stored.
	Duplicates uint64
	// Refused counts messages certainly not stored: invalid, or refused
	// by the broker with an error that is not retryable.
	Refused uint64
	// MaybeSent counts messages whose publish failed after a send whose
	// outcome is unknown (PublishError.MaybeSent).
	MaybeSent uint64
	// Attempts counts sends of one message, first tries and retries.
	Attempts uint64
}

type pubStats struct {
	stored, duplicates, refused, maybeSent, attempts atomic.Uint64
}

func (s *pubStats) count(results []Result) {
	// Counted here first: one atomic add per counter and call, not one
	// per message on counters every publishing goroutine shares.
	var stored, duplicates, maybe, refused uint64
	for _, r := range results {
		switch {
		case r.Err == nil && r.Duplicate:
			duplicates++
		case r.Err == nil:
			stored++
		case maybeSent(r.Err):
			maybe++
		default:
			refused++
		}
	}
	for _, c := range []struct {
		n uint64
		v *atomic.Uint64
	}{{stored, &s.stored}, {duplicates, &s.duplicates}, {maybe, &s.maybeSent}, {refused, &s.refused}} {
		if c.n > 0 {
			c.v.Add(c.n)
		}
	}
}

// Stats returns the counters so far.
func (p *Publisher) Stats() PublisherStats {
	s := &p.stats
	return PublisherStats{Stored: s.stored.Load(), Duplicates: s.duplicates.Load(),
		Refused: s.refused.Load(), MaybeSent: s.maybeSent.Load(), Attempts: s.attempts.Load()}
}

// ConsumerStats counts what a Consumer did with its deliveries. Read them
// with Consumer.Stats. What consumer-side dedup decided (suppressed,
// deferred, conflicts) is in the Deduplicator's own stats (dedup.Guard.Stats).
type ConsumerStats struct {
	// Received counts deliveries handed to the handler.
	Received uint64
	// Acked, Nacked and Terminated count settlements by kind.
	Acked, Nacked, Terminated uint64
	// SettleFailed counts settlements the broker did not take (it
	// redelivers those).
	SettleFailed uint64
	// LeaseExtensions and LeaseExtensionFailures count lease extensions.
	LeaseExtensions, LeaseExtensionFailures uint64
}

type conStats struct {
	received, acked, nacked, terminated, settleFailed, leaseExt, leaseExtFailed atomic.Uint64
}

// Stats returns the counters so far.
func (c *Consumer) Stats() ConsumerStats {
	s := &c.stats
	return ConsumerStats{Received: s.received.Load(), Acked: s.acked.Load(), Nacked: s.nacked.Load(),
		Terminated: s.terminated.Load(), SettleFailed: s.settleFailed.Load(),
		LeaseExtensions: s.leaseExt.Load(), LeaseExtensionFailures: s.leaseExtFailed.Load()}
}

// maybeSent reports whether err is a *PublishError with MaybeSent. It uses
// errors.AsType, not errors.As, whose target pointer escapes: an
// allocation per result counted.
func maybeSent(err error) bool {
	pe, ok := errors.AsType[*PublishError](err)
	return ok && pe.MaybeSent
}
