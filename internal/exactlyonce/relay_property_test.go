// The outbox relay's span as a theorem, tested by simulation. Talks to the
// real PostgreSQL server at 127.0.0.1:5432, database test, trust auth
// (override with DEDUPQ_PG_DSN): it runs the real outbox.Relay, whose
// claims, ages and leases live in its table. Without PostgreSQL the tests
// skip, unless CI is set, when they fail. Everything else is in the
// process: the real dedupq.Publisher and the real in-memory broker
// (adapters/mem) behind a fault-injecting topic, all on one stepClock.
//
// Statement: whenever dedupq.NewPublisher and outbox.NewRelay accept a
// plan, every copy of a row's message reaches the broker no later than
// Relay.Span after the row's first send, so the broker stores it at most
// once (when no consumer dedup TTL is declared, the window covers the
// span); a row the backend refuses is parked alone, with the refusal, and
// never sent; and a row is never parked as "maybe sent" when no relay
// could have handed it to the broker.
//
// Why the real Relay rather than a model of it: the defect this test
// exists for (issue 23, defect 2) was in how a relay bounds a claimed
// batch's chunks, and a model would have carried the fix in itself. The
// price is PostgreSQL round trips, a few milliseconds per schedule; the
// clock costs nothing, because no goroutine ever waits on it: the broker
// double moves it while an attempt "runs", the publisher's backoff moves it
// when it waits (stepClock), and a crash is runtime.Goexit on the relay's
// goroutine between or within chunks.
//
// A default run plays 2000 schedules (300 with -short), about 10s. On the
// relay before issue 23's fix it found defect 2 (a resend behind slow
// chunks reaching the broker past Span) at schedule 545 of seed 23, and
// 7 of the 2000 broke the span; seeds 1, 2 and 3 found it at schedules 398,
// 157 and 737. Run longer with DEDUPQ_PROPERTY_SCHEDULES=20000 go test -run
// TestRelaySpanIsATheorem ./internal/exactlyonce/ (DEDUPQ_PROPERTY_SEED
// picks another seed).
package exactlyonce

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/outbox"
	"github.com/dedupq/dedupq/window"
)

// --- the clock ---

// stepClock is a fake clock that moves only when the simulation says time
// passes: the broker double's attempts, the publisher's backoff waits, the
// gaps between relay passes. An AfterFunc (the relay's own deadlines) runs
// on the goroutine that moves the clock past it, before that goroutine
// goes on, so a context it cancels is done before anyone looks again:
// with clock.Fake it would run on a goroutine of its own and race the
// publisher.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*stepTimer
}

type stepTimer struct {
	c  *stepClock
	at time.Time
	fn func()
	ch chan time.Time
}

func (t *stepTimer) C() <-chan time.Time { return t.ch }

func (t *stepTimer) Stop() bool {
	if t.c == nil {
		return false
	}
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, o := range t.c.timers {
		if o == t {
			t.c.timers = slices.Delete(t.c.timers, i, i+1)
			return true
		}
	}
	return false
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) AfterFunc(d time.Duration, fn func()) clock.Timer {
	if d <= 0 {
		fn()
		return &stepTimer{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &stepTimer{c: c, at: c.now.Add(d), fn: fn}
	c.timers = append(c.timers, t)
	return t
}

// NewTimer is a backoff wait: the time passes at once and the timer has
// fired, unless an AfterFunc due first ran; then the wait was cut there and
// the timer never fires (the cancelled context is what the waiter sees).
func (c *stepClock) NewTimer(d time.Duration) clock.Timer {
	ch := make(chan time.Time, 1)
	if c.advance(c.Now().Add(d), nil) {
		ch <- c.Now()
	}
	return &stepTimer{ch: ch}
}

// advance moves the clock to `to`, running each AfterFunc due on the way in
// time order. It stops where one ran and reports false when done is nil or
// then closed: the thing waiting was cut short.
func (c *stepClock) advance(to time.Time, done <-chan struct{}) bool {
	for {
		c.mu.Lock()
		i := -1
		for j, t := range c.timers {
			if !t.at.After(to) && (i < 0 || t.at.Before(c.timers[i].at)) {
				i = j
			}
		}
		if i < 0 {
			if to.After(c.now) {
				c.now = to
			}
			c.mu.Unlock()
			return true
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.fn()
		if done == nil {
			return false
		}
		select {
		case <-done:
			return false
		default:
		}
	}
}

// --- the broker double ---

// attempt is what one SendBatch call does, measured from its start.
type attempt struct {
	dur         time.Duration // how long the call takes (at most AttemptTimeout)
	land        time.Duration // when the send reaches the broker; < 0: never
	lost        bool          // the answer is lost (a timeout, as the publisher sees it)
	transient   bool          // not landed: a retryable error
	crashBefore bool          // the relay's process dies as the call starts
	crashAfter  bool          // … or right after the send landed
}

// healthy is an attempt that stores the chunk at once and answers.
var healthy = attempt{}

var (
	errTransient = errors.New("sim: broker unavailable, try again")
	errRejected  = errors.New("sim: broker rejected the batch")
)

// landing is one send that reached the broker.
type landing struct {
	at     time.Duration
	stored bool // the broker stored a copy (not dropped as a duplicate)
}

func (l landing) String() string {
	if l.stored {
		return l.at.String() + " stored"
	}
	return l.at.String() + " duplicate"
}

// relayTopic is the mem broker's topic behind the adversary: chunks of
// at most maxBatch, and each SendBatch call does what the adversary (or a
// script) says, moving the clock while it "runs". A relay deadline that
// falls inside a call cuts it there: the send lands before or not at all.
type relayTopic struct {
	driver.Topic
	s *relaySim
}

func (t relayTopic) MaxBatch() int { return t.s.maxBatch }

func (t relayTopic) IsRetryable(err error) bool { return errors.Is(err, errTransient) }

func (t relayTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	s := t.s
	if err := ctx.Err(); err != nil {
		return nil, err // as mem does: a done context sends nothing
	}
	a := s.next(msgs[0].ID)
	start := s.clk.Now()
	for _, m := range msgs {
		s.handed[m.ID] = append(s.handed[m.ID], start.Sub(s.t0))
	}
	if a.crashBefore {
		s.crash()
	}
	if a.land >= 0 {
		if !s.clk.advance(start.Add(a.land), ctx.Done()) {
			return nil, ctx.Err()
		}
		res, err := t.Topic.SendBatch(context.Background(), msgs)
		if err != nil {
			return nil, fmt.Errorf("sim: mem send: %w", err)
		}
		at := s.clk.Now().Sub(s.t0)
		for i, m := range msgs {
			s.landed[m.ID] = append(s.landed[m.ID], landing{at: at, stored: res[i].Err == nil && !res[i].Duplicate})
		}
		if a.crashAfter {
			s.crash()
		}
		if !s.clk.advance(start.Add(a.dur), ctx.Done()) {
			return nil, ctx.Err()
		}
		if a.lost {
			return nil, context.DeadlineExceeded
		}
		return res, nil
	}
	if !s.clk.advance(start.Add(a.dur), ctx.Done()) {
		return nil, ctx.Err()
	}
	switch {
	case a.transient:
		return nil, errTransient
	case a.lost:
		return nil, context.DeadlineExceeded
	}
	return nil, errRejected
}

// --- one schedule ---

// relayPlan is one configuration of broker, publisher and relay, and the
// rows in the outbox.
type relayPlan struct {
	window    time.Duration // the broker's dedup window; 0: none
	retry     window.RetryPolicy
	ttl       time.Duration // ConsumerDedupTTL declared on both; 0: none
	margin    float64
	resendFor time.Duration // Options.ResendFor
	lease     time.Duration // Options.Lease
	batchSize int
	maxBatch  int
	rows      []relayRow
}

type relayRow struct {
	id, group string
	invalid   bool // the backend refuses it (written by the package-level Enqueue)
}

func (p relayPlan) String() string {
	var rows []string
	for _, r := range p.rows {
		rows = append(rows, fmt.Sprintf("%q/%s", r.id, cmp.Or(r.group, "-")))
	}
	return fmt.Sprintf("window %s, retry %+v (span %s), ttl %s, margin %v, resend for %s, lease %s, batch %d, chunk %d, rows %s",
		p.window, p.retry, p.retry.Span(), p.ttl, p.margin, p.resendFor, p.lease, p.batchSize, p.maxBatch, strings.Join(rows, " "))
}

// relaySim is one schedule's world.
type relaySim struct {
	t0       time.Time
	clk      *stepClock
	r        *rand.Rand           // the adversary; nil: scripted
	script   map[string][]attempt // scripted calls per first message ID; then healthy
	calls    map[string]int       // calls so far per first message ID
	moods    map[string]mood      // this pass's mood per chunk (by its first message ID)
	weights  []float64            // how often each mood is drawn in this schedule
	benign   bool                 // the adversary has given up: every attempt is healthy
	timeout  time.Duration        // the policy's AttemptTimeout
	maxBatch int                  // the topic's chunk size
	handed   map[string][]time.Duration
	landed   map[string][]landing
	maybe    map[string]bool // claimed by a pass that crashed
	parked   map[string]*outbox.ParkedError
	passes   []string // what each pass did, for the report
	cuts     int      // passes whose publish the relay cut at a row's span (outbox.ErrSendDeadline)
}

// crash ends the relay's goroutine as a killed process would end: its
// claim committed, nothing marked or released.
func (s *relaySim) crash() { runtime.Goexit() }

// mood is how the broker treats one chunk for the length of one relay
// pass: drawn once per pass and chunk, so that a chunk fails or drags in
// every attempt as often as in one.
type mood int

const (
	fine     mood = iota // stored at once
	bounce               // refused at once, nothing stored: not maybe sent
	drag                 // every attempt times out
	lose                 // every attempt lands and its answer is lost
	anything             // each attempt drawn on its own
	moods
)

// drawMood draws a chunk's mood from the schedule's own weights: some
// schedules are mostly fine, some drag, some bounce, as brokers have good
// and bad days.
func (s *relaySim) drawMood() mood {
	if s.weights == nil {
		s.weights = make([]float64, moods)
		for i := range s.weights {
			s.weights[i] = s.r.Float64()
		}
		s.weights[fine] = max(s.weights[fine], 0.2)
	}
	var sum float64
	for _, w := range s.weights {
		sum += w
	}
	x := s.r.Float64() * sum
	for m, w := range s.weights {
		if x -= w; x < 0 {
			return mood(m)
		}
	}
	return fine
}

// next is the attempt the adversary (or the script) picks for a call whose
// chunk starts with id.
func (s *relaySim) next(id string) attempt {
	n := s.calls[id]
	s.calls[id] = n + 1
	if s.r == nil {
		if n < len(s.script[id]) {
			return s.script[id][n]
		}
		return healthy
	}
	if s.benign {
		return healthy
	}
	r, to := s.r, s.timeout
	m, ok := s.moods[id]
	if !ok {
		m = s.drawMood()
		s.moods[id] = m
	}
	a := attempt{crashBefore: m != fine && r.IntN(30) == 0}
	switch m {
	case fine:
		return healthy
	case bounce:
		a.land = -1
		a.transient = r.IntN(2) == 0
		return a
	case drag:
		a.dur, a.lost = to, true
		a.land = relayPick(r, -1, -1, to-1) // it may still land, at the last moment
		return a
	case lose:
		a.dur, a.lost = relayPick(r, 0, to, time.Duration(r.Int64N(int64(to)))+1), true
		a.land = relayPick(r, 0, max(a.dur-1, 0))
		a.crashAfter = r.IntN(10) == 0
		return a
	}
	switch c := r.IntN(6); {
	case c == 0:
	case c < 3:
		a.dur = to // a timeout: the answer never comes
		a.lost = true
	default:
		a.dur = time.Duration(r.Int64N(int64(to))) + 1
	}
	switch c := r.IntN(10); {
	case c < 3:
		a.land = -1
	case c < 5:
	case c < 8:
		a.land = max(a.dur-1, 0) // the last moment the attempt may land
	default:
		a.land = time.Duration(r.Int64N(int64(a.dur) + 1))
	}
	if a.land >= 0 {
		a.lost = a.lost || r.IntN(2) == 0
		a.crashAfter = r.IntN(15) == 0
	} else if !a.lost {
		a.transient = r.IntN(2) == 0
		a.lost = !a.transient && r.IntN(2) == 0
	}
	return a
}

// relayEnv is what every schedule of a test shares: the pool and a table
// emptied before each schedule.
type relayEnv struct {
	pool  *pgxpool.Pool
	table string
}

func newRelayEnv(t testing.TB) *relayEnv {
	t.Helper()
	ctx := context.Background()
	dsn := cmp.Or(os.Getenv("DEDUPQ_PG_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	cfg, err := pgxpool.ParseConfig(dsn)
	var pool *pgxpool.Pool
	if err == nil {
		// Commits need not wait for the disk: a schedule is thrown away.
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		pool, err = pgxpool.NewWithConfig(ctx, cfg)
	}
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL: %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	t.Cleanup(pool.Close)
	table := "exactlyonce_relay_" + strconv.FormatUint(rand.Uint64(), 36)
	if err := outbox.EnsureSchema(ctx, pool, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return &relayEnv{pool: pool, table: table}
}

// relayOutcome is what a schedule did, and the relay's answer to the plan.
type relayOutcome struct {
	refused error // NewPublisher's or NewRelay's refusal
	span    time.Duration
	resent  int64 // the relay's Stats().Resent: claims of rows an earlier claim may have sent
	sent    map[string]bool
	pending map[string]bool // neither sent nor parked: held back by a parked row of its group
	err     error           // the simulation itself went wrong
}

// maxPasses bounds a schedule; after benignAfter passes the adversary
// stops, so that every row ends sent or parked.
const (
	benignAfter = 20
	maxPasses   = 200
)

// runRelay plays one schedule of p against s's adversary (s.r, or s.script
// when s.r is nil).
func (e *relayEnv) runRelay(ctx context.Context, p relayPlan, s *relaySim) relayOutcome {
	s.t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s.clk = &stepClock{now: s.t0}
	s.calls, s.handed, s.landed = map[string]int{}, map[string][]time.Duration{}, map[string][]landing{}
	s.maybe, s.parked = map[string]bool{}, map[string]*outbox.ParkedError{}
	s.timeout, s.maxBatch = p.retry.AttemptTimeout, p.maxBatch
	var out relayOutcome
	b := mem.NewBroker(mem.Options{Clock: s.clk, DedupWindow: p.window})
	pub, err := dedupq.NewPublisher(ctx, relayTopic{Topic: b.Topic("outbox"), s: s}, dedupq.PublisherOptions{
		Retry: &p.retry, ConsumerDedupTTL: p.ttl, Margin: p.margin, Clock: s.clk,
	})
	if err != nil {
		out.refused = err
		return out
	}
	defer pub.Close(ctx)
	relay, err := outbox.NewRelay(e.pool, pub, outbox.Options{
		Table: e.table, BatchSize: p.batchSize, ConsumerDedupTTL: p.ttl, Margin: p.margin,
		ResendFor: p.resendFor, Lease: p.lease, Clock: s.clk,
		OnParked: func(pe *outbox.ParkedError) { s.parked[pe.MessageID] = pe },
	})
	if err != nil {
		out.refused = err
		return out
	}
	out.span = relay.Span()
	// The package-level Enqueue writes these rows, but only into
	// DefaultTable: the same INSERT, into this schedule's table.
	ids, groups := make([]string, len(p.rows)), make([]string, len(p.rows))
	for i, r := range p.rows {
		ids[i], groups[i] = r.id, r.group
	}
	table := pgx.Identifier{e.table}.Sanitize()
	if _, err := e.pool.Exec(ctx, "DELETE FROM "+table); err != nil {
		out.err = err
		return out
	}
	if _, err := e.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (msg_id, group_key, body)
SELECT m, g, '\x2a' FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(m, g, n) ORDER BY n`, table), ids, groups); err != nil {
		out.err = err
		return out
	}
	for pass := 0; ; pass++ {
		if pass == maxPasses {
			out.err = fmt.Errorf("sim: rows still pending after %d passes", maxPasses)
			return out
		}
		s.benign, s.moods = pass >= benignAfter, map[string]mood{}
		claimedAt, parked := s.clk.Now(), len(s.parked)
		var n int
		var perr error
		finished := false
		done := make(chan struct{})
		go func() {
			defer close(done)
			n, perr = relay.RunOnce(ctx)
			finished = true
		}()
		<-done
		if !finished {
			// A crash: the rows this pass claimed stay leased, and
			// whatever it did to them is unknown to the next relay.
			var crashed []string
			if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT msg_id FROM %s WHERE claimed_until > $1 AND sent_at IS NULL AND parked_at IS NULL`,
					table), claimedAt)
				if err != nil {
					return err
				}
				crashed, err = pgx.CollectRows(rows, pgx.RowTo[string])
				return err
			}); err != nil {
				out.err = err
				return out
			}
			for _, id := range crashed {
				s.maybe[id] = true
			}
			s.passes = append(s.passes, fmt.Sprintf("%s: crashed holding %v", s.clk.Now().Sub(s.t0), crashed))
			// A new relay takes over once the lease has lapsed.
			s.clk.advance(claimedAt.Add(cmp.Or(p.lease, p.retry.Span()+30*time.Second)), nil)
			if s.r != nil && s.r.IntN(3) == 0 {
				s.clk.advance(s.clk.Now().Add(time.Duration(s.r.Int64N(int64(p.retry.Span())+1))), nil)
			}
			continue
		}
		desc := fmt.Sprintf("%s–%s: %d rows", claimedAt.Sub(s.t0), s.clk.Now().Sub(s.t0), n)
		if errors.Is(perr, outbox.ErrSendDeadline) {
			s.cuts++
			desc += ", cut at a row's span or the lease's end"
		} else if perr != nil {
			desc += ", failed"
		}
		s.passes = append(s.passes, desc)
		if n > 0 || len(s.parked) > parked { // a pass that only parked rows may have left others
			if s.r != nil && s.r.IntN(3) == 0 { // Run waits a PollInterval after a failed pass
				s.clk.advance(s.clk.Now().Add(time.Duration(s.r.Int64N(int64(p.retry.Span())+1))), nil)
			}
			continue
		}
		// Nothing to claim now: done, unless a crashed pass's lease is
		// still running.
		var until *time.Time
		if err := e.pool.QueryRow(ctx, fmt.Sprintf(`SELECT max(claimed_until) FROM %s WHERE sent_at IS NULL AND parked_at IS NULL AND claimed_until > $1`,
			table), s.clk.Now()).Scan(&until); err != nil {
			out.err = err
			return out
		}
		if until == nil {
			break
		}
		s.clk.advance(*until, nil)
	}
	out.resent = relay.Stats().Resent
	rows, err := e.pool.Query(ctx, fmt.Sprintf(`SELECT msg_id, sent_at IS NOT NULL, parked_at IS NULL FROM %s`, table))
	if err != nil {
		out.err = err
		return out
	}
	out.sent, out.pending = map[string]bool{}, map[string]bool{}
	for rows.Next() {
		var id string
		var sent, unparked bool
		if err := rows.Scan(&id, &sent, &unparked); err != nil {
			out.err = err
			return out
		}
		out.sent[id] = sent
		out.pending[id] = !sent && unparked
	}
	if err := rows.Err(); err != nil {
		out.err = err
	}
	return out
}

// relayViolation says what an accepted plan's schedule got wrong: its kind
// and a description, or "", "".
func relayViolation(p relayPlan, s *relaySim, out relayOutcome) (kind, msg string) {
	if out.err != nil {
		return "failed", out.err.Error()
	}
	blocked := map[string]bool{} // groups held back by a parked row
	for _, r := range p.rows {
		if s.parked[r.id] != nil && r.group != "" {
			blocked[r.group] = true
		}
	}
	for _, r := range p.rows {
		handed, landed, pe := s.handed[r.id], s.landed[r.id], s.parked[r.id]
		timeline := fmt.Sprintf("handed to the broker at %v, landed %v", handed, landed)
		if r.invalid {
			if out.pending[r.id] && blocked[r.group] && len(handed) == 0 {
				continue // held back by a parked row of its group, before the relay looked at it
			}
			if len(handed) > 0 || pe == nil || !errors.Is(pe, dedupq.ErrInvalidMessage) {
				return "refused row", fmt.Sprintf("row %q, which the backend refuses, was not parked alone with its refusal (parked: %v; %s)", r.id, pe, timeline)
			}
			continue
		}
		if len(handed) > 0 {
			for _, l := range landed {
				if l.at > handed[0]+out.span {
					return "span", fmt.Sprintf("row %q reached the broker at %s, %s after its first send at %s, past the relay's span %s (%s)",
						r.id, l.at, l.at-handed[0], handed[0], out.span, timeline)
				}
			}
		}
		stored := 0
		for _, l := range landed {
			if l.stored {
				stored++
			}
		}
		switch {
		case stored > 1 && p.ttl == 0:
			return "stored twice", fmt.Sprintf("the broker stored row %q %d times (%s)", r.id, stored, timeline)
		case out.sent[r.id] && stored == 0:
			return "lost", fmt.Sprintf("row %q marked sent, never stored (%s)", r.id, timeline)
		case pe != nil && errors.Is(pe, dedupq.ErrInvalidMessage):
			return "refused row", fmt.Sprintf("valid row %q parked as refused: %v", r.id, pe)
		case pe != nil && len(handed) == 0 && !s.maybe[r.id]:
			return "maybe sent", fmt.Sprintf("row %q parked as maybe sent, but no relay ever handed it to the broker: %v", r.id, pe)
		case out.pending[r.id] && !blocked[r.group]:
			return "stuck", fmt.Sprintf("row %q neither sent nor parked, and no parked row holds its group back (%s)", r.id, timeline)
		}
	}
	return "", ""
}

// --- the plans ---

// relayMS draws whole milliseconds in [lo, hi].
func relayMS(r *rand.Rand, lo, hi time.Duration) time.Duration {
	lo, hi = lo/time.Millisecond, hi/time.Millisecond
	if hi <= lo {
		return lo * time.Millisecond
	}
	return (lo + time.Duration(r.Int64N(int64(hi-lo+1)))) * time.Millisecond
}

func relayPick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// genRelayPlan draws a plan, biased towards what is tight: a window (or
// TTL) little above the span, the longest ResendFor the relay allows,
// small chunks that make a batch long.
func genRelayPlan(r *rand.Rand) relayPlan {
	p := relayPlan{
		retry: window.RetryPolicy{
			MaxAttempts:    relayPick(r, 1, 2, 2, 3, 4),
			AttemptTimeout: relayMS(r, 50*time.Millisecond, 2*time.Second),
			InitialBackoff: relayPick(r, window.NoBackoff, relayMS(r, time.Millisecond, 500*time.Millisecond)),
			Multiplier:     relayPick(r, 1.0, 2),
			Jitter:         relayPick(r, 0, 0, 0.5),
		},
		margin:   relayPick(r, -1, -1, 0, 0.1),
		maxBatch: relayPick(r, 1, 1, 1, 2, 3, 10),
	}
	span := p.retry.Span()
	protect := time.Duration(float64(span) * relayPick(r, 1.05+r.Float64()/2, 1.05+r.Float64()/2, 1.5+r.Float64()*1.5, 3+r.Float64()*3)).Truncate(time.Millisecond)
	if r.IntN(4) == 0 {
		p.ttl = protect
		p.window = relayPick(r, 0, relayMS(r, 0, span))
	} else {
		p.window = protect
	}
	budget := protect
	if m := p.margin; m >= 0 {
		budget = time.Duration(float64(protect) * (1 - cmp.Or(m, window.DefaultMargin)))
	}
	p.resendFor = relayPick(r, 0, 0, -1, relayMS(r, 0, min(span/2, max(budget-span, 0))), relayMS(r, 0, max(budget-span, 0)))
	n := 2 + r.IntN(6)
	for i := range n {
		row := relayRow{id: fmt.Sprintf("m%d", i+1), group: relayPick(r, "", "", "", "g1", "g2")}
		if i == 1 && r.IntN(8) == 0 {
			row.invalid = true
			row.id = relayPick(r, fmt.Sprintf("m %d", i+1), strings.Repeat("x", 129))
		}
		p.rows = append(p.rows, row)
	}
	p.batchSize = relayPick(r, n, n, 1+r.IntN(n))
	// A lease at least as long as the batch's publish: a shorter one is cut
	// by the relay's real-time timeout, which this clock does not move.
	chunks := (p.batchSize + p.maxBatch - 1) / p.maxBatch
	p.lease = relayPick(r, 0, time.Duration(chunks)*span+relayMS(r, 0, span))
	return p
}

func TestRelaySpanIsATheorem(t *testing.T) {
	target := 2000
	if testing.Short() {
		target = 300
	}
	target = envInt(t, "DEDUPQ_PROPERTY_SCHEDULES", target)
	seed := uint64(envInt(t, "DEDUPQ_PROPERTY_SEED", 23))
	env := newRelayEnv(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	start := time.Now()
	var schedules, refused, withInvalid, crashes, resending, cut int
	first, count := map[string]string{}, map[string]int{}
	for schedules < target {
		p := genRelayPlan(r)
		s := &relaySim{r: rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))}
		out := env.runRelay(ctx, p, s)
		if out.refused != nil {
			refused++
			continue
		}
		schedules++
		if out.resent > 0 {
			resending++
		}
		if s.cuts > 0 {
			cut++
		}
		if slices.ContainsFunc(p.rows, func(x relayRow) bool { return x.invalid }) {
			withInvalid++
		}
		for _, ps := range s.passes {
			if strings.Contains(ps, "crashed") {
				crashes++
			}
		}
		if kind, msg := relayViolation(p, s, out); kind != "" {
			if count[kind]++; count[kind] == 1 {
				first[kind] = fmt.Sprintf("seed %d, schedule %d: %s\nplan: %s\npasses: %s", seed, schedules, msg, p, passLog(s.passes))
			}
		}
	}
	for _, kind := range slices.Sorted(func(yield func(string) bool) {
		for k := range count {
			if !yield(k) {
				return
			}
		}
	}) {
		t.Errorf("%d schedules with a %q violation; the first: %s", count[kind], kind, first[kind])
	}
	t.Logf("%d schedules in %s (%d that resent rows, %d where the relay cut a publish at a row's span or lease end, %d with a row the backend refuses, %d relay crashes); %d plans refused by NewPublisher or NewRelay",
		schedules, time.Since(start).Round(time.Millisecond), resending, cut, withInvalid, crashes, refused)
	if resending == 0 || crashes == 0 || withInvalid == 0 {
		t.Fatal("the exploration is vacuous: no resend, crash or refused row")
	}
}

// passLog is the passes of a schedule, the first ones, for a report.
func passLog(passes []string) string {
	if len(passes) > 12 {
		passes = append(passes[:12:12], fmt.Sprintf("… %d more", len(passes)-12))
	}
	return strings.Join(passes, "; ")
}

// Issue 23, defect 2, with the issue's numbers on mem: window 4s, retry
// span 1.1s (2 attempts of 500ms, 100ms apart), ResendFor 2.1s, so Span
// 3.2s; chunks of one message, four rows. Row b reaches the broker at 0s;
// then, resent behind three slow chunks, it must not reach it again after
// 3.2s.
func TestIssue23Defect2(t *testing.T) {
	env := newRelayEnv(t)
	retry := window.RetryPolicy{MaxAttempts: 2, AttemptTimeout: 500 * time.Millisecond, InitialBackoff: 100 * time.Millisecond, Multiplier: 1}
	slow := attempt{dur: 500 * time.Millisecond, land: -1, lost: true} // times out, never lands
	rejected := attempt{land: -1}                                      // refused at once: not stored, not maybe sent
	landsLost := attempt{dur: 100 * time.Millisecond, lost: true}      // lands at once, its answer is lost
	landsLate := attempt{dur: 500 * time.Millisecond, land: 499 * time.Millisecond}
	rows := []relayRow{{id: "a1"}, {id: "a2"}, {id: "a3"}, {id: "b"}}
	tests := []struct {
		name   string
		lease  time.Duration
		script map[string][]attempt
	}{
		{
			// Pass 1 stores b, loses both answers and releases every
			// row; pass 2 resends them at once, a1–a3 time out.
			name: "released after a failed publish",
			script: map[string][]attempt{
				"a1": {rejected, slow, slow}, "a2": {rejected, slow, slow}, "a3": {rejected, slow, slow},
				"b": {landsLost, landsLost, landsLate},
			},
		},
		{
			// Pass 1 hands every row to the broker and dies within b's
			// attempt; after the lease the next relay resends them all.
			name:  "crash within a chunk, resent after the lease",
			lease: 1500 * time.Millisecond,
			script: map[string][]attempt{
				"a1": {healthy, slow, slow}, "a2": {healthy, slow, slow}, "a3": {healthy, slow, slow},
				"b": {{land: 0, crashAfter: true}, landsLate},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := relayPlan{window: 4 * time.Second, retry: retry, resendFor: 2100 * time.Millisecond, lease: tt.lease,
				batchSize: len(rows), maxBatch: 1, rows: rows}
			s := &relaySim{script: tt.script}
			out := env.runRelay(context.Background(), p, s)
			if out.refused != nil || out.span != 3200*time.Millisecond {
				t.Fatalf("NewRelay: %v, span %s; want it accepted with span 3.2s", out.refused, out.span)
			}
			if kind, msg := relayViolation(p, s, out); kind != "" {
				t.Fatalf("%s: %s\npasses: %s", kind, msg, passLog(s.passes))
			}
			if s.cuts == 0 {
				t.Fatalf("no pass was cut (outbox.ErrSendDeadline); passes: %s", passLog(s.passes))
			}
			t.Logf("b handed to the broker at %v; passes: %s", s.handed["b"], passLog(s.passes))
		})
	}
}
