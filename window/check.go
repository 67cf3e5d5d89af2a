package window

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultMargin is the share of a window or TTL kept free by the startup
// check, for clock skew between hosts and broker-side delays that no policy
// sees. See the package doc for where it applies.
const DefaultMargin = 0.2

// ErrUnsafeRetry matches every *UnsafeRetryError with errors.Is.
var ErrUnsafeRetry = errors.New("retry span exceeds the window that protects it")

// PublisherPlan is what CheckPublisher compares.
type PublisherPlan struct {
	// Retry is the publisher's own retry policy.
	Retry RetryPolicy
	// HiddenSpan is extra worst-case time spent by retries the backend's
	// SDK makes inside one attempt beyond AttemptTimeout; usually zero,
	// because AttemptTimeout already bounds them.
	HiddenSpan time.Duration
	// Window is the broker window that protects the publisher.
	Window Window
	// DedupTTL declares consumer-side dedup that remembers keys this long.
	// A span that does not fit the broker window must then fit this TTL;
	// the consumers' own check asks their TTL to cover the span plus their
	// redelivery span.
	DedupTTL time.Duration
	// Margin is the share of the window or TTL kept free: 0 means
	// DefaultMargin, a negative value means none.
	Margin float64
}

// ConsumerPlan is what CheckConsumer compares.
type ConsumerPlan struct {
	// Redelivery is the broker's redelivery policy for the consumer.
	Redelivery RedeliveryPolicy
	// Window is the broker window on the publish side.
	Window Window
	// DedupTTL is how long the consumer's dedup store remembers a
	// completed key. Zero means no dedup store: nothing to check.
	DedupTTL time.Duration
	// PublisherSpan is the publishers' declared worst-case retry span. When
	// it does not fit the broker window less the margin, the store must
	// cover all of it on top of the redelivery span, not only the part
	// beyond the window: the first copy's key may be recorded right after
	// the first send, and the last resend may arrive a whole span later.
	PublisherSpan time.Duration
	// Margin is as in PublisherPlan.
	Margin float64
}

func margin(m float64) float64 {
	switch {
	case m == 0:
		return DefaultMargin
	case m < 0 || m != m:
		return 0
	case m >= 1:
		return 0.99
	}
	return m
}

// usable is the part of d that the check lets a span use.
func usable(d time.Duration, m float64) time.Duration { return scaleSat(d, 1-m) }

// needed is the smallest window or TTL whose usable part covers span,
// rounded up to a whole second so that it reads well in a fix.
func needed(span time.Duration, m float64) time.Duration {
	if span >= Forever {
		return Forever
	}
	d := scaleSat(span, 1/(1-m))
	if r := d.Round(time.Second); r < d {
		d = r + time.Second
	} else {
		d = r
	}
	return d
}

// UnsafeRetryError says a retry or redelivery span does not fit the window
// or TTL that protects it, and how to fix that.
type UnsafeRetryError struct {
	// Side is "publisher" or "consumer".
	Side string
	// Span is the worst-case span of the policy that was checked.
	Span time.Duration
	// Window is the broker window.
	Window Window
	// ProtectedBy names what the span was compared with: "the broker
	// window" or "the dedup store TTL".
	ProtectedBy string
	// Limit is the duration compared with, before the margin.
	Limit time.Duration
	// Margin is the share of Limit kept free.
	Margin float64
	// Fixes lists concrete changes, any one of which makes the check pass.
	Fixes []string
}

// Error implements the error interface.
func (e *UnsafeRetryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dedupq: unsafe %s retry policy: worst-case span %s", e.Side, fmtDur(e.Span))
	if e.Limit <= 0 {
		fmt.Fprintf(&b, " has nothing to protect it: %s and no consumer-side dedup was declared", e.Window)
	} else {
		fmt.Fprintf(&b, " exceeds %s %s less a %.0f%% safety margin = %s (%s)",
			e.ProtectedBy, fmtDur(e.Limit), e.Margin*100, fmtDur(usable(e.Limit, e.Margin)), e.Window)
	}
	if len(e.Fixes) > 0 {
		b.WriteString("; fix: ")
		b.WriteString(strings.Join(e.Fixes, ", or "))
	}
	return b.String()
}

// Is makes errors.Is(err, ErrUnsafeRetry) true.
func (e *UnsafeRetryError) Is(target error) bool { return target == ErrUnsafeRetry }

func fmtDur(d time.Duration) string {
	if d >= Forever {
		return "unbounded"
	}
	return d.String()
}

// CheckPublisher returns nil when no resend the plan allows can be stored as
// a second copy (the span fits the broker window), or, with consumer-side
// dedup declared, when the span fits that TTL; see the package doc for the
// model. A span that fits the window is accepted whatever DedupTTL says. A
// policy without retries is always safe. Passing here with DedupTTL is
// necessary, not sufficient: the consumers' TTL must also cover their
// redelivery span, which CheckConsumer checks.
func CheckPublisher(p PublisherPlan) error {
	if err := p.Retry.Validate(); err != nil {
		return err
	}
	if p.Retry.Retries() == 0 && p.HiddenSpan == 0 {
		return nil
	}
	m := margin(p.Margin)
	span := addSat(p.Retry.Span(), max(p.HiddenSpan, 0))
	if fitsWindow(span, p.Window, m) {
		return nil
	}
	limit, by := p.Window.Duration, "the broker window"
	if !p.Window.Protects() {
		limit = 0
	}
	budget := usable(limit, m)
	if p.DedupTTL > 0 {
		if span <= usable(p.DedupTTL, m) {
			return nil
		}
		limit, by = p.DedupTTL, "the dedup store TTL"
		budget = max(budget, usable(p.DedupTTL, m))
	}
	return &UnsafeRetryError{
		Side: "publisher", Span: span, Window: p.Window, ProtectedBy: by,
		Limit: limit, Margin: m, Fixes: publisherFixes(p, budget, m),
	}
}

// fitsWindow reports whether every resend of a span lands inside the
// broker window less the margin, so that the broker drops it and no second
// copy is ever stored. Both checks decide this with the same test.
func fitsWindow(span time.Duration, w Window, m float64) bool {
	return span <= 0 || (w.Protects() && span <= usable(w.Duration, m))
}

func publisherFixes(p PublisherPlan, budget time.Duration, m float64) []string {
	var fixes []string
	r := p.Retry
	fits := func(q RetryPolicy) bool { return addSat(q.Span(), max(p.HiddenSpan, 0)) <= budget }
	if budget > 0 {
		if n := maxAttemptsFitting(r, fits); n >= 2 {
			fixes = append(fixes, fmt.Sprintf("lower MaxAttempts to %d", n))
		}
		if r.AttemptTimeout <= 0 {
			fixes = append(fixes, "set AttemptTimeout (without it an attempt, and so the span, is unbounded)")
		} else {
			if b, ok := largestFitting(r.MaxBackoff, r.Span(), func(b time.Duration) bool { q := r; q.MaxBackoff = max(b, 1); return fits(q) }); ok && b > 0 {
				fixes = append(fixes, fmt.Sprintf("MaxBackoff to %s", b))
			}
			if t, ok := largestFitting(0, r.AttemptTimeout, func(t time.Duration) bool { q := r; q.AttemptTimeout = t; return fits(q) }); ok && t > 0 {
				fixes = append(fixes, fmt.Sprintf("AttemptTimeout to %s", t))
			}
		}
	} else {
		fixes = append(fixes, "set MaxAttempts to 1 (no retries)")
	}
	span := addSat(r.Span(), max(p.HiddenSpan, 0))
	if span < Forever {
		fixes = append(fixes, fmt.Sprintf("declare consumer-side dedup with TTL ≥ %s + the consumers' redelivery span", needed(span, m)))
	}
	return fixes
}

// maxAttemptsFitting is the largest MaxAttempts whose policy fits, or 1.
func maxAttemptsFitting(r RetryPolicy, fits func(RetryPolicy) bool) int {
	best := 1
	for n := 2; n < r.MaxAttempts; n++ {
		q := r
		q.MaxAttempts = n
		if !fits(q) {
			break
		}
		best = n
	}
	return best
}

// largestFitting binary-searches the largest d in [0, hi] with fits(d),
// where fits is monotone (true, then false). hi of zero means "search up to
// ceiling". The result is truncated to a readable unit.
func largestFitting(hi, ceiling time.Duration, fits func(time.Duration) bool) (time.Duration, bool) {
	if hi <= 0 {
		hi = ceiling
	}
	if hi <= 0 || hi >= Forever || !fits(0) {
		return 0, false
	}
	lo := time.Duration(0)
	for hi-lo > time.Millisecond {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo >= time.Second {
		lo = lo.Truncate(time.Second)
	} else {
		lo = lo.Truncate(time.Millisecond)
	}
	return lo, true
}

// CheckConsumer returns nil when the consumer's dedup store remembers a
// completed key until the last delivery that may claim it: the broker's
// redelivery span R, plus the whole PublisherSpan P when P does not fit the
// broker window (a second copy may then be stored as late as P after the
// first send, whose completion may be recorded right after that send). See
// the package doc for the model. Without a store (DedupTTL zero) there is
// nothing to check.
func CheckConsumer(p ConsumerPlan) error {
	if p.DedupTTL <= 0 {
		return nil
	}
	m := margin(p.Margin)
	beyond := time.Duration(0)
	if !fitsWindow(p.PublisherSpan, p.Window, m) {
		beyond = p.PublisherSpan
	}
	if beyond == 0 && p.Redelivery.MaxDeliveries == 1 {
		// One copy, delivered once: its only claim comes before anything
		// completes, so no TTL is too short.
		return nil
	}
	span := addSat(p.Redelivery.Span(), beyond)
	if span <= usable(p.DedupTTL, m) {
		return nil
	}
	var fixes []string
	if p.Redelivery.Unlimited() {
		fixes = append(fixes, "bound redeliveries (MaxDeliveries / MaxDeliver / maxReceiveCount / MaxDeliveryCount)")
	} else {
		budget := usable(p.DedupTTL, m) - beyond
		if budget > 0 {
			n := 0
			for k := 1; k < p.Redelivery.MaxDeliveries; k++ {
				q := p.Redelivery
				q.MaxDeliveries = k
				if q.Span() > budget {
					break
				}
				n = k
			}
			if n >= 1 {
				fixes = append(fixes, fmt.Sprintf("lower MaxDeliveries to %d", n))
			}
		}
		fixes = append(fixes, fmt.Sprintf("raise the dedup store TTL to ≥ %s", needed(span, m)))
		if beyond > 0 && p.Window.Protects() && p.Redelivery.Span() <= usable(p.DedupTTL, m) {
			fixes = append(fixes, fmt.Sprintf("keep the publishers' retry span (PublisherSpan) within %s, the broker window less the margin", usable(p.Window.Duration, m)))
		}
	}
	return &UnsafeRetryError{
		Side: "consumer", Span: span, Window: p.Window, ProtectedBy: "the dedup store TTL",
		Limit: p.DedupTTL, Margin: m, Fixes: fixes,
	}
}
