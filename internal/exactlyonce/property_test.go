// The startup check as a theorem, tested by simulation. Talks to nothing
// outside the process: the in-memory broker, memstore and dedup.Guard on a
// fake clock (see sim_test.go).
//
// Statement: for a plan whose sides declare each other truthfully, if
// window.CheckPublisher and window.CheckConsumer both accept it, then in
// every schedule the declared policies allow the message's effect happens
// at most once with a transactional store, and at most once plus the
// Guard's counted Unrecorded cases with a separate store; and it happens
// at least once whenever a handler reported success. Conversely at margin
// zero (Margin < 0) every refused plan has a schedule that runs the effect
// twice (with the one documented exception, see window's package doc).
//
// Run longer with DEDUPQ_PROPERTY_SCHEDULES=1000000 go test -run
// TestStartupCheckIsATheorem ./internal/exactlyonce/ (DEDUPQ_PROPERTY_SEED
// picks another seed).
package exactlyonce

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// randomPerPlan is how many random adversarial schedules each accepted
// plan gets, besides the worst-case one.
const randomPerPlan = 7

// ms draws a whole number of milliseconds in [lo, hi]: plans are in
// milliseconds, so the nanosecond ends of the model's half-open intervals
// never decide a case.
func ms(r *rand.Rand, lo, hi time.Duration) time.Duration {
	lo, hi = lo/time.Millisecond, hi/time.Millisecond
	if hi <= lo {
		return lo * time.Millisecond
	}
	return (lo + time.Duration(r.Int64N(int64(hi-lo+1)))) * time.Millisecond
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// copySpan is how long after t0 a second copy may still be sent: the
// publisher's span, or zero when it never resends.
func copySpan(rp window.RetryPolicy) time.Duration {
	if rp.Retries() == 0 {
		return 0
	}
	return rp.Span()
}

// genPlan draws a plan, biased towards the edges of the model: windows
// near the span, TTLs at the new and the old requirement and at the
// documented band.
func genPlan(r *rand.Rand) plan {
	var p plan
	p.retry = window.RetryPolicy{
		MaxAttempts:    pick(r, 1, 2, 2, 3, 4, 6),
		AttemptTimeout: ms(r, 100*time.Millisecond, 2*time.Minute),
		InitialBackoff: pick(r, 0, ms(r, 0, 5*time.Second), ms(r, 0, 5*time.Minute)),
		Multiplier:     pick(r, 1, 1.5, 2),
		MaxBackoff:     pick(r, 0, 0, ms(r, time.Second, 2*time.Minute)),
		Jitter:         pick(r, 0, 0, 0.2, 1),
	}
	if r.IntN(40) == 0 {
		p.retry.AttemptTimeout = 0 // unbounded attempts
	}
	span := copySpan(p.retry)
	switch c := r.IntN(8); {
	case c == 0: // no window
	case c < 4:
		p.window = ms(r, time.Second, 10*time.Minute)
	case span > 0 && span < window.Forever && c < 6:
		p.window = max(span+pick(r, -time.Millisecond, 0, time.Millisecond), time.Millisecond)
	case span > 0 && span < window.Forever:
		p.window = max(time.Duration(float64(span)*(0.3+1.2*r.Float64())).Truncate(time.Millisecond), time.Millisecond)
	default:
		p.window = ms(r, time.Second, 10*time.Minute)
	}
	p.redelivery = window.RedeliveryPolicy{MaxDeliveries: pick(r, 1, 2, 3, 3, 5), AckWait: ms(r, 3*time.Second, 2*time.Minute)}
	if r.IntN(30) == 0 {
		p.redelivery.MaxDeliveries = 0 // unlimited
	}
	for range r.IntN(3) {
		p.redelivery.Backoff = append(p.redelivery.Backoff, pick(r, 0, ms(r, 0, time.Minute)))
	}
	p.margin = pick(r, -1, -1, -1, 0, 0.1, 0.5)
	p.mode = pick(r, modeGuard, modeTx)

	red := p.redelivery.Span()
	beyond := time.Duration(0)
	if span > 0 && (p.window <= 0 || span > p.window) {
		beyond = span
	}
	need := addSat(red, beyond)
	if need >= window.Forever/4 {
		p.ttl = ms(r, time.Second, 24*time.Hour)
	} else {
		oldNeed := addSat(red, max(beyond-p.window, 0)) // the check before issue 9
		if p.window <= 0 {
			oldNeed = need
		}
		band := red - p.redelivery.BackoffBefore(2)
		p.ttl = pick(r,
			need, need-time.Millisecond, need+time.Millisecond,
			oldNeed, oldNeed+time.Millisecond, oldNeed-time.Millisecond,
			band, band-time.Millisecond,
			ms(r, need/2, 2*need), ms(r, need/2, 2*need), ms(r, need, 2*need),
			ms(r, time.Second, red))
		if p.margin > 0 || p.margin == 0 && r.IntN(2) == 0 {
			m := p.margin
			if m == 0 {
				m = window.DefaultMargin
			}
			p.ttl = time.Duration(float64(p.ttl) / (1 - m)).Truncate(time.Millisecond)
		}
		p.ttl = max(p.ttl, time.Millisecond)
	}
	switch c := r.IntN(20); {
	case c < 5:
	case c < 17:
		p.declaredTTL = p.ttl
	default:
		p.declaredTTL = ms(r, time.Millisecond, p.ttl)
	}
	p.publisherSpan = span
	if r.IntN(8) == 0 && span < window.Forever {
		p.publisherSpan = span + ms(r, 0, time.Minute)
	}
	return p
}

func addSat(a, b time.Duration) time.Duration {
	if a >= window.Forever-b {
		return window.Forever
	}
	return a + b
}

// checks runs both startup checks the way NewPublisher and NewConsumer do,
// with the mem broker's own window and redelivery policy.
func checks(p plan) (pub, con error) {
	b := mem.NewBroker(mem.Options{
		Clock: clock.NewFake(time.Unix(0, 0)), DedupWindow: p.window, AckWait: p.redelivery.AckWait,
		MaxDeliveries: p.redelivery.MaxDeliveries, Backoff: p.redelivery.Backoff,
	})
	w, err := b.Topic(queueName).Window(bg)
	if err != nil {
		return err, err
	}
	red, err := b.Subscription(queueName).Redelivery(bg)
	if err != nil {
		return err, err
	}
	pub = window.CheckPublisher(window.PublisherPlan{Retry: p.retry, Window: w, DedupTTL: p.declaredTTL, Margin: p.margin})
	con = window.CheckConsumer(window.ConsumerPlan{Redelivery: red, Window: w, DedupTTL: p.ttl, PublisherSpan: p.publisherSpan, Margin: p.margin})
	return pub, con
}

// tally counts what an exploration did.
type tally struct {
	schedules, accepted, twoCopyAccepted, refused, tight, band int
	unrecorded                                                 uint64
}

// Kinds of violation explore reports.
const (
	unsafe = "unsafe" // both checks accept a plan that duplicates
	loose  = "loose"  // a check refuses a plan at margin zero that cannot duplicate
)

// explore checks one plan: every schedule of an accepted plan must keep
// the effect exactly-once; a plan refused at margin zero must have a
// schedule that duplicates it. It returns the kind and a description of
// the first violation, or "", "". newAdv draws the random adversaries
// (randomAdversary, or a variant that plays a consumer with a known
// defect).
func explore(r *rand.Rand, p plan, tl *tally, newAdv func(*rand.Rand) adversary) (kind, msg string) {
	pubErr, conErr := checks(p)
	if pubErr == nil && conErr == nil {
		tl.accepted++
		span := copySpan(p.retry)
		if span > 0 && (p.window <= 0 || span > p.window) {
			tl.twoCopyAccepted++
		}
		for i := range randomPerPlan + 1 {
			adv, name := adversary{}, "worst case"
			if i > 0 {
				adv, name = newAdv(rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))), "random schedule "+strconv.Itoa(i)
			}
			out := run(p, adv)
			tl.schedules++
			tl.unrecorded += out.unrecorded
			if msg := violation(p, out); msg != "" {
				return unsafe, "both checks accept, but the " + name + " " + msg + "\nplan: " + p.String()
			}
		}
		return "", ""
	}
	tl.refused++
	exact := p.publisherSpan == copySpan(p.retry) && (p.declaredTTL == 0 || p.declaredTTL == p.ttl)
	if p.margin >= 0 || !exact {
		return "", ""
	}
	// Refused at margin zero: the worst schedule within the declared
	// policies must run the effect twice.
	tp, expect := p, true
	if pubErr != nil {
		if p.declaredTTL > 0 {
			tp.ttl, tp.mode = p.declaredTTL, modeGuard
		} else {
			tp.mode = modeNone
		}
	} else {
		// The one documented slack: no second copy, and a TTL of at least
		// R − Backoff[0] (mem waits no backoff after an expired lease).
		span := copySpan(p.retry)
		single := span == 0 || (p.window > 0 && span <= p.window)
		expect = !(single && p.redelivery.MaxDeliveries >= 2 && p.ttl >= p.redelivery.Span()-p.redelivery.BackoffBefore(2))
	}
	out := run(tp, adversary{})
	tl.schedules++
	switch {
	case out.err != nil:
		return loose, "refused plan: " + out.err.Error() + "\nplan: " + tp.String()
	case expect && out.duplicates() <= 0:
		return loose, "a check refused (" + firstErr(pubErr, conErr).Error() + ") but the worst schedule ran the effect " +
			strconv.Itoa(out.effects) + " time(s): the check is not tight\nplan: " + tp.String()
	case !expect && out.duplicates() > 0:
		return loose, "the refused plan is in the documented safe band, but the worst schedule duplicated it\nplan: " + tp.String()
	case expect:
		tl.tight++
	default:
		tl.band++
	}
	return "", ""
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// violation says what an accepted plan's schedule got wrong, or "".
func violation(p plan, out outcome) string {
	switch {
	case out.err != nil:
		return "failed: " + out.err.Error()
	case p.mode == modeTx && out.effects > 1:
		return "ran the effect " + strconv.Itoa(out.effects) + " times with a transactional store"
	case p.mode == modeGuard && out.duplicates() > 0:
		return "ran the effect " + strconv.Itoa(out.effects) + " times with only " +
			strconv.FormatUint(out.unrecorded, 10) + " counted Unrecorded"
	case out.nilReturned && out.effects == 0:
		return "acked the message but never ran its effect"
	}
	return ""
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func TestStartupCheckIsATheorem(t *testing.T) {
	target := 20_000
	if testing.Short() {
		target = 2_000
	}
	target = envInt(t, "DEDUPQ_PROPERTY_SCHEDULES", target)
	seed := uint64(envInt(t, "DEDUPQ_PROPERTY_SEED", 9))
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var tl tally
	start := time.Now()
	// Go on after a violation, so that one run reports the first plan of
	// each kind and how many there are.
	first, count := map[string]string{}, map[string]int{}
	for plans := 0; tl.schedules < target; plans++ {
		if kind, msg := explore(r, genPlan(r), &tl, randomAdversary); kind != "" {
			if count[kind]++; count[kind] == 1 {
				first[kind] = fmt.Sprintf("seed %d, plan %d: %s", seed, plans, msg)
			}
		}
	}
	for _, kind := range []string{unsafe, loose} {
		if count[kind] > 0 {
			t.Errorf("%d %s plans; the first: %s", count[kind], kind, first[kind])
		}
	}
	t.Logf("%d schedules in %s: %d accepted plans explored (%d where a second copy can exist), %d refused plans, %d of them shown tight at margin zero, %d in the documented band; %d Unrecorded counted",
		tl.schedules, time.Since(start).Round(time.Millisecond), tl.accepted, tl.twoCopyAccepted, tl.refused, tl.tight, tl.band, tl.unrecorded)
	if tl.accepted == 0 || tl.twoCopyAccepted == 0 || tl.tight == 0 {
		t.Fatalf("the exploration is vacuous: %+v", tl)
	}
}

// The exploration must catch the kind of hole issue 23 found (defect 1):
// a consumer that holds a delivery while its store is down past the
// delivery's claim deadline, as dedupq's did before, claims the key after
// its completion expired. From random schedules alone, with the same plans
// and adversaries as TestStartupCheckIsATheorem, it must find a plan both
// checks accept whose effect runs twice.
func TestExplorationFindsAnUnboundedHold(t *testing.T) {
	limit := envInt(t, "DEDUPQ_PROPERTY_SCHEDULES", 20_000)
	seed := uint64(envInt(t, "DEDUPQ_PROPERTY_SEED", 9))
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	unbounded := func(r *rand.Rand) adversary {
		a := randomAdversary(r)
		a.unboundedHold = true
		return a
	}
	var tl tally
	for plans := 0; tl.schedules < limit; plans++ {
		if kind, msg := explore(r, genPlan(r), &tl, unbounded); kind == unsafe {
			t.Logf("found after %d schedules (seed %d, plan %d): %s", tl.schedules, seed, plans, msg)
			return
		}
	}
	t.Fatalf("%d schedules of a consumer that holds past the claim deadline, and no duplicate found: the adversaries no longer reach that hole", tl.schedules)
}

func FuzzStartupCheck(f *testing.F) {
	for _, seed := range []uint64{1, 2, 3, 9, 42, 1 << 40, 0xdeadbeef} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		var tl tally
		for range 4 {
			if _, msg := explore(r, genPlan(r), &tl, randomAdversary); msg != "" {
				t.Fatal(msg)
			}
		}
	})
}

// Issue 9, defect 1, on the mem broker through the public API: window 5m,
// AckWait 30s, MaxDeliveries 3; a publisher with 2 attempts 9m apart (span
// 10m) declaring ConsumerDedupTTL 13m; a consumer with PublisherSpan 10m and
// a Guard TTL of 8m12s. NewConsumer must refuse, and the schedule the
// refusal is about must really run the effect twice.
func TestIssue9Defect1(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	b := mem.NewBroker(mem.Options{Clock: clk, DedupWindow: 5 * time.Minute, AckWait: 30 * time.Second, MaxDeliveries: 3})
	retry := window.RetryPolicy{MaxAttempts: 2, AttemptTimeout: time.Minute, InitialBackoff: 8 * time.Minute}
	if got := retry.Span(); got != 10*time.Minute {
		t.Fatalf("publisher span %s, want 10m", got)
	}
	pub, err := dedupq.NewPublisher(ctx, b.Topic(queueName), dedupq.PublisherOptions{Retry: &retry, ConsumerDedupTTL: 13 * time.Minute, Clock: clk})
	if err != nil {
		t.Fatalf("NewPublisher: %v (its span fits the declared 13m TTL)", err)
	}
	defer pub.Close(ctx)
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(clk), TTL: 8*time.Minute + 12*time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sub := b.Subscription(queueName)
	defer sub.Close()
	con, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Dedup: guard, PublisherSpan: retry.Span(), Clock: clk})
	if err == nil {
		con.Close(ctx)
		t.Fatal("NewConsumer accepted a Guard TTL of 8m12s for a 10m publisher span over a 5m window and 1m30s of redelivery")
	}
	var ue *window.UnsafeRetryError
	if !errors.As(err, &ue) || ue.Span != 11*time.Minute+30*time.Second {
		t.Fatalf("NewConsumer = %v, want an UnsafeRetryError for a span of 1m30s + 10m", err)
	}
	t.Logf("refused: %v", err)

	p := plan{
		window: 5 * time.Minute, retry: retry,
		redelivery: window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second},
		ttl:        8*time.Minute + 12*time.Second, declaredTTL: 13 * time.Minute, publisherSpan: retry.Span(),
		margin: window.DefaultMargin, mode: modeGuard,
	}
	out := run(p, adversary{})
	if out.err != nil || out.stored != 2 || out.effects != 2 || out.unrecorded != 0 {
		t.Fatalf("the issue's schedule: %+v, want 2 copies stored and the effect run twice, nothing Unrecorded", out)
	}
}
