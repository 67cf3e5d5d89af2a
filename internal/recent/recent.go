// Package recent remembers the IDs a driver sent within a window, so that
// drivers for brokers that drop a duplicate send silently (SQS answers it
// with the kept message's MessageId, Service Bus says nothing) can still
// report driver.SendResult.Duplicate for the IDs they sent themselves.
//
// A repeated ID is a duplicate only where the broker deduplicates: Observe
// takes the entity's window, not a bare length, so that an entity whose
// window does not protect (Service Bus without RequiresDuplicateDetection,
// which still reports a history window) never reads as deduplicating.
package recent

import (
	"sync"
	"time"

	"github.com/dedupq/dedupq/window"
)

// DefaultMax is the number of IDs remembered when IDs.Max is zero: about
// 8 MiB, which covers 5 minutes of sending at 200 messages a second.
const DefaultMax = 1 << 16

// IDs is a bounded, time-ordered memory of IDs. The zero value is ready to
// use and safe for concurrent use.
type IDs struct {
	// Max bounds the IDs remembered; beyond it the oldest are forgotten,
	// and their duplicates then read as first sends, which is all that is
	// lost. Zero means DefaultMax.
	Max int

	mu    sync.Mutex
	at    map[string]time.Time
	order []string // oldest first
}

// Observe records id as sent at now and reports whether it was already sent
// within w before now. Nothing is recorded, and nothing is a duplicate,
// for an empty id or a window that does not protect (w.Protects false):
// the broker then stored both sends.
func (s *IDs) Observe(id string, now time.Time, w window.Window) bool {
	if id == "" || !w.Protects() {
		return false
	}
	span := w.Duration
	limit := s.Max
	if limit <= 0 {
		limit = DefaultMax
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.order) > 0 && (len(s.order) >= limit || now.Sub(s.at[s.order[0]]) >= span) {
		delete(s.at, s.order[0])
		s.order = s.order[1:]
	}
	if first, ok := s.at[id]; ok && now.Sub(first) < span {
		return true
	}
	if s.at == nil {
		s.at = make(map[string]time.Time)
	}
	s.at[id] = now
	s.order = append(s.order, id)
	return false
}

// Len is the number of IDs remembered.
func (s *IDs) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}
