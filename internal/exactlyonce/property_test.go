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
// Ordered plans (a third of them) give the message a GroupKey and the
// consumer ConsumerPlan.Ordered: the mem broker then holds the group
// behind its head, and B other messages of the group ("fillers", sent
// once each within the span; the adversary picks when, and how long each
// holds the group) stand between the first copy and a resend. Truthful
// means GroupBacklog ≥ B plus the copies of the message the publisher can
// store beyond two: a third copy stands between the first and the last as
// a filler would (counting only the other messages, random schedules with
// 4 attempts ran the effect twice). The theorem holds for them as stated,
// and every receive of a message of the group is checked to come after
// every message stored before it in the group has ended (the order the
// model rests on). At margin zero a refused ordered plan is shown tight
// with the declared backlog, or without one with the smallest backlog
// whose bound the TTL misses. mem's exception carries over: the first
// copy holds the group after its completion for at most R − Backoff[0],
// so T down to max(P, R − Backoff[0]) + (B+1)·R is safe there
// (memOrderedBand). A plan whose GroupBacklog is below its real backlog
// is outside the theorem; where the check refuses the real backlog, the
// worst schedule must run the effect twice, and some such plans the check
// accepted only because of the lie: the refusal is needed. Order across
// several messages of a group under the real dispatcher (groups.go) is
// tested in the root package (groups_property_test.go): here each
// delivery is its own process, and mem never hands out a group's next
// message while one is in flight.
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
	// scale makes room for the plan's margin in half the plans that have
	// one, so that the TTL's usable part lands on the bound.
	scale := func(ttl time.Duration) time.Duration {
		if p.margin > 0 || p.margin == 0 && r.IntN(2) == 0 {
			m := p.margin
			if m == 0 {
				m = window.DefaultMargin
			}
			ttl = time.Duration(float64(ttl) / (1 - m)).Truncate(time.Millisecond)
		}
		return max(ttl, time.Millisecond)
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
		p.ttl = scale(p.ttl)
	}
	if r.IntN(3) == 0 {
		p.ordered = true
		p.backlog = pick(r, 0, 1, 1, 2, 3, 5)
		b := trueBacklog(p)
		switch c := r.IntN(10); {
		case c < 6:
			p.declaredBacklog = b
		case c < 7:
			p.declaredBacklog = b + 1 + r.IntN(2)
		default: // under-declared, or none declared
			p.declaredBacklog = r.IntN(b + 1)
		}
		// With a second copy, the TTL near the head-of-line bound for the
		// real backlog and for the declared one.
		needO := func(b int) time.Duration { return orderedSpan(beyond, red, b) }
		if hi := needO(max(b, p.declaredBacklog)); beyond > 0 && hi < window.Forever/4 {
			d := pick(r, b, b, p.declaredBacklog, max(b-1, 0))
			p.ttl = scale(pick(r, needO(d), needO(d)-time.Millisecond, needO(d)+time.Millisecond, need, ms(r, hi/2, 2*hi)))
		}
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

// orderedSpan is window's head-of-line bound, max(P, R) + (B+1)·R, for a
// second copy P after the first behind b messages of its group.
func orderedSpan(p, r time.Duration, b int) time.Duration {
	return afterHolds(max(p, r), r, b+1)
}

// afterHolds is start plus n holds of the group, r each.
func afterHolds(start, r time.Duration, n int) time.Duration {
	for range n {
		start = addSat(start, r)
	}
	return start
}

// extraCopies is how many copies of the message beyond two its publisher
// can store: each stands in the group between the first copy and the last
// as another message of the group would, and holds the group as long. The
// copies are stored at least a window apart, all within the span.
func extraCopies(p plan) int {
	span := copySpan(p.retry)
	if span == 0 {
		return 0
	}
	n := max(p.retry.MaxAttempts, 1)
	if p.window > 0 && span < window.Forever {
		n = min(n, 1+int((span-1)/p.window))
	}
	return max(n-2, 0)
}

// trueBacklog is the most messages of the group an ordered plan can
// store between two copies of its message (ConsumerPlan.GroupBacklog
// counts them): the fillers, and the copies in between.
func trueBacklog(p plan) int { return p.backlog + extraCopies(p) }

// twoCopies reports whether the publisher can store a second copy.
func twoCopies(p plan) bool {
	span := copySpan(p.retry)
	return span > 0 && (p.window <= 0 || span > p.window)
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
	con = window.CheckConsumer(window.ConsumerPlan{Redelivery: red, Window: w, DedupTTL: p.ttl, PublisherSpan: p.publisherSpan, Margin: p.margin,
		Ordered: p.ordered, GroupBacklog: p.declaredBacklog})
	return pub, con
}

// tally counts what an exploration did.
type tally struct {
	schedules, accepted, twoCopyAccepted, refused, tight, band int
	unrecorded                                                 uint64
	// Ordered plans with a second copy: accepted and explored; refused
	// and shown tight; under-declared (GroupBacklog below the real
	// backlog) and refused with the real one, shown to duplicate, and of
	// those the ones the check accepted only because of the lie; refused
	// without a GroupBacklog where no backlog up to maxShownBacklog
	// breaks the TTL (not run).
	orderedAccepted, orderedTight, underDeclared, acceptedByTheLie, noBacklogNotShown int
}

// maxShownBacklog bounds the backlog a tightness run of a plan without a
// GroupBacklog gives the group.
const maxShownBacklog = 12

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
	exact := p.publisherSpan == copySpan(p.retry) && (p.declaredTTL == 0 || p.declaredTTL == p.ttl)
	if p.ordered && twoCopies(p) && p.declaredBacklog < trueBacklog(p) {
		return underDeclared(p, pubErr, conErr, exact, tl)
	}
	if pubErr == nil && conErr == nil {
		tl.accepted++
		if twoCopies(p) {
			tl.twoCopyAccepted++
			if p.ordered {
				tl.orderedAccepted++
			}
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
		single := !twoCopies(p)
		expect = !(single && p.redelivery.MaxDeliveries >= 2 && p.ttl >= p.redelivery.Span()-p.redelivery.BackoffBefore(2))
		if p.ordered && !single {
			// The schedule the refusal is about has the declared backlog;
			// without one, the first backlog whose bound the TTL misses.
			if tp.backlog = p.declaredBacklog; tp.backlog == 0 {
				if tp.backlog = firstBreakingBacklog(p); tp.backlog == 0 {
					tl.noBacklogNotShown++
					return "", ""
				}
			}
			expect = !memOrderedBand(p, tp.backlog)
		}
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
		if p.ordered && twoCopies(p) {
			tl.orderedTight++
		}
	default:
		tl.band++
	}
	return "", ""
}

// memOrderedBand reports whether an ordered plan with a second copy and
// a backlog of b lies in mem's band: the same exception as for one copy
// (see window's package doc). The first copy holds the group after its
// completion for at most R − Backoff[0], the backoff before its second
// delivery being the one that cannot follow a completion, so the last
// copy's last claim comes before max(P, R − Backoff[0]) + (b+1)·R, which
// is less than the bound where P < R.
func memOrderedBand(p plan, b int) bool {
	red := p.redelivery.Span()
	first := red - p.redelivery.BackoffBefore(2)
	return p.redelivery.MaxDeliveries >= 2 && p.ttl >= afterHolds(max(copySpan(p.retry), first), red, b+1)
}

// firstBreakingBacklog is the smallest GroupBacklog, up to
// maxShownBacklog, that the consumer check refuses p with, or 0.
func firstBreakingBacklog(p plan) int {
	for b := 1; b <= maxShownBacklog; b++ {
		q := p
		q.declaredBacklog = b
		if _, err := checks(q); err != nil {
			return b
		}
	}
	return 0
}

// underDeclared explores an ordered plan whose GroupBacklog is below the
// backlog its publishers really store: the theorem says nothing of it,
// but where the check refuses the real backlog at margin zero, the worst
// schedule must run the effect twice, so that the refusal is needed and a
// plan the check accepted only because of the lie is shown unsafe.
func underDeclared(p plan, pubErr, conErr error, exact bool, tl *tally) (kind, msg string) {
	truthful := p
	truthful.declaredBacklog = trueBacklog(p)
	if _, realErr := checks(truthful); pubErr != nil || realErr == nil || p.margin >= 0 || !exact {
		return "", ""
	}
	// Fillers stand in for the copies beyond two, which the worst sends
	// do not make.
	tp := p
	tp.backlog = trueBacklog(p)
	if memOrderedBand(tp, tp.backlog) {
		return "", ""
	}
	out := run(tp, adversary{})
	tl.schedules++
	switch {
	case out.err != nil:
		return loose, "under-declared plan: " + out.err.Error() + "\nplan: " + tp.String()
	case out.duplicates() <= 0:
		return loose, "the check refuses the real GroupBacklog " + strconv.Itoa(tp.backlog) + ", but the worst schedule ran the effect " +
			strconv.Itoa(out.effects) + " time(s): the head-of-line bound is not tight\nplan: " + tp.String()
	}
	tl.underDeclared++
	if conErr == nil {
		tl.acceptedByTheLie++
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
	t.Logf("ordered, with a second copy: %d accepted plans explored, %d refused plans shown tight; %d under-declared GroupBacklogs shown to duplicate (%d of them accepted by the check); %d refusals without a GroupBacklog not shown (no backlog up to %d breaks the TTL)",
		tl.orderedAccepted, tl.orderedTight, tl.underDeclared, tl.acceptedByTheLie, tl.noBacklogNotShown, maxShownBacklog)
	if tl.accepted == 0 || tl.twoCopyAccepted == 0 || tl.tight == 0 || tl.orderedAccepted == 0 || tl.orderedTight == 0 || tl.acceptedByTheLie == 0 {
		t.Fatalf("the exploration is vacuous: %+v", tl)
	}
}

// The exploration must catch the kind of hole issue 23 found (defect 1):
// a consumer that holds a delivery while its store is down past the
// delivery's claim deadline, as dedupq's did before, claims the key after
// its completion expired. From random schedules alone, with the same plans
// (unordered ones: an ordered plan could duplicate for a reason of its
// own) and adversaries as TestStartupCheckIsATheorem, it must find a plan
// both checks accept whose effect runs twice.
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
		p := genPlan(r)
		if p.ordered {
			continue
		}
		if kind, msg := explore(r, p, &tl, unbounded); kind == unsafe {
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

// An ordered group's head that fails its last delivery holds the group
// for its nack's delay on top of the redelivery span: the broker keeps a
// nacked message (mem, an SQS FIFO message's visibility timeout) until
// the delay ends, and dead-letters it only then. The Consumer nacks a
// delivery that has used up MaxDeliveries with the policy's backoff as any
// other, so every message ahead of a resent copy can hold the group for
// R + Backoff, and the head-of-line bound max(P, R) + (B+1)·R is short by
// up to (B+1) backoffs. Here: window 1m, ack wait 30s, 2 deliveries,
// backoff 1m (R = 2m); a publisher span of 2m; one other message of the
// group; TTL 6m = max(2m, 2m) + 2 × 2m, which NewConsumer accepts. In the
// worst schedule the other message holds the group from 2m to 5m, and the
// resent copy's second delivery claims at 6m30s, after the record expired.
func TestOrderedLastNackHoldsItsGroup(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	red := window.RedeliveryPolicy{MaxDeliveries: 2, AckWait: 30 * time.Second, Backoff: []time.Duration{time.Minute}}
	b := mem.NewBroker(mem.Options{Clock: clk, DedupWindow: time.Minute, AckWait: red.AckWait, MaxDeliveries: red.MaxDeliveries, Backoff: red.Backoff})
	retry := window.RetryPolicy{MaxAttempts: 2, AttemptTimeout: 30 * time.Second, InitialBackoff: time.Minute}
	if retry.Span() != 2*time.Minute || red.Span() != 2*time.Minute {
		t.Fatalf("publisher span %s, redelivery span %s; want 2m each", retry.Span(), red.Span())
	}
	const ttl = 6 * time.Minute
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(clk), TTL: ttl, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	sub := b.Subscription(queueName)
	defer sub.Close()
	con, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Dedup: guard, PublisherSpan: retry.Span(), Margin: -1,
		Ordered: true, GroupBacklog: 1, Clock: clk})
	if err != nil {
		t.Fatalf("NewConsumer: %v (a TTL of max(P, R) + 2R = 6m)", err)
	}
	con.Close(ctx)

	p := plan{
		window: time.Minute, retry: retry, redelivery: red, ttl: ttl, publisherSpan: retry.Span(), margin: -1, mode: modeGuard,
		ordered: true, backlog: 1, declaredBacklog: 1,
	}
	if out := run(p, adversary{}); out.err != nil || out.effects != 1 {
		t.Fatalf("the worst schedule of a plan NewConsumer accepts: %+v, want the effect run once", out)
	}
}
