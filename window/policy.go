package window

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// RetryPolicy bounds how a publisher resends one message. Every resend
// carries the same dedup ID, so the whole span must fit inside whatever
// deduplicates it.
type RetryPolicy struct {
	// MaxAttempts is the number of sends including the first. Zero or one
	// means no retries.
	MaxAttempts int
	// InitialBackoff is the wait after the first failed attempt.
	InitialBackoff time.Duration
	// MaxBackoff caps any one wait. Zero means no cap.
	MaxBackoff time.Duration
	// Multiplier grows the wait after each failed attempt; values below 1
	// are treated as 1.
	Multiplier float64
	// Jitter in [0, 1] draws each wait from [b×(1−Jitter), b], where b is
	// the un-jittered wait. Jitter only ever shortens a wait, so the
	// worst case stays b and MaxBackoff is a true cap.
	Jitter float64
	// AttemptTimeout cuts each attempt short. Zero means an attempt is
	// bounded only by the caller's context, which makes the worst-case span
	// unbounded once there is more than one attempt.
	AttemptTimeout time.Duration
}

// DefaultRetryPolicy is used by publishers that set no policy. Its span is
// 51.5s, which fits every broker window dedupq knows except Pub/Sub's
// (which has none).
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
	if p.InitialBackoff < 0 || p.MaxBackoff < 0 || p.AttemptTimeout < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
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
}

// Unlimited reports whether the broker redelivers forever.
func (r RedeliveryPolicy) Unlimited() bool { return r.MaxDeliveries <= 0 }

// BackoffBefore is the wait before delivery n (n ≥ 2).
func (r RedeliveryPolicy) BackoffBefore(n int) time.Duration {
	if n < 2 || len(r.Backoff) == 0 {
		return 0
	}
	return max(r.Backoff[min(n-2, len(r.Backoff)-1)], 0)
}

// Span is the worst-case time from the first delivery to the end of the
// last: every delivery held for its whole AckWait, plus every backoff. It is
// Forever for unlimited redeliveries.
func (r RedeliveryPolicy) Span() time.Duration {
	if r.Unlimited() {
		return Forever
	}
	span := mulSat(max(r.AckWait, 0), int64(r.MaxDeliveries))
	for n := 2; n <= r.MaxDeliveries && span < Forever; n++ {
		span = addSat(span, r.BackoffBefore(n))
	}
	return span
}

// String implements fmt.Stringer.
func (r RedeliveryPolicy) String() string {
	if r.Unlimited() {
		return fmt.Sprintf("unlimited deliveries, ack wait %s", r.AckWait)
	}
	return fmt.Sprintf("%d deliveries, ack wait %s, backoff %v", r.MaxDeliveries, r.AckWait, r.Backoff)
}
