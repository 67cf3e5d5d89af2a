package window

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// RetryPolicy bounds how a publisher resends one message. Every resend
// carries the same dedup ID, so the whole span must fit inside whatever
// deduplicates it.
//
// A publisher fills the fields left unset from DefaultRetryPolicy (see
// WithDefaults), so a policy need only name what it changes:
// RetryPolicy{MaxAttempts: 3} is three attempts with the default backoff
// and attempt timeout. The methods below read a policy as it is, unfilled.
type RetryPolicy struct {
	// MaxAttempts is the number of sends including the first; 1 means no
	// retries. Zero is unset: the default's 5 once filled (read as it is,
	// a single attempt).
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt. Zero is
	// unset, and with it the whole backoff (see WithDefaults); NoBackoff
	// resends at once.
	InitialBackoff time.Duration
	// MaxBackoff caps any one wait. Zero means no cap, unless the backoff
	// is unset (InitialBackoff zero), when it is the default's.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each failed attempt; values below 1
	// are treated as 1, a constant wait. Zero is the default's when the
	// backoff is unset.
	Multiplier float64
	// Jitter in [0, 1] draws each wait from [b×(1−Jitter), b], where b is
	// the un-jittered wait. Jitter only ever shortens a wait, so the
	// worst case stays b and MaxBackoff is a true cap. Zero means none,
	// unless the backoff is unset, when it is the default's.
	Jitter float64
	// AttemptTimeout cuts each attempt short. Zero is unset for a policy
	// that retries: the default's once filled, because read as it is an
	// attempt, and so the span, is bounded only by the caller's context.
	// A single attempt keeps zero: nothing is resent, so nothing needs
	// bounding but what the caller's context bounds.
	AttemptTimeout time.Duration
}

// NoBackoff as InitialBackoff resends at once after a failed attempt. It
// exists because a zero InitialBackoff is unset and gets the default
// backoff; it is the one negative duration a RetryPolicy accepts.
const NoBackoff time.Duration = -1

// DefaultRetryPolicy is used by publishers that set no policy, and fills
// the unset fields of those that do (WithDefaults). Its span is 51.5s,
// which fits every broker window dedupq knows except Pub/Sub's (which has
// none).
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		MaxAttempts:    5,
		InitialBackoff: 100 * time.Millisecond,
		MaxBackoff:     5 * time.Second,
		Multiplier:     2,
		Jitter:         0.2,
		AttemptTimeout: 10 * time.Second,
	}
}

// WithDefaults returns p with its unset fields filled from
// DefaultRetryPolicy; dedupq.NewPublisher runs it on the policy it is
// given, before the startup check. Unset are:
//
//   - MaxAttempts zero (use 1 for no retries). A policy that does not
//     retry is returned with nothing else filled: its backoff is never
//     used, and its one attempt stays bounded by the caller's context
//     unless it sets AttemptTimeout.
//   - AttemptTimeout zero, which would leave the span unbounded.
//   - The backoff, when InitialBackoff is zero: InitialBackoff, and each
//     of Multiplier, MaxBackoff and Jitter that is zero, come from the
//     default, so {MaxAttempts: 10, MaxBackoff: time.Second} keeps the
//     default growth under its own cap. A policy that sets InitialBackoff
//     (NoBackoff included) keeps its zeros' own meanings: Multiplier 1, no
//     cap, no jitter.
//
// Before WithDefaults existed, a policy read as it is: MaxAttempts zero
// sent once, and InitialBackoff zero resent at once. Those two now mean
// the default's 5 attempts and backoff; write MaxAttempts 1 and
// InitialBackoff NoBackoff for the old meanings. Any other policy that
// could pass the startup check before keeps its meaning; one with retries
// and no AttemptTimeout, refused before as unbounded, now gets the
// default's.
//
// Invalid values (negative, NaN) are left for Validate to report, and
// filling a filled policy changes nothing.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.MaxAttempts == 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.MaxAttempts <= 1 {
		return p
	}
	if p.AttemptTimeout == 0 {
		p.AttemptTimeout = d.AttemptTimeout
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = d.InitialBackoff
		if p.Multiplier == 0 {
			p.Multiplier = d.Multiplier
		}
		if p.MaxBackoff == 0 {
			p.MaxBackoff = d.MaxBackoff
		}
		if p.Jitter == 0 {
			p.Jitter = d.Jitter
		}
	}
	return p
}

// Retries is the number of resends after the first attempt.
func (p RetryPolicy) Retries() int {
	if p.MaxAttempts <= 1 {
		return 0
	}
	return p.MaxAttempts - 1
}

// Validate reports a policy no publisher should run with.
func (p RetryPolicy) Validate() error {
	var errs []error
	if p.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("MaxAttempts %d is negative", p.MaxAttempts))
	}
	if (p.InitialBackoff < 0 && p.InitialBackoff != NoBackoff) || p.MaxBackoff < 0 || p.AttemptTimeout < 0 {
		errs = append(errs, errors.New("durations must not be negative (InitialBackoff: NoBackoff means none)"))
	}
	if math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0) {
		errs = append(errs, fmt.Errorf("Multiplier %v is not a finite number", p.Multiplier))
	}
	if !(p.Jitter >= 0 && p.Jitter <= 1) {
		errs = append(errs, fmt.Errorf("Jitter %v is outside [0, 1]", p.Jitter))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("window: invalid retry policy: %w", err)
	}
	return nil
}

// Backoff is the worst-case (un-jittered) wait after failed attempt n
// (n ≥ 1): min(MaxBackoff, InitialBackoff × Multiplier^(n−1)).
func (p RetryPolicy) Backoff(n int) time.Duration {
	if n < 1 || p.InitialBackoff <= 0 {
		return 0
	}
	m := p.Multiplier
	if !(m >= 1) || math.IsInf(m, 0) {
		m = 1
	}
	b := scaleSat(p.InitialBackoff, math.Pow(m, float64(n-1)))
	if p.MaxBackoff > 0 && b > p.MaxBackoff {
		b = p.MaxBackoff
	}
	return b
}

// Delay is the wait actually used after failed attempt n: Backoff(n)
// shortened by the fraction u×Jitter, where u in [0, 1) is a random draw.
func (p RetryPolicy) Delay(n int, u float64) time.Duration {
	b := p.Backoff(n)
	j := min(max(p.Jitter, 0), 1) * min(max(u, 0), 1)
	if !(j > 0) {
		return b
	}
	return b - scaleSat(b, j)
}

// Span is the worst-case time from the start of the first attempt to the end
// of the last: MaxAttempts × AttemptTimeout plus every un-jittered wait in
// between. It saturates at Forever instead of overflowing, and is Forever
// when retries are possible but AttemptTimeout is zero.
func (p RetryPolicy) Span() time.Duration {
	attempts := max(p.MaxAttempts, 1)
	if attempts > 1 && p.AttemptTimeout <= 0 {
		return Forever
	}
	span := mulSat(max(p.AttemptTimeout, 0), int64(attempts))
	prev := time.Duration(-1)
	for n := 1; n < attempts && span < Forever; n++ {
		b := p.Backoff(n)
		switch {
		case b == prev:
			// The waits stopped growing (capped, or Multiplier 1): the
			// rest are all equal.
			return addSat(span, mulSat(b, int64(attempts-n)))
		case n == maxExactSteps:
			// Still growing after this many steps means a Multiplier just
			// above 1 and no cap: bound the rest by the geometric sum.
			m := max(p.Multiplier, 1)
			rest := float64(attempts - n)
			return addSat(span, scaleSat(b, (math.Pow(m, rest)-1)/(m-1)))
		}
		span = addSat(span, b)
		prev = b
	}
	return span
}

// maxExactSteps bounds Span's step-by-step sum, so that absurd MaxAttempts
// cost constant time.
const maxExactSteps = 10000

// RedeliveryPolicy is how a broker redelivers a message its consumer did not
// acknowledge: JetStream's AckWait/MaxDeliver/BackOff, SQS's visibility
// timeout and maxReceiveCount, Service Bus's LockDuration and
// MaxDeliveryCount, Pub/Sub's ack deadline and MaxDeliveryAttempts.
type RedeliveryPolicy struct {
	// MaxDeliveries is how many times a message is delivered before it is
	// dead-lettered or dropped. Zero or negative means unlimited.
	MaxDeliveries int
	// AckWait is the lease on one delivery (ack wait, visibility timeout,
	// lock duration, ack deadline) before the broker redelivers it.
	AckWait time.Duration
	// Backoff holds the waits before the 2nd, 3rd, … delivery after a
	// negative acknowledgement; the last entry repeats. Empty means the
	// message is redelivered at once.
	Backoff []time.Duration
	// Expiry, when positive, is the latest a delivery of a message can
	// start after its first delivery, whatever the broker counts: a
	// broker that counts deliveries only on a best-effort basis bounds
	// them by expiring the message instead (Pub/Sub's message retention,
	// counted from publication). Such a broker reports MaxDeliveries as
	// unlimited, because its count is no bound. The last delivery may
	// still claim its key for one AckWait after it started, so Span is at
	// most Expiry plus AckWait. Zero means no expiry.
	Expiry time.Duration
	// ExpirySource says where Expiry came from: read from the broker,
	// its documented default, or given by the program.
	ExpirySource Source
}

// Unlimited reports whether the broker's count of deliveries is no bound:
// it redelivers until the message expires (Expiry), or forever.
func (r RedeliveryPolicy) Unlimited() bool { return r.MaxDeliveries <= 0 }

// Expires reports whether Expiry bounds the policy's span.
func (r RedeliveryPolicy) Expires() bool { return r.Expiry > 0 }

// expirySpan is the span Expiry allows: the last delivery starts before
// it and holds its lease for one AckWait.
func (r RedeliveryPolicy) expirySpan() time.Duration {
	return addSat(r.Expiry, max(r.AckWait, 0))
}

// BackoffBefore is the wait before delivery n (n ≥ 2).
func (r RedeliveryPolicy) BackoffBefore(n int) time.Duration {
	if n < 2 || len(r.Backoff) == 0 {
		return 0
	}
	return max(r.Backoff[min(n-2, len(r.Backoff)-1)], 0)
}

// Span is the worst-case time from the first delivery to the end of the
// last: every delivery held for its whole AckWait, plus every backoff, or,
// when the message expires sooner (Expiry), the expiry plus one AckWait.
// It is Forever for unlimited redeliveries that never expire.
func (r RedeliveryPolicy) Span() time.Duration {
	span := Forever
	if !r.Unlimited() {
		span = mulSat(max(r.AckWait, 0), int64(r.MaxDeliveries))
		for n := 2; n <= r.MaxDeliveries && span < Forever; n++ {
			span = addSat(span, r.BackoffBefore(n))
		}
	}
	if r.Expires() {
		span = min(span, r.expirySpan())
	}
	return span
}

// expiryBinds reports whether Span is the expiry's bound rather than the
// count's.
func (r RedeliveryPolicy) expiryBinds() bool {
	if !r.Expires() {
		return false
	}
	q := r
	q.Expiry = 0
	return r.expirySpan() < q.Span()
}

// String implements fmt.Stringer, in the same shape as RetryPolicy's:
// how many, the waits between them, how long each may take, and the
// worst-case span, e.g. "3 deliveries, backoff 1s then 5s, ack wait 30s
// per delivery (worst-case span 1m36s)".
func (r RedeliveryPolicy) String() string {
	var b strings.Builder
	switch {
	case r.Unlimited() && r.Expires():
		b.WriteString("deliveries bounded only by the message's expiry")
	case r.Unlimited():
		b.WriteString("unlimited deliveries")
	case r.MaxDeliveries == 1:
		b.WriteString("1 delivery (no redelivery)")
	default:
		fmt.Fprintf(&b, "%d deliveries", r.MaxDeliveries)
	}
	if r.MaxDeliveries != 1 {
		if len(r.Backoff) == 0 {
			b.WriteString(", no backoff")
		} else {
			b.WriteString(", backoff ")
			for i, w := range r.Backoff {
				if i > 0 {
					b.WriteString(" then ")
				}
				b.WriteString(FormatDuration(max(w, 0)))
			}
		}
	}
	fmt.Fprintf(&b, ", ack wait %s per delivery", FormatDuration(r.AckWait))
	if r.Expires() {
		fmt.Fprintf(&b, ", none started later than %s after the first (message expiry, %s)", FormatDuration(r.Expiry), r.ExpirySource)
	}
	fmt.Fprintf(&b, " (worst-case span %s)", FormatDuration(r.Span()))
	return b.String()
}

// String implements fmt.Stringer for logs: the attempts, the backoff
// (initial wait, growth, cap), the jitter, the attempt timeout and the
// worst-case span, e.g. the default's "5 attempts, backoff 100ms×2 up to
// 5s, jitter 20%, 10s per attempt (worst-case span 51.5s)". It describes
// the policy as it is; call WithDefaults first to see what a publisher
// runs.
func (p RetryPolicy) String() string {
	if p.Validate() != nil {
		type fields RetryPolicy // without String, so %+v prints the fields
		return fmt.Sprintf("invalid retry policy %+v", fields(p))
	}
	var b strings.Builder
	if p.Retries() == 0 {
		b.WriteString("1 attempt (no retries)")
		if p.AttemptTimeout > 0 {
			fmt.Fprintf(&b, ", %s per attempt", FormatDuration(p.AttemptTimeout))
		}
		return b.String()
	}
	fmt.Fprintf(&b, "%d attempts, ", p.MaxAttempts)
	if p.InitialBackoff <= 0 {
		b.WriteString("no backoff")
	} else {
		m := p.Multiplier
		if !(m >= 1) {
			m = 1
		}
		switch {
		case m == 1 || p.MaxBackoff > 0 && p.MaxBackoff <= p.InitialBackoff:
			fmt.Fprintf(&b, "backoff %s", FormatDuration(p.Backoff(1))) // every wait the same
		case p.MaxBackoff > 0:
			fmt.Fprintf(&b, "backoff %s×%s up to %s", FormatDuration(p.InitialBackoff), strconv.FormatFloat(m, 'g', -1, 64), FormatDuration(p.MaxBackoff))
		default:
			fmt.Fprintf(&b, "backoff %s×%s uncapped", FormatDuration(p.InitialBackoff), strconv.FormatFloat(m, 'g', -1, 64))
		}
		if p.Jitter > 0 {
			fmt.Fprintf(&b, ", jitter %s%%", strconv.FormatFloat(math.Round(p.Jitter*1e4)/1e2, 'f', -1, 64))
		}
	}
	if p.AttemptTimeout > 0 {
		fmt.Fprintf(&b, ", %s per attempt", FormatDuration(p.AttemptTimeout))
	} else {
		b.WriteString(", no attempt timeout")
	}
	fmt.Fprintf(&b, " (worst-case span %s)", FormatDuration(p.Span()))
	return b.String()
}
