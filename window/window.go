// Package window holds the arithmetic behind dedupq's central rule: a retry
// is only harmless while the thing that deduplicates it still remembers the
// first attempt.
//
// A Window describes how long a backend remembers a dedup ID. A RetryPolicy
// (publisher side) and a RedeliveryPolicy (consumer side) each have a
// worst-case Span. CheckPublisher and CheckConsumer compare the two and
// return an *UnsafeRetryError that names the numbers and a concrete fix when
// a span does not fit.
package window

import (
	"fmt"
	"math"
	"time"
)

// Forever is the saturated duration used for spans that have no bound, such
// as unlimited redeliveries. Arithmetic in this package never overflows past
// it.
const Forever = time.Duration(math.MaxInt64)

// Kind says who decides a window's length.
type Kind int

const (
	// KindNone means the backend does not deduplicate on publish at all
	// (Google Pub/Sub): any resend is a new message.
	KindNone Kind = iota
	// KindFixed means the broker fixes the length and nothing changes it
	// (SQS FIFO: 5 minutes).
	KindFixed
	// KindConfigured means the length is a property of the entity (a
	// JetStream stream's Duplicates, a Service Bus queue's
	// DuplicateDetectionHistoryTimeWindow) and may change after startup.
	KindConfigured
)

// String implements fmt.Stringer.
func (k Kind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindFixed:
		return "fixed by the broker"
	case KindConfigured:
		return "configured on the entity"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Source says where a window's length came from.
type Source int

const (
	// SourceDocumented means the length is the backend's documented value,
	// not read from the live broker.
	SourceDocumented Source = iota
	// SourceDiscovered means the length was read from the live broker
	// (stream config, queue properties).
	SourceDiscovered
	// SourceConfigured means the length was given by the program, as for
	// the in-memory broker.
	SourceConfigured
)

// String implements fmt.Stringer.
func (s Source) String() string {
	switch s {
	case SourceDocumented:
		return "documented"
	case SourceDiscovered:
		return "discovered from the broker"
	case SourceConfigured:
		return "configured"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Window is how long a backend remembers a dedup ID after first seeing it.
// Within the window a resend with the same ID is dropped by the broker;
// after it, the resend is a new message.
type Window struct {
	// Backend names the backend, e.g. "jetstream" or "sqs".
	Backend string
	// Duration is the window's length; zero when Kind is KindNone.
	Duration time.Duration
	// Kind says who decides the length.
	Kind Kind
	// Source says where Duration came from.
	Source Source
	// Scope narrows what the window compares, when the broker narrows it:
	// "stream STREAM", "queue", "message group". Empty means the whole
	// entity.
	Scope string
}

// String reads well inside an error message, for example
// "jetstream dedup window 2m0s (configured on the entity, discovered from the broker)".
func (w Window) String() string {
	name := w.Backend
	if name == "" {
		name = "backend"
	}
	scope := ""
	if w.Scope != "" {
		scope = ", scope " + w.Scope
	}
	if w.Kind == KindNone || w.Duration <= 0 {
		return fmt.Sprintf("%s has no publish-side dedup window (%s%s)", name, w.Source, scope)
	}
	return fmt.Sprintf("%s dedup window %s (%s, %s%s)", name, w.Duration, w.Kind, w.Source, scope)
}

// Protects reports whether the window deduplicates anything at all.
func (w Window) Protects() bool { return w.Kind != KindNone && w.Duration > 0 }

// addSat adds durations, saturating at Forever; both must be non-negative.
func addSat(a, b time.Duration) time.Duration {
	if a >= Forever-b {
		return Forever
	}
	return a + b
}

// mulSat multiplies a non-negative duration by a non-negative count,
// saturating at Forever.
func mulSat(d time.Duration, n int64) time.Duration {
	if d == 0 || n == 0 {
		return 0
	}
	if int64(d) > int64(Forever)/n {
		return Forever
	}
	return d * time.Duration(n)
}

// scaleSat multiplies d by f ≥ 0, saturating at Forever.
func scaleSat(d time.Duration, f float64) time.Duration {
	v := float64(d) * f
	if v >= float64(Forever) || math.IsInf(v, 1) {
		return Forever
	}
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	return time.Duration(v)
}
