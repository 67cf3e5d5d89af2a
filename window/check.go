package window

import (
	"errors"
	"fmt"
	"slices"
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
	// Ordered says the consumer runs the messages of one group in order
	// (dedupq.ConsumerOptions.Ordered): a second copy of a message then
	// waits behind every message of its group stored before it, each of
	// which may hold the group for its whole redelivery span.
	Ordered bool
	// GroupBacklog bounds, for an ordered consumer, how many messages of
	// one group can be stored between two copies of one message: those
	// published to the group within PublisherSpan, the message's own
	// copies beyond the second included. It matters only when
	// the publishers' span does not fit the window (a resend is then a
	// second copy); zero there means no bound was declared, and no TTL
	// covers the plan.
	GroupBacklog int
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

// UsableTTL is the part of a dedup TTL the consumer's check lets a span
// use, under a plan's Margin (0: DefaultMargin; negative: none): a plan
// passes when its Span is at most this.
func UsableTTL(ttl time.Duration, m float64) time.Duration {
	return usable(ttl, margin(m))
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

// The names of the portable layer's settings (package dedupq and the
// dedup stores), for the fixes: they are the same on every backend.
const (
	optMaxAttempts      = "PublisherOptions.Retry.MaxAttempts"
	optMaxBackoff       = "PublisherOptions.Retry.MaxBackoff"
	optAttemptTimeout   = "PublisherOptions.Retry.AttemptTimeout"
	optConsumerDedupTTL = "PublisherOptions.ConsumerDedupTTL"
	optPublisherSpan    = "ConsumerOptions.PublisherSpan"
	optGroupBacklog     = "ConsumerOptions.GroupBacklog"
	optDedupTTL         = "the TTL of ConsumerOptions.Dedup"
	optDedupTTLFields   = optDedupTTL + " (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL)"
)

// What an UnsafeRetryError's span was compared with (ProtectedBy).
const (
	byWindow      = "the broker window"
	byDeclaredTTL = "the declared consumer dedup TTL"
	byStoreTTL    = "the dedup store TTL"
)

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
	// window", "the declared consumer dedup TTL" (a publisher's
	// ConsumerDedupTTL) or "the dedup store TTL" (a consumer's).
	ProtectedBy string
	// Limit is the duration compared with, before the margin.
	Limit time.Duration
	// Margin is the share of Limit kept free.
	Margin float64
	// Fixes lists concrete changes, any one of which makes the check
	// pass, each naming the setting to change on this backend (see
	// Settings); the ones that give up the most come last.
	Fixes []string

	// note says what Limit is and what makes up Span, for Error; empty
	// means the window.
	note string
}

// Error implements the error interface.
func (e *UnsafeRetryError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dedupq: unsafe %s retry policy: worst-case span %s", e.Side, FormatDuration(e.Span))
	note := e.note
	if note == "" {
		note = e.Window.String()
	}
	if e.Limit <= 0 {
		fmt.Fprintf(&b, " has nothing to protect it: %s and no consumer-side dedup was declared (%s)", e.Window, optConsumerDedupTTL)
	} else {
		fmt.Fprintf(&b, " exceeds %s %s less a %.0f%% safety margin = %s (%s)",
			e.ProtectedBy, FormatDuration(e.Limit), e.Margin*100, FormatDuration(usable(e.Limit, e.Margin)), note)
	}
	if len(e.Fixes) > 0 {
		b.WriteString("; fix: ")
		b.WriteString(strings.Join(e.Fixes, ", or "))
	}
	return b.String()
}

// Is makes errors.Is(err, ErrUnsafeRetry) true.
func (e *UnsafeRetryError) Is(target error) bool { return target == ErrUnsafeRetry }

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
	limit, by, note := p.Window.Duration, byWindow, ""
	if !p.Window.Protects() {
		limit = 0
	}
	budget := usable(limit, m)
	if p.DedupTTL > 0 {
		if span <= usable(p.DedupTTL, m) {
			return nil
		}
		limit, by = p.DedupTTL, byDeclaredTTL
		budget = max(budget, usable(p.DedupTTL, m))
		if p.Window.Protects() {
			note = fmt.Sprintf("%s; the span does not fit the %s either", optConsumerDedupTTL, p.Window)
		} else {
			note = fmt.Sprintf("%s; %s", optConsumerDedupTTL, p.Window)
		}
	}
	return &UnsafeRetryError{
		Side: "publisher", Span: span, Window: p.Window, ProtectedBy: by,
		Limit: limit, Margin: m, Fixes: publisherFixes(p, budget, m), note: note,
	}
}

// fitsWindow reports whether every resend of a span lands inside the
// broker window less the margin, so that the broker drops it and no second
// copy is ever stored. Both checks decide this with the same test.
func fitsWindow(span time.Duration, w Window, m float64) bool {
	return span <= 0 || (w.Protects() && span <= usable(w.Duration, m))
}

// publisherFixes lists changes any one of which makes p pass: the retry
// policy fitted to budget (the usable part of the window or of the
// declared TTL, whichever is longer), a longer window where the backend
// lets one be set, a consumer dedup TTL that covers the span, and last no
// retries at all.
func publisherFixes(p PublisherPlan, budget time.Duration, m float64) []string {
	r, hidden := p.Retry, max(p.HiddenSpan, 0)
	fits := func(q RetryPolicy) bool { return addSat(q.Span(), hidden) <= budget }
	var fixes []string
	n := 1
	if budget > 0 {
		if n = maxAttemptsFitting(r, fits); n >= 2 {
			fixes = append(fixes, fmt.Sprintf("lower %s from %d to %d", optMaxAttempts, r.MaxAttempts, n))
		}
		if r.AttemptTimeout <= 0 {
			fixes = append(fixes, fmt.Sprintf("set %s (without it an attempt, and so the span, is unbounded)", optAttemptTimeout))
		} else {
			if b, ok := largestFitting(r.MaxBackoff, r.Span(), func(b time.Duration) bool { q := r; q.MaxBackoff = max(b, 1); return fits(q) }); ok && b > 0 {
				fixes = append(fixes, fmt.Sprintf("cap %s at %s", optMaxBackoff, FormatDuration(b)))
			}
			if t, ok := largestFitting(0, r.AttemptTimeout, func(t time.Duration) bool { q := r; q.AttemptTimeout = max(t, 1); return fits(q) }); ok && t > 0 {
				fixes = append(fixes, fmt.Sprintf("lower %s from %s to %s", optAttemptTimeout, FormatDuration(r.AttemptTimeout), FormatDuration(t)))
			}
		}
	}
	if span := addSat(r.Span(), hidden); span < Forever {
		need := needed(span, m)
		if f := windowFix(p.Window, need); f != "" {
			fixes = append(fixes, f)
		}
		consumers := fmt.Sprintf("and %s to %s on the consumers, whose TTL must also cover their redelivery span", optPublisherSpan, FormatDuration(span))
		if p.DedupTTL > 0 {
			fixes = append(fixes, fmt.Sprintf("raise %s from %s to ≥ %s, %s", optConsumerDedupTTL, FormatDuration(p.DedupTTL), FormatDuration(need), consumers))
		} else {
			fixes = append(fixes, fmt.Sprintf("declare consumer-side dedup: set %s to ≥ %s, %s", optConsumerDedupTTL, FormatDuration(need), consumers))
		}
	}
	if n < 2 { // no smaller number of attempts fits: none at all, last
		one := r
		one.MaxAttempts = 1
		if hidden == 0 || fits(one) {
			fixes = append(fixes, fmt.Sprintf("set %s to 1 (no retries)", optMaxAttempts))
		}
	}
	return fixes
}

// windowFix is the fix that makes w at least need long, or "" when no
// setting can (see windowSetting).
func windowFix(w Window, need time.Duration) string {
	name := windowSetting(w)
	switch {
	case name == "" || need >= Forever:
		return ""
	case w.Protects():
		return fmt.Sprintf("raise %s from %s to ≥ %s", name, FormatDuration(w.Duration), FormatDuration(need))
	}
	return fmt.Sprintf("set %s to ≥ %s", name, FormatDuration(need))
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
	unit := time.Millisecond
	if lo >= time.Second {
		unit = time.Second
	}
	// The search stops within a millisecond below the bound: a bound of
	// whole units (16s) must not read as the unit below it (15s).
	if up := lo.Truncate(unit) + unit; fits(up) {
		return up, true
	}
	return lo.Truncate(unit), true
}

// CheckConsumer returns nil when the consumer's dedup store remembers a
// completed key until the last delivery that may claim it: the broker's
// redelivery span R, plus the whole PublisherSpan P when P does not fit the
// broker window (a second copy may then be stored as late as P after the
// first send, whose completion may be recorded right after that send). See
// the package doc for the model. Without a store (DedupTTL zero) there is
// nothing to check.
func CheckConsumer(p ConsumerPlan) error {
	m := margin(p.Margin)
	ok, span, beyond := consumerFits(p, m)
	if ok {
		return nil
	}
	note := optDedupTTL + "; redelivery: " + p.Redelivery.String()
	switch {
	case beyond > 0 && p.Window.Protects():
		note += fmt.Sprintf(", plus the publishers' whole retry span %s (%s), which does not fit the %s less the margin",
			FormatDuration(beyond), optPublisherSpan, p.Window)
	case beyond > 0:
		note += fmt.Sprintf(", plus the publishers' whole retry span %s (%s): %s", FormatDuration(beyond), optPublisherSpan, p.Window)
	}
	if p.Ordered && beyond > 0 {
		if p.GroupBacklog > 0 {
			note += fmt.Sprintf("; ordered: a resent copy waits behind up to %d message(s) of its group (%s) and the first copy, each holding the group for up to the redelivery span",
				p.GroupBacklog, optGroupBacklog)
		} else {
			note += fmt.Sprintf("; ordered: a resent copy waits behind the messages of its group stored before it, and %s declares no bound on them", optGroupBacklog)
		}
	}
	return &UnsafeRetryError{
		Side: "consumer", Span: span, Window: p.Window, ProtectedBy: byStoreTTL,
		Limit: p.DedupTTL, Margin: m, Fixes: consumerFixes(p, span, beyond, m), note: note,
	}
}

// consumerFits is CheckConsumer's rule: whether p passes, and the span its
// TTL must cover with the publishers' part of it.
func consumerFits(p ConsumerPlan, m float64) (ok bool, span, beyond time.Duration) {
	if p.DedupTTL <= 0 {
		return true, 0, 0
	}
	span, beyond = consumerSpan(p, m)
	return span <= usable(p.DedupTTL, m), span, beyond
}

// consumerSpan is the span CheckConsumer asks the TTL to cover, with the
// publishers' part of it.
func consumerSpan(p ConsumerPlan, m float64) (span, beyond time.Duration) {
	if !fitsWindow(p.PublisherSpan, p.Window, m) {
		beyond = p.PublisherSpan
	}
	if beyond == 0 && p.Redelivery.MaxDeliveries == 1 {
		// One copy, delivered once: its only claim comes before anything
		// completes, so no TTL is too short.
		return 0, 0
	}
	r := p.Redelivery.Span()
	if p.Ordered && beyond > 0 {
		// The second copy's first delivery waits until the first copy and
		// the GroupBacklog messages between them have each held the group
		// for up to R, and cannot come before it is stored, P after t0.
		if p.GroupBacklog <= 0 {
			return Forever, beyond
		}
		return addSat(mulSat(r, int64(p.GroupBacklog)+1), max(beyond, r)), beyond
	}
	return addSat(r, beyond), beyond
}

// ClaimDeadline is the latest moment a delivery received at received,
// with a lease of lease (zero for none), may still try to claim its
// message's key in the model the check states (the package doc), when
// its consumer keeps it after a try failed without a claim (held while a
// dependency is down). It is the earliest of:
//
//   - the end of its ack wait: a claim after it can come later after the
//     copy's first delivery than the redelivery span the TTL was checked
//     against, and find the first completion expired;
//   - half its lease, when the consumer's first renewal of it is due: a
//     lease renewed while the key is not claimed lets the delivery, if it
//     then finds the key completed and its ack is lost, come back a whole
//     lease after the renewal, later than the span counts;
//   - with a dedup store, the TTL less the margin: a try again of a
//     delivery whose completion was recorded but not reported (a
//     transaction committed, its answer lost) must still find the record,
//     which matters where the TTL is shorter than the ack wait (a single
//     delivery, which the check lets use any TTL).
//
// A non-positive AckWait allows no claim after the receipt.
func (p ConsumerPlan) ClaimDeadline(received time.Time, lease time.Duration) time.Time {
	d := max(p.Redelivery.AckWait, 0)
	if lease > 0 {
		d = min(d, lease/2)
	}
	if p.DedupTTL > 0 {
		d = min(d, usable(p.DedupTTL, margin(p.Margin)))
	}
	return received.Add(d)
}

// Span is the worst-case span CheckConsumer asks DedupTTL to cover, less
// the margin, whatever DedupTTL is: the redelivery span, plus the whole
// PublisherSpan when that does not fit the window less the margin (for an
// ordered plan then the head-of-line term of the package doc instead,
// Forever without a GroupBacklog); zero for one copy delivered once, which
// no TTL is too short for. The
// consumer reports it as the gauge dedupq.worst_case_span.
func (p ConsumerPlan) Span() time.Duration {
	span, _ := consumerSpan(p, margin(p.Margin))
	return span
}

// maxSuggestedDeliveries bounds the deliveries a fix suggests for a
// broker that redelivers without limit.
const maxSuggestedDeliveries = 1000

// maxSuggestedBacklog bounds the group backlog a fix suggests.
const maxSuggestedBacklog = 1 << 20

// consumerFixes lists changes any one of which makes p pass, each
// computed by consumerFits: a longer TTL, fewer deliveries, a shorter ack
// wait or backoff, a publisher span that fits the window or a window that
// fits it, and last a single delivery.
func consumerFixes(p ConsumerPlan, span, beyond time.Duration, m float64) []string {
	s, r := p.Window.Settings, p.Redelivery
	passes := func(change func(*ConsumerPlan)) bool {
		q := p
		q.Redelivery.Backoff = slices.Clone(r.Backoff)
		change(&q)
		ok, _, _ := consumerFits(q, m)
		return ok
	}
	var fixes []string
	if span < Forever {
		fixes = append(fixes, fmt.Sprintf("raise %s from %s to ≥ %s", optDedupTTLFields, FormatDuration(p.DedupTTL), FormatDuration(needed(span, m))))
	}
	if r.Expires() {
		if e, ok := largestFitting(r.Expiry, 0, func(e time.Duration) bool {
			return passes(func(q *ConsumerPlan) { q.Redelivery.Expiry = max(e, 1) })
		}); ok && e > 0 && e >= s.MinExpiry && s.Expiry != "" && r.expiryBinds() {
			fixes = append(fixes, fmt.Sprintf("lower %s from %s to %s", s.Expiry, FormatDuration(r.Expiry), FormatDuration(e)))
		}
	}
	hi := r.MaxDeliveries - 1
	if r.Unlimited() {
		hi = maxSuggestedDeliveries
	}
	n := largestCount(hi, func(k int) bool { return passes(func(q *ConsumerPlan) { q.Redelivery.MaxDeliveries = k }) })
	if r.Unlimited() && r.Expires() {
		// The broker's count is no bound (that is why it reports none):
		// no number of deliveries is a fix.
		n = -1
	}
	single := ""
	switch {
	case n == 1:
		single = fmt.Sprintf("set %s to 1, which means no redelivery at all: a message whose first delivery fails is not retried", s.maxDeliveries())
	case n >= 2 && r.Unlimited():
		fixes = append(fixes, fmt.Sprintf("set %s to at most %d (deliveries are unlimited now)", s.maxDeliveries(), n))
	case n >= 2:
		fixes = append(fixes, fmt.Sprintf("lower %s from %d to %d", s.maxDeliveries(), r.MaxDeliveries, n))
	case r.Unlimited() && !r.Expires():
		fixes = append(fixes, fmt.Sprintf("bound %s (deliveries are unlimited now), and raise %s to cover them", s.maxDeliveries(), optDedupTTLFields))
	}
	if !r.Unlimited() {
		if a, ok := largestFitting(r.AckWait, 0, func(a time.Duration) bool {
			return passes(func(q *ConsumerPlan) { q.Redelivery.AckWait = a })
		}); ok && a > 0 {
			fixes = append(fixes, fmt.Sprintf("lower %s from %s to %s", s.ackWait(), FormatDuration(r.AckWait), FormatDuration(a)))
		}
		if s.Backoff != "" && len(r.Backoff) > 0 {
			if c, ok := largestFitting(slices.Max(r.Backoff), 0, func(c time.Duration) bool {
				return passes(func(q *ConsumerPlan) { capBackoff(q.Redelivery.Backoff, c) })
			}); ok && c > 0 {
				fixes = append(fixes, fmt.Sprintf("cap %s at %s", s.Backoff, FormatDuration(c)))
			}
		}
	}
	if beyond > 0 {
		if w := p.Window; w.Protects() && passes(func(q *ConsumerPlan) { q.PublisherSpan = usable(w.Duration, m) }) {
			fixes = append(fixes, fmt.Sprintf("keep the publishers' retry span within %s, the broker window less the margin (%s is %s now)",
				FormatDuration(usable(w.Duration, m)), optPublisherSpan, FormatDuration(beyond)))
		}
		need := needed(beyond, m)
		if passes(func(q *ConsumerPlan) { q.Window.Duration, q.Window.Kind = need, KindConfigured }) {
			if f := windowFix(p.Window, need); f != "" {
				fixes = append(fixes, f)
			}
		}
	}
	if p.Ordered && beyond > 0 {
		k := largestCount(maxSuggestedBacklog, func(k int) bool { return passes(func(q *ConsumerPlan) { q.GroupBacklog = k }) })
		switch {
		case k > 0 && p.GroupBacklog <= 0:
			fixes = append(fixes, fmt.Sprintf("set %s to at most %d: the most messages published to one group within %s (none is declared now)", optGroupBacklog, k, optPublisherSpan))
		case k > 0:
			fixes = append(fixes, fmt.Sprintf("lower %s from %d to %d (fewer messages published to one group within %s)", optGroupBacklog, p.GroupBacklog, k, optPublisherSpan))
		case p.GroupBacklog <= 0:
			fixes = append(fixes, fmt.Sprintf("declare %s, the most messages published to one group within %s, and raise %s to cover it", optGroupBacklog, optPublisherSpan, optDedupTTLFields))
		}
	}
	if single != "" {
		fixes = append(fixes, single)
	}
	return fixes
}

// largestCount is the largest k in [1, hi] with fits(k), where fits is
// true and then false as k grows, or 0 when there is none.
func largestCount(hi int, fits func(int) bool) int {
	lo := 0 // fits(lo) holds, or lo is 0
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// capBackoff shortens every wait in b to at most c.
func capBackoff(b []time.Duration, c time.Duration) {
	for i := range b {
		b[i] = min(b[i], c)
	}
}
