// A seeded, randomized test of the ordered dispatcher (groups.go) with the
// real Consumer and the real dedup.Guard over memstore, against a fake
// streaming broker (streamSub, below). Talks to nothing outside the
// process: everything runs on one clock.Fake inside a testing/synctest
// bubble, whose Wait says when every goroutine is blocked, so the test
// moves the clock only then and never sleeps.
//
// The broker keeps only what driver.GroupOrderer asks of a driver, and
// otherwise does what Pub/Sub ordering keys and JetStream do: it streams a
// group (hands out later messages of a group while an earlier one is in
// flight), hands a nacked message out again after its delay in sequence
// order, and hands out no later message of the group that it has not
// handed out yet before it. Its adversary fails heads (plain errors and
// RetryAfter), makes handlers take time, delivers a message twice at once,
// lets leases lapse early, and, in some seeds, redelivers the later
// messages of a group when one is nacked (as Pub/Sub does) or plays a
// broker that cannot delay a redelivery (driver.NackHolder, the Consumer
// holds the delay). Asserted: within a group, no handler starts before
// every earlier message of its group has succeeded, none runs beside
// another of its group, and every message's effect happens exactly once.
//
// Run more seeds with DEDUPQ_GROUPS_SEEDS=2000 go test -run
// TestOrderedGroupsUnderAStreamingBroker . (DEDUPQ_GROUPS_ALL=1 reports
// every failed seed, not the first three; DEDUPQ_GROUPS_SEED=n runs seed
// n alone, with its whole trace). A seed fixes the messages and every
// choice of the adversary, not how the Consumer's goroutines interleave:
// a failure may need a few runs of its seed to show again.
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

const (
	streamAckWait = 3 * time.Second
	// streamStep is how far the clock moves once everything is blocked;
	// every time the adversary picks is a multiple of it.
	streamStep = 100 * time.Millisecond
	// streamMaxDeliveries is the random worlds' MaxDeliveries: more than
	// any message needs for its own failures (up to 3) and its give-backs
	// behind failed heads; a message dead-lettered before its effect ran
	// fails the test.
	streamMaxDeliveries = 25
	// streamHorizon is when a seed that has not settled every message
	// fails as stuck.
	streamHorizon = 30 * time.Minute
)

var errStreamLeaseLost = errors.New("stream: the delivery's lease has lapsed")

// streamSeed is one seed's world: its messages and adversary.
type streamSeed struct {
	seed        uint64
	groups      [][]*streamMsg // by group, in publish order
	ungrouped   []*streamMsg
	concurrency int
	// resetsLater: a nack also redelivers the later messages of its
	// group that are in flight (Pub/Sub). holder: the broker cannot delay
	// a redelivery (driver.NackHolder).
	resetsLater, holder bool
	// dupP and lapseP are the chances that a delivery is made twice at
	// once, and that its lease lapses early.
	dupP, lapseP  float64
	maxDeliveries int
	// name is a scripted world's (seed 0).
	name string
}

// streamMsg is one message, with the broker's state of it and what its
// handler runs did.
type streamMsg struct {
	id, group string
	seq       int // in its group
	publishAt time.Time
	failures  int // the handler's first runs that fail

	// A scripted world's: its handler runs take these times (the rest
	// are drawn), and these deliveries of it are made twice at once.
	durations []time.Duration
	dups      []int

	// The broker's state, under streamSub.mu.
	deliveries   int
	leases       []*streamLease
	availableAt  time.Time // after a nack or a lapse: redelivered from then on
	done, buried bool

	// The handler's, under streamRecorder.mu.
	runs, effects int
}

type streamLease struct {
	token int
	end   time.Time
	lapse time.Time // zero: renewed as asked; else it ends then whatever Extend does
}

func newStreamSeed(seed uint64, start time.Time) *streamSeed {
	r := rand.New(rand.NewPCG(seed, 0x51ed27))
	s := &streamSeed{seed: seed, concurrency: 1 + r.IntN(6), resetsLater: r.IntN(3) == 0, holder: r.IntN(3) == 0,
		dupP: 0.05, lapseP: 0.08, maxDeliveries: streamMaxDeliveries}
	for g := range 2 + r.IntN(4) {
		var msgs []*streamMsg
		at := start
		for k := range 3 + r.IntN(8) {
			at = at.Add(time.Duration(r.IntN(20)) * streamStep)
			msgs = append(msgs, &streamMsg{id: fmt.Sprintf("g%d-%d", g, k), group: fmt.Sprintf("g%d", g), seq: k,
				publishAt: at, failures: pick(r, 0, 0, 0, 1, 1, 2, 3)})
		}
		s.groups = append(s.groups, msgs)
	}
	for k := range r.IntN(4) {
		s.ungrouped = append(s.ungrouped, &streamMsg{id: fmt.Sprintf("u-%d", k), seq: k,
			publishAt: start.Add(time.Duration(r.IntN(40)) * streamStep), failures: pick(r, 0, 1)})
	}
	return s
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// chance decides one adversary choice from the seed, its kind, a message
// and a count, never from a shared stream, so that a choice does not
// depend on how the goroutines interleave: true with probability p, and
// n, a number in [0, 1<<53).
func (s *streamSeed) chance(p float64, kind, id string, n int) (bool, uint64) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%d", kind, id, n)
	v := rand.New(rand.NewPCG(s.seed, h.Sum64())).Uint64() >> 11
	return float64(v)/float64(1<<53) < p, v
}

// steps is a choice of k ∈ [0, n) steps of the clock.
func (s *streamSeed) steps(kind, id string, i, n int) time.Duration {
	_, v := s.chance(0, kind, id, i)
	return time.Duration(v%uint64(n)) * streamStep
}

// streamSub is the fake streaming broker's one subscription.
type streamSub struct {
	w     *streamSeed
	clk   *clock.Fake
	trace *streamTrace

	mu       sync.Mutex
	token    int
	receives int
	extra    []*driver.Delivery // duplicates not handed out yet
	wake     chan struct{}
}

type streamHandle struct {
	m *streamMsg
	l *streamLease
}

func newStreamSub(w *streamSeed, clk *clock.Fake, trace *streamTrace) *streamSub {
	return &streamSub{w: w, clk: clk, trace: trace, wake: make(chan struct{})}
}

// changed wakes a blocked Receive; the test calls it after every move of
// the clock too.
func (s *streamSub) changed() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.changedLocked()
}

func (s *streamSub) changedLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// buried reports whether m was dead-lettered: the messages after it in
// its group may then run.
func (s *streamSub) buried(m *streamMsg) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.clk.Now())
	return m.buried
}

func (s *streamSub) all() []*streamMsg {
	out := slices.Concat(s.w.groups...)
	return append(out, s.w.ungrouped...)
}

// expire applies the passage of time: leases that ended or lapsed, and
// the dead-lettering of a message with no deliveries left.
func (s *streamSub) expire(now time.Time) {
	for _, m := range s.all() {
		if m.done {
			continue
		}
		before := len(m.leases)
		m.leases = slices.DeleteFunc(m.leases, func(l *streamLease) bool {
			return !l.end.After(now) || !l.lapse.IsZero() && !l.lapse.After(now)
		})
		if before > 0 && len(m.leases) == 0 {
			m.availableAt = now // redelivered at once
			s.trace.add(now, "%s: lease ended", m.id)
		}
		if len(m.leases) == 0 && m.deliveries >= s.w.maxDeliveries && !now.Before(m.availableAt) {
			m.done, m.buried = true, true
			s.trace.add(now, "%s: dead-lettered after %d deliveries", m.id, m.deliveries)
		}
	}
}

// ready reports whether m may be handed out now, and whether the messages
// of its group after it may (the broker streams past one in flight, but
// hands out none after one waiting to be redelivered, nor after one not
// published yet).
func ready(m *streamMsg, now time.Time) (ok, past bool) {
	switch {
	case m.done:
		return false, true
	case m.publishAt.After(now):
		return false, false
	case len(m.leases) > 0:
		return false, true
	case m.deliveries > 0 && now.Before(m.availableAt):
		return false, false
	}
	return true, true
}

func (s *streamSub) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	for {
		s.mu.Lock()
		ds := s.take(n)
		wake := s.wake
		s.mu.Unlock()
		if len(ds) > 0 {
			return ds, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

// take hands out up to n deliveries: pending duplicates first, then each
// group's ready messages in sequence order, visiting the groups (and the
// ungrouped messages) in an order the adversary picks per receive.
func (s *streamSub) take(n int) []*driver.Delivery {
	now := s.clk.Now()
	s.expire(now)
	out := make([]*driver.Delivery, 0, n)
	for len(s.extra) > 0 && len(out) < n {
		out = append(out, s.extra[0])
		s.extra = s.extra[1:]
	}
	s.receives++
	lists := append(slices.Clone(s.w.groups), s.w.ungrouped)
	_, v := s.w.chance(0, "visit", "", s.receives)
	rand.New(rand.NewPCG(v, 1)).Shuffle(len(lists), func(i, j int) { lists[i], lists[j] = lists[j], lists[i] })
	for _, msgs := range lists {
		grouped := len(msgs) > 0 && msgs[0].group != ""
		for _, m := range msgs {
			if len(out) >= n {
				return out
			}
			ok, past := ready(m, now)
			if ok {
				out = append(out, s.deliver(m, now))
				if dup, _ := s.w.chance(s.w.dupP, "dup", m.id, m.deliveries); dup || slices.Contains(m.dups, m.deliveries) {
					d := s.deliver(m, now)
					if len(out) < n {
						out = append(out, d)
					} else {
						s.extra = append(s.extra, d)
					}
				}
			}
			if grouped && !past {
				break
			}
		}
	}
	return out
}

func (s *streamSub) deliver(m *streamMsg, now time.Time) *driver.Delivery {
	s.token++
	m.deliveries++
	l := &streamLease{token: s.token, end: now.Add(streamAckWait)}
	if lapse, _ := s.w.chance(s.w.lapseP, "lapse", m.id, m.deliveries); lapse {
		l.lapse = now.Add(streamStep + s.w.steps("lapseAt", m.id, m.deliveries, 30))
	}
	m.leases = append(m.leases, l)
	s.trace.add(now, "%s: delivery %d (lease %d, lapses %v)", m.id, m.deliveries, l.token, !l.lapse.IsZero())
	return &driver.Delivery{
		Message: driver.Message{ID: m.id, GroupKey: m.group, Body: []byte(m.id)},
		Attempt: m.deliveries, BackendID: m.id, Lease: streamAckWait, Handle: &streamHandle{m, l},
	}
}

// live returns d's message if d still holds its lease, nil if the message
// is settled already (settling it again is harmless, as on JetStream), or
// errStreamLeaseLost.
func (s *streamSub) live(d *driver.Delivery, now time.Time) (*streamMsg, error) {
	h := d.Handle.(*streamHandle)
	s.expire(now)
	if h.m.done {
		return nil, nil
	}
	if !slices.Contains(h.m.leases, h.l) {
		return nil, errStreamLeaseLost
	}
	return h.m, nil
}

// settle applies f to d's message under the lock when d still holds its
// lease, and wakes Receive; it returns nil for a message settled already
// (settling it again is harmless) and errStreamLeaseLost for a lapsed
// lease, tracing both as what.
func (s *streamSub) settle(d *driver.Delivery, what string, f func(m *streamMsg, now time.Time)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	m, err := s.live(d, now)
	if m == nil {
		s.trace.add(now, "%s: %s of delivery %d: %v", d.Message.ID, what, d.Attempt, err)
		return err
	}
	f(m, now)
	s.changedLocked()
	return nil
}

func (s *streamSub) Ack(ctx context.Context, d *driver.Delivery) error {
	return s.settle(d, "ack", func(m *streamMsg, now time.Time) {
		m.done, m.leases = true, nil
		s.trace.add(now, "%s: acked (delivery %d)", m.id, d.Attempt)
	})
}

func (s *streamSub) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	return s.settle(d, "nack", func(m *streamMsg, now time.Time) {
		// Every delivery of the message loses its lease with the nack.
		m.leases, m.availableAt = nil, now.Add(max(delay, 0))
		s.trace.add(now, "%s: nacked (delivery %d), again in %s", m.id, d.Attempt, max(delay, 0))
		if !s.w.resetsLater || m.group == "" {
			return
		}
		for _, later := range s.w.groups[groupIndex(m.group)][m.seq+1:] {
			if len(later.leases) > 0 && !later.done {
				later.leases, later.availableAt = nil, m.availableAt
				s.trace.add(now, "%s: redelivered after %s (the broker's nack of a key)", later.id, m.id)
			}
		}
	})
}

func groupIndex(group string) int {
	i, _ := strconv.Atoi(strings.TrimPrefix(group, "g"))
	return i
}

func (s *streamSub) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	return s.settle(d, "terminate", func(m *streamMsg, now time.Time) {
		m.done, m.buried, m.leases = true, true, nil
		s.trace.add(now, "%s: terminated: %v", m.id, reason)
	})
}

func (s *streamSub) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	return s.settle(d, "extend", func(m *streamMsg, now time.Time) {
		l := d.Handle.(*streamHandle).l
		if end := now.Add(by); end.After(l.end) {
			l.end = end
		}
	})
}

func (s *streamSub) Window(context.Context) (window.Window, error) {
	return window.Window{Backend: "stream", Kind: window.KindNone}, nil
}

func (s *streamSub) Redelivery(context.Context) (window.RedeliveryPolicy, error) {
	return window.RedeliveryPolicy{MaxDeliveries: s.w.maxDeliveries, AckWait: streamAckWait,
		Backoff: []time.Duration{500 * time.Millisecond, time.Second}}, nil
}

func (s *streamSub) IsRetryable(error) bool { return false }
func (s *streamSub) Close() error           { return nil }

// OrdersGroups: the broker keeps a group's order as driver.GroupOrderer
// asks, and no more.
func (s *streamSub) OrdersGroups(context.Context) error { return nil }

// holdingStreamSub is the broker that cannot delay a redelivery.
type holdingStreamSub struct{ *streamSub }

func (holdingStreamSub) MaxNackHold(*driver.Delivery) time.Duration { return 10 * time.Second }

// streamRecorder checks each handler run against the order and counts
// the effects.
type streamRecorder struct {
	w     *streamSeed
	sub   *streamSub
	clk   *clock.Fake
	trace *streamTrace

	mu         sync.Mutex
	byID       map[string]*streamMsg
	running    map[string]string // group → the message whose handler runs
	violations []string
}

func (rec *streamRecorder) violate(format string, args ...any) {
	if len(rec.violations) < 5 {
		rec.violations = append(rec.violations, fmt.Sprintf(format, args...))
	}
}

// handler is the application's: it checks its group, takes time, and
// fails or runs its effect as the adversary says.
func (rec *streamRecorder) handler(ctx context.Context, d *dedupq.Delivery) error {
	rec.mu.Lock()
	m := rec.byID[d.Message.ID]
	now := rec.clk.Now()
	if m.group != "" {
		if other := rec.running[m.group]; other != "" {
			rec.violate("%s: %s started while %s of its group ran", now.Format("15:04:05.0"), m.id, other)
		}
		for _, earlier := range rec.w.groups[groupIndex(m.group)][:m.seq] {
			if earlier.effects == 0 && !rec.sub.buried(earlier) {
				rec.violate("%s: %s started before %s, earlier in its group, had succeeded", now.Format("15:04:05.0"), m.id, earlier.id)
				break
			}
		}
		rec.running[m.group] = m.id
	}
	m.runs++
	run, fail := m.runs, m.runs <= m.failures
	rec.trace.add(now, "%s: handler run %d starts (delivery %d)", m.id, run, d.Attempt)
	rec.mu.Unlock()

	dur := rec.w.steps("dur", m.id, run, 26)
	if run <= len(m.durations) {
		dur = m.durations[run-1]
	}
	clock.Sleep(rec.clk, dur, nil)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if m.group != "" {
		rec.running[m.group] = ""
	}
	now = rec.clk.Now()
	if fail {
		rec.trace.add(now, "%s: handler run %d fails", m.id, run)
		err := fmt.Errorf("%s: run %d fails", m.id, run)
		if later, _ := rec.w.chance(0.3, "retryAfter", m.id, run); later {
			return dedupq.RetryAfter(err, rec.w.steps("retryAfterDelay", m.id, run, 21))
		}
		return err
	}
	m.effects++
	rec.trace.add(now, "%s: handler run %d: effect %d", m.id, run, m.effects)
	return nil
}

// tracedGuard is the Guard, its every decision traced: the Consumer's
// view of a delivery's handler.
type tracedGuard struct {
	*dedup.Guard
	clk   *clock.Fake
	trace *streamTrace
}

func (g tracedGuard) Wrap(h dedupq.Handler) dedupq.Handler {
	guarded := g.Guard.Wrap(h)
	return func(ctx context.Context, d *dedupq.Delivery) error {
		g.trace.add(g.clk.Now(), "%s: delivery %d starts (claim deadline %s)", d.Message.ID, d.Attempt, d.ClaimDeadline.Sub(g.trace.start))
		err := guarded(ctx, d)
		g.trace.add(g.clk.Now(), "%s: delivery %d returns %v", d.Message.ID, d.Attempt, err)
		return err
	}
}

// streamTrace keeps what happened, for the report of a failed seed.
type streamTrace struct {
	start time.Time
	mu    sync.Mutex
	lines []string
}

func (tr *streamTrace) add(now time.Time, format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf("%8s  ", now.Sub(tr.start))+fmt.Sprintf(format, args...))
}

func (tr *streamTrace) tail(n int) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines[max(len(tr.lines)-n, 0):], "\n")
}

// streamStats sums what the seeds did.
type streamStats struct {
	mostDeliveries, buriedAfterEffect, buriedUnrun int
}

// runStreamSeed plays one seed inside a synctest bubble and returns what
// went wrong, with the end of the trace, or "".
func runStreamSeed(t *testing.T, seed uint64, st *streamStats) (failure string) {
	return runStreamWorld(t, func(start time.Time) *streamSeed { return newStreamSeed(seed, start) }, st)
}

// runStreamWorld plays the world newWorld makes, inside a synctest bubble.
func runStreamWorld(t *testing.T, newWorld func(start time.Time) *streamSeed, st *streamStats) (failure string) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := clock.NewFake(start)
		w := newWorld(start)
		trace := &streamTrace{start: start}
		base := newStreamSub(w, clk, trace)
		var sub driver.Subscription = base
		if w.holder {
			sub = holdingStreamSub{base}
		}
		rec := &streamRecorder{w: w, sub: base, clk: clk, trace: trace, byID: map[string]*streamMsg{}, running: map[string]string{}}
		for _, m := range base.all() {
			rec.byID[m.id] = m
		}
		guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(clk), TTL: time.Hour, Clock: clk,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		c, err := dedupq.NewConsumer(context.Background(), sub, dedupq.ConsumerOptions{
			Ordered: true, Concurrency: w.concurrency, Dedup: tracedGuard{guard, clk, trace}, Clock: clk,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- c.Run(ctx, rec.handler) }()
		settled := func() bool {
			base.mu.Lock()
			defer base.mu.Unlock()
			for _, m := range base.all() {
				if !m.done {
					return false
				}
			}
			return true
		}
		for {
			synctest.Wait()
			if settled() {
				break
			}
			if clk.Now().Sub(start) > streamHorizon {
				failure = "not every message settled within " + streamHorizon.String()
				break
			}
			clk.Advance(streamStep)
			base.changed()
		}
		stop()
		for done := false; !done; {
			synctest.Wait()
			select {
			case err := <-ran:
				if err != nil && failure == "" {
					failure = "Run: " + err.Error()
				}
				done = true
			default:
				clk.Advance(streamStep)
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var bad []string
		bad = append(bad, rec.violations...)
		for _, m := range base.all() {
			st.mostDeliveries = max(st.mostDeliveries, m.deliveries)
			switch {
			case m.buried && m.effects == 0 && w.name != "":
				bad = append(bad, fmt.Sprintf("%s dead-lettered after %d deliveries, its effect never ran", m.id, m.deliveries))
			case m.buried && m.effects == 0:
				// In a random world, not the ordering contract's breach (a group's head may
				// end dead-lettered), but a message given back behind
				// others until its deliveries ran out: counted and
				// reported, an open finding of issue 24 (give-backs cost
				// deliveries; under lapsing leases they can churn).
				st.buriedUnrun++
			case m.effects != 1:
				bad = append(bad, fmt.Sprintf("%s: effect ran %d times", m.id, m.effects))
			case m.buried:
				st.buriedAfterEffect++ // its ack was lost, and its redeliveries given back until none was left
			}
		}
		if failure != "" {
			bad = append(bad, failure)
		}
		if len(bad) > 0 {
			name := w.name
			if name == "" {
				name = fmt.Sprintf("seed %d", w.seed)
			}
			failure = fmt.Sprintf("%s (concurrency %d, %d groups, broker redelivers the later messages of a nacked key: %v, holds nacks: %v): %s\ntrace (last lines):\n%s",
				name, w.concurrency, len(w.groups), w.resetsLater, w.holder, strings.Join(bad, "; "), trace.tail(traceLines()))
		}
	})
	return failure
}

func TestOrderedGroupsUnderAStreamingBroker(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 20
	}
	if v := os.Getenv("DEDUPQ_GROUPS_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("DEDUPQ_GROUPS_SEEDS=%q: want a positive integer", v)
		}
		seeds = n
	}
	first := uint64(1)
	if v := os.Getenv("DEDUPQ_GROUPS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("DEDUPQ_GROUPS_SEED=%q: want a seed", v)
		}
		first, seeds = n, 1
	}
	failed := 0
	var st streamStats
	for seed := first; seed < first+uint64(seeds); seed++ {
		if f := runStreamSeed(t, seed, &st); f != "" {
			if failed++; failed <= 3 || os.Getenv("DEDUPQ_GROUPS_ALL") != "" {
				t.Error(f)
			}
		}
	}
	t.Logf("%d seeds, %d failed; the most deliveries of one message: %d; %d message(s) dead-lettered after their effect ran (an ack lost, then every redelivery given back behind later messages of the group); %d dead-lettered before it ran (given back until their deliveries ran out)",
		seeds, failed, st.mostDeliveries, st.buriedAfterEffect, st.buriedUnrun)
	if failed > 0 {
		t.Errorf("%d of %d seeds failed", failed, seeds)
	}
}

// scriptedWorld is one group g0 of msgs (their id, group and seq set
// here), on a broker that makes no random duplicates or lapses.
func scriptedWorld(name string, holder bool, maxDeliveries int, start time.Time, msgs ...*streamMsg) *streamSeed {
	for i, m := range msgs {
		m.id, m.group, m.seq = fmt.Sprintf("g0-%d", i), "g0", i
		m.publishAt = start.Add(m.publishAt.Sub(time.Time{}))
	}
	return &streamSeed{name: name, groups: [][]*streamMsg{msgs}, concurrency: 4, holder: holder, maxDeliveries: maxDeliveries}
}

// at is an offset from the start of a scripted world.
func at(d time.Duration) time.Time { return time.Time{}.Add(d) }

// Where the broker cannot delay a redelivery (driver.NackHolder: Pub/Sub,
// Service Bus), a delivery given back while its group waits for a failed
// head is held by the Consumer, in flight to the broker, which streams the
// later messages of the group past it. g0-0 fails at 1s and is held 500ms;
// g0-1, arriving at 1.2s, is given back and held until 1.75s; g0-0 comes
// again at 1.5s, which ends the block; g0-2 arrives at 1.6s and waits
// behind g0-0, and g0-1 comes again at 1.8s and waits behind g0-2. When
// g0-0 succeeds at 2.5s, g0-2 must not run before g0-1.
func TestOrderedGroupHeldFollowerKeepsItsPlace(t *testing.T) {
	var st streamStats
	if f := runStreamWorld(t, func(start time.Time) *streamSeed {
		return scriptedWorld("held follower", true, streamMaxDeliveries, start,
			&streamMsg{publishAt: at(0), failures: 1, durations: []time.Duration{time.Second, time.Second}},
			&streamMsg{publishAt: at(1200 * time.Millisecond)},
			&streamMsg{publishAt: at(1600 * time.Millisecond)})
	}, &st); f != "" {
		t.Error(f)
	}
}

// A duplicate delivery of a group's head that waited behind it past its
// claim deadline is given back once the head has succeeded, and the group
// must not then wait for that message to come again: it was acked, and
// never comes. g0-0 is delivered twice at once and runs 2s, past the 1.5s
// claim deadline of its duplicate and of g0-1 behind it; after it
// succeeds, g0-1's every delivery must not be given back until the block
// on g0-0 lapses (the lease, 3s here; 30s on most brokers): with 5
// deliveries, it is dead-lettered before it ever runs.
func TestOrderedGroupNotBlockedOnASucceededHead(t *testing.T) {
	var st streamStats
	if f := runStreamWorld(t, func(start time.Time) *streamSeed {
		return scriptedWorld("duplicate of a succeeded head", false, 5, start,
			&streamMsg{publishAt: at(0), durations: []time.Duration{2 * time.Second}, dups: []int{1}},
			&streamMsg{publishAt: at(0)})
	}, &st); f != "" {
		t.Error(f)
	}
}

// traceLines is how much of a failed seed's trace to report: all of it
// when one seed runs alone.
func traceLines() int {
	if os.Getenv("DEDUPQ_GROUPS_SEED") != "" {
		return 1 << 30
	}
	return 60
}
