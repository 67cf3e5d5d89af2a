// Package window holds the arithmetic behind dedupq's central rule: a retry
// is only harmless while the thing that deduplicates it still remembers the
// first attempt.
//
// A Window describes how long a backend remembers a dedup ID. A RetryPolicy
// (publisher side) and a RedeliveryPolicy (consumer side) each have a
// worst-case Span. CheckPublisher and CheckConsumer compare the two and
// return an *UnsafeRetryError that names the numbers and a concrete fix when
// a span does not fit. Each fix names the setting to change: the portable
// options by their Go names, the broker's by the names its driver gives
// in Window.Settings.
//
// # The model both checks state
//
// W is the broker window, P the publisher's worst-case retry span
// (RetryPolicy.Span plus hidden SDK retries), R the redelivery span
// (RedeliveryPolicy.Span) and T the consumer's dedup TTL, counted from when
// a key's completion is recorded. One message's life, from t0, the start of
// its first send:
//
//	t0        the first send may be stored at once (copy 1) and its answer lost
//	t0 … t0+W every resend is dropped by the broker as a duplicate
//	t0+W …    a resend is stored as a new message (copy 2, 3, …)
//	< t0+P    the last resend reaches the broker: every send reaches it within
//	          its attempt's AttemptTimeout
//	          each copy is delivered when stored, then redelivered; every
//	          delivery claims the key before its lease ends, the last one
//	          less than R after the copy's first delivery (a delivery held
//	          while the store is down retries its claim only until then,
//	          before its lease is first renewed, and within T of its
//	          receipt: ConsumerPlan.ClaimDeadline; a lease renewed while
//	          the key is not claimed would stretch the delivery past R)
//	t0        the earliest moment copy 1's completion is recorded, so the
//	          record may expire at t0+T
//
// So a second copy exists only if P > W, and then it may be stored at
// t0+P−ε and claim its key until t0+P+R−ε; the record of copy 1, written
// right after t0, must still be there. The requirements are therefore:
//
//   - Publisher without consumer-side dedup: P ≤ W (no second copy ever).
//   - Publisher with consumer-side dedup declared (ConsumerDedupTTL): P ≤ W,
//     or else P ≤ T. The publisher cannot see R, so this is necessary, not
//     sufficient; its fix hint says the TTL must cover P plus R.
//   - Consumer: T ≥ R when P ≤ W, and T ≥ R + P — the whole P, not P−W —
//     when P > W. This is the sufficient condition: with a truthful
//     PublisherSpan it alone rules out a duplicate effect, whatever the
//     publisher checked. With P ≤ W and MaxDeliveries 1 there is one
//     delivery of one copy, claimed before anything completes: any T.
//
// Both decide "P fits the window" with the same test, so for equal margins
// they agree: a publisher that relies on its window is one the consumer
// needs no more than R for, and a plan the consumer accepts has a publisher
// span the publisher accepts too.
//
// The bounds are tight: at margin zero every refused plan has a schedule
// within the declared policies that runs an effect twice (a send stored
// but its answer lost, the completion recorded at once, the last resend at
// the end of its attempt, every redelivery as late as its lease and backoff
// allow), with one exception on brokers that wait no backoff after a lease
// expires (mem): a delivery that completed the key is acked or expires, so
// the backoff before the second delivery cannot follow a completion, and T
// down to R − Backoff[0] is safe when no second copy can exist. Brokers
// that back off after an expired lease too (Pub/Sub) can wait it, so R
// stays the bound. internal/exactlyonce checks all of this by simulation.
//
// R is the broker's bound, not a count the broker keeps on a best-effort
// basis: a broker whose count of deliveries is approximate (Pub/Sub's
// max_delivery_attempts) reports no count and bounds R by the message's
// expiry instead (RedeliveryPolicy.Expiry, Pub/Sub's message retention),
// and the check asks T to cover that.
//
// # Ordered groups
//
// An ordered consumer (ConsumerPlan.Ordered) delivers a message only once
// every message stored before it in its group has ended: acked, or
// dropped after its last delivery, each up to R after its first delivery.
// So a second copy, which exists only if P > W, waits behind the first
// copy's deliveries and behind the B messages of its group stored between
// the two copies (ConsumerPlan.GroupBacklog: those published to the group
// within P). With the first copy completed at t0, delivered then and its
// acks lost until t0+R, each of the B messages stored by t0+P and holding
// the group for R, the second copy's last claim comes before
//
//	t0 + max(P, R) + (B+1)·R
//
// and T must cover max(P, R) + (B+1)·R instead of P + R. Without a declared
// B no T covers a plan with P > W. With P ≤ W there is no second copy and
// ordering changes nothing. Each message is assumed to end within its
// redelivery span: a handler that runs past its ack wait (its lease
// extended) holds its group longer, which no check can see.
//
// The model assumes a stored copy is delivered while the consumers run; it
// cannot see consumers that are down.
//
// # Margins
//
// A margin m is a share of each protecting duration kept free for clock
// skew and broker-side delays no policy sees: a window W protects spans up
// to (1−m)·W, a TTL T covers spans up to (1−m)·T. The consumer applies its
// margin to the window too when it decides whether P fits it, so a span
// near the window is counted in full: skew can turn a resend the publisher
// thought was dropped into a second copy. Margin zero in a plan means
// DefaultMargin; a negative margin means none.
package window

import (
	"fmt"
	"math"
	"strings"
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
		return "given by the program"
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
	// Settings name where this backend's window and redelivery policy are
	// set, for the fixes of an UnsafeRetryError. The zero value gets
	// generic names.
	Settings Settings
}

// String reads well inside an error message, for example
// "jetstream dedup window 2m (configured on the entity, discovered from the broker)".
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
	return fmt.Sprintf("%s dedup window %s (%s, %s%s)", name, FormatDuration(w.Duration), w.Kind, w.Source, scope)
}

// FormatDuration prints d for people, in days, hours, minutes and seconds
// with the zero units left out: "5m", "1h30m", "3d4h", "6m59s", "51.5s".
// A day is 24 hours. Forever prints as "forever"; durations under a second,
// and negative ones, print as time.Duration's String does ("100ms"). Every
// startup error prints its durations with it.
func FormatDuration(d time.Duration) string {
	switch {
	case d >= Forever:
		return "forever"
	case d < time.Second:
		return d.String()
	}
	var b strings.Builder
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}} {
		if n := d / u.unit; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			d -= n * u.unit
		}
	}
	if d > 0 {
		// Whole seconds, then the fraction without trailing zeros, as
		// time.Duration prints it: 59s, 1.5s, 0.25s.
		fmt.Fprintf(&b, "%d", d/time.Second)
		if frac := d % time.Second; frac > 0 {
			b.WriteString(strings.TrimRight(fmt.Sprintf(".%09d", frac), "0"))
		}
		b.WriteString("s")
	}
	return b.String()
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
