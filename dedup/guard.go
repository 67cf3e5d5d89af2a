package dedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/internal/settlectx"
	"go.opentelemetry.io/otel/metric"
)

// GuardOptions configure a Guard.
type GuardOptions struct {
	// Store records the keys. Required.
	Store Store
	// TTL is how long a completed key is remembered. Required. It must
	// cover the broker's redelivery span, plus the publishers' whole retry
	// span when that span does not fit the broker window (package window's
	// doc has the model); dedupq.NewConsumer checks that.
	TTL time.Duration
	// Lease is how long a claim holds a key before another consumer may
	// take it over. Zero follows the delivery's own lease (the broker's ack
	// wait), falling back to 30s; the Guard extends it while the handler
	// runs.
	Lease time.Duration
	// Key derives the dedup key; nil uses Message.ID, which every adapter
	// fills with a stable broker identity when the message was published
	// without a dedup ID (see each adapter's package doc). A key must
	// never be empty: a delivery whose key is "" is refused with
	// ErrEmptyKey (nacked), never run, skipped or taken for a conflict.
	Key func(*dedupq.Delivery) string
	// Fingerprint derives the payload fingerprint; nil uses BodyFingerprint.
	Fingerprint func(*dedupq.Message) string
	// FailOpen runs the handler without a dedup decision when the store
	// fails, logging every bypass. The default (false) is fail-closed: the
	// delivery is nacked and retried, never processed unguarded.
	FailOpen bool
	// SettleTimeout bounds the Complete and Release calls made after the
	// handler returns, which run even if the handler's context is done.
	// Zero means 10s.
	SettleTimeout time.Duration
	// Clock times lease extension; nil means the real clock.
	Clock clock.Clock
	// Logger receives bypasses, completion failures, refused empty keys,
	// and one line when the store stops answering and one when it answers
	// again; nil means slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the Guard's decisions (dedupq.dedup.decisions)
	// and the store's operation latency and errors (dedupq.store.duration);
	// nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Stats counts what a Guard did. Read them with Guard.Stats.
type Stats struct {
	// Ran counts handler runs that succeeded and were recorded.
	Ran uint64
	// Failed counts handler runs that returned an error (key released).
	Failed uint64
	// Suppressed counts deliveries acked without running the handler,
	// because their key was completed.
	Suppressed uint64
	// Deferred counts deliveries nacked because another handler held their
	// key.
	Deferred uint64
	// Conflicts counts deliveries whose key was recorded with another
	// payload fingerprint (terminated as permanent failures).
	Conflicts uint64
	// Bypassed counts fail-open runs without a dedup decision.
	Bypassed uint64
	// Unrecorded counts handler successes whose completion could not be
	// recorded (the documented gap; see the package doc).
	Unrecorded uint64
	// Unavailable counts claims refused without running the handler
	// because the store could not be asked (fail-closed); a Consumer holds
	// such a delivery and tries again, so one delivery may count often. Fail-open runs count as
	// Bypassed instead.
	Unavailable uint64
	// EmptyKey counts deliveries nacked because their dedup key was empty
	// (ErrEmptyKey).
	EmptyKey uint64
}

// Guard makes a handler idempotent by dedup key: claim, run, complete, then
// ack; release on failure so the redelivery runs. It is safe for concurrent
// use and implements dedupq.Deduplicator.
type Guard struct {
	opts  GuardOptions
	clock clock.Clock
	log   *slog.Logger
	store Store // opts.Store, timed
	// leases extends the claims of the handlers running, on one timer;
	// keepers holds their stopped *claimKeepers for reuse.
	leases  *clock.Scheduler
	keepers sync.Pool
	m       guardMetrics
	stats   struct {
		ran, failed, suppressed, deferred, conflicts, bypassed, unrecorded, unavailable, emptyKey atomic.Uint64
	}
	// down is set while the store is failing claims, so that the outage is
	// logged once when it starts and once when it ends, not per delivery.
	// outage counts outages, so that only a claim begun during the current
	// one can declare it over (one begun before may answer late).
	down   atomic.Bool
	outage atomic.Uint64
}

var (
	_ dedupq.Deduplicator = (*Guard)(nil)
	_ dedupq.Checker      = (*Guard)(nil)
)

// checkTimeout bounds Check when the caller's context has no earlier
// deadline: a store behind a dropped route would otherwise hold up startup
// for as long as the OS takes to give up on the connection.
const checkTimeout = 15 * time.Second

// NewGuard checks opts and returns a Guard.
func NewGuard(opts GuardOptions) (*Guard, error) {
	if opts.Store == nil {
		return nil, errors.New("dedup: GuardOptions.Store is required")
	}
	if opts.TTL <= 0 {
		return nil, errors.New("dedup: GuardOptions.TTL is required: how long a completed key is remembered")
	}
	if opts.Lease < 0 {
		return nil, fmt.Errorf("dedup: negative lease %s", opts.Lease)
	}
	if opts.SettleTimeout <= 0 {
		opts.SettleTimeout = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	gm, meter := newGuardMetrics(opts.MeterProvider, opts.Store)
	store := newTimedStore(opts.Store, meter, gm.store)
	c := clock.Or(opts.Clock)
	return &Guard{opts: opts, clock: c, log: log, store: store, leases: clock.NewScheduler(c), m: gm}, nil
}

// TTL is how long a completed key is remembered.
func (g *Guard) TTL() time.Duration { return g.opts.TTL }

// Stats returns the counters so far.
func (g *Guard) Stats() Stats {
	s := &g.stats
	return Stats{
		Ran: s.ran.Load(), Failed: s.failed.Load(), Suppressed: s.suppressed.Load(),
		Deferred: s.deferred.Load(), Conflicts: s.conflicts.Load(),
		Bypassed: s.bypassed.Load(), Unrecorded: s.unrecorded.Load(),
		Unavailable: s.unavailable.Load(), EmptyKey: s.emptyKey.Load(),
	}
}

// Check reports whether the store is ready, if the store can tell (it
// implements Checker; a store that cannot is taken as ready).
// dedupq.NewConsumer calls it, so that a store that is down or not set up
// fails the consumer's startup with an error that says what to do, instead
// of every delivery being nacked. An error wraps ErrNotReady and the
// store's error.
//
// With FailOpen, a store that cannot be reached (ErrStoreUnavailable) is
// logged and tolerated, since the Guard was told to run handlers without
// it; a store that answers but is not set up still fails, because that
// outage would never end by itself.
func (g *Guard) Check(ctx context.Context) error {
	c, ok := g.opts.Store.(Checker)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	err := c.Check(ctx)
	if err == nil {
		return nil
	}
	if g.opts.FailOpen && errors.Is(err, ErrStoreUnavailable) {
		g.log.Warn("dedup: store unreachable at startup; handlers will run without a dedup decision until it answers (FailOpen)", "err", err)
		return nil
	}
	return fmt.Errorf("%w: %w", ErrNotReady, err)
}

// BodyFingerprint is the default payload fingerprint: the hex SHA-256 of
// the body.
func BodyFingerprint(m *dedupq.Message) string {
	sum := sha256.Sum256(m.Body)
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], sum[:])
	return string(buf[:]) // one allocation, where hex.EncodeToString makes two
}

func (g *Guard) lease(d *dedupq.Delivery) time.Duration {
	switch {
	case g.opts.Lease > 0:
		return g.opts.Lease
	case d.Lease > 0:
		return d.Lease
	}
	return 30 * time.Second
}

// Wrap returns h guarded by the store. The returned handler:
//   - nacks with ErrEmptyKey, without running h or asking the store, when
//     the delivery's key is empty (see refuseEmptyKey);
//   - fails with ErrStoreUnavailable when the store cannot be asked
//     (unless FailOpen), which a Consumer answers by holding the delivery
//     and trying again (see dedupq.ErrUnavailable), counting it in
//     Stats.Unavailable and logging once
//     when such an outage starts and once when it ends;
//   - acks (returns nil) without running h when the key is completed;
//   - nacks with ErrInProgress, delayed until the holder's lease ends, when
//     another handler holds the key — acking it would lose the message if
//     that holder crashed;
//   - terminates with a *ConflictError when the key was recorded with
//     another payload;
//   - otherwise runs h under a claim that is extended while h runs, then
//     records completion before returning nil, or releases the key and
//     returns h's error.
func (g *Guard) Wrap(h dedupq.Handler) dedupq.Handler {
	return func(ctx context.Context, d *dedupq.Delivery) error {
		key := d.Message.ID
		if g.opts.Key != nil {
			key = g.opts.Key(d)
		}
		if key == "" {
			return g.refuseEmptyKey(d)
		}
		fp := BodyFingerprint
		if g.opts.Fingerprint != nil {
			fp = g.opts.Fingerprint
		}
		fingerprint := fp(&d.Message)
		lease := g.lease(d)

		wasDown, outage := g.down.Load(), g.outage.Load()
		c, err := g.claim(ctx, d, key, fingerprint, lease)
		if err != nil {
			if err == errPastClaimDeadline {
				// Not the store's fault: the delivery waited too long to
				// claim at all. Its Consumer nacks it (ErrUnavailable,
				// past the deadline).
				return fmt.Errorf("dedup: claim %q: %w: %w", key, errPastClaimDeadline, dedupq.ErrUnavailable)
			}
			if ctx.Err() != nil {
				// The consumer is shutting down, not the store: the
				// delivery goes back, and nothing is said about the store.
				return fmt.Errorf("dedup: claim %q: %w", key, err)
			}
			g.storeDown(err)
			if g.opts.FailOpen {
				g.count(ctx, &g.stats.bypassed, outcomeBypassed)
				g.log.Warn("dedup: store failed; running the handler without a dedup decision (FailOpen)", "key", key, "err", err)
				return h(ctx, d)
			}
			g.count(ctx, &g.stats.unavailable, outcomeUnavailable)
			return fmt.Errorf("%w: claim %q: %w", ErrStoreUnavailable, key, err)
		}
		if wasDown {
			g.storeUp(outage)
		}
		if c.State != Acquired && c.Fingerprint != "" && c.Fingerprint != fingerprint {
			g.count(ctx, &g.stats.conflicts, outcomeConflict)
			return dedupq.Permanent(&ConflictError{Key: key, Stored: c.Fingerprint, Got: fingerprint, StoredWhen: c.State})
		}
		switch c.State {
		case Completed:
			g.count(ctx, &g.stats.suppressed, outcomeSuppressed)
			return nil
		case InProgress:
			g.count(ctx, &g.stats.deferred, outcomeDeferred)
			wait := min(max(c.LeaseUntil.Sub(g.clock.Now()), 100*time.Millisecond), lease)
			return dedupq.RetryAfter(ErrInProgress, wait)
		case Acquired:
		default:
			return fmt.Errorf("dedup: store returned unknown claim state %v", c.State)
		}
		return g.run(ctx, h, d, key, c.Token, lease)
	}
}

// errPastClaimDeadline is the cause of a claim not made, or abandoned,
// because the delivery's claim deadline had passed.
var errPastClaimDeadline = errors.New("past the delivery's claim deadline")

// claim asks the store for key, bounded by the delivery's claim deadline
// (dedupq.Delivery.ClaimDeadline): a store that answers only after it
// would let the effect start later than the startup check counts. The
// store's answer after the deadline is abandoned; a claim it granted
// meanwhile lapses with its lease.
func (g *Guard) claim(ctx context.Context, d *dedupq.Delivery, key, fingerprint string, lease time.Duration) (Claim, error) {
	if d.ClaimDeadline.IsZero() {
		return g.store.Claim(ctx, key, fingerprint, lease)
	}
	left := d.ClaimDeadline.Sub(g.clock.Now())
	if left <= 0 {
		return Claim{}, errPastClaimDeadline
	}
	cctx, cancel := context.WithTimeoutCause(ctx, left, errPastClaimDeadline)
	defer cancel()
	c, err := g.store.Claim(cctx, key, fingerprint, lease)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		err = fmt.Errorf("%w: %w", errPastClaimDeadline, err)
	}
	return c, err
}

// refuseEmptyKey nacks a delivery whose key is empty. Not a terminate: the
// message is fine, the key derivation is not (a custom Key that misses an
// attribute, a backend without a fallback identity), and once that is
// fixed the redelivery runs; a terminate would drop or dead-letter a
// message nobody ran. Not a claim of "": that key is shared by every such
// delivery, so all but the first would be acked unrun or terminated as
// conflicts. The nack follows the broker's own backoff.
func (g *Guard) refuseEmptyKey(d *dedupq.Delivery) error {
	g.count(context.Background(), &g.stats.emptyKey, outcomeEmptyKey)
	g.log.Error("dedup: delivery has an empty dedup key; nacking it unrun (set Message.ID when publishing, or make GuardOptions.Key return a non-empty key)",
		"backend_id", d.BackendID, "attempt", d.Attempt, "custom_key", g.opts.Key != nil)
	return fmt.Errorf("%w: delivery with backend ID %q (attempt %d): no dedup ID, and no key could be derived", ErrEmptyKey, d.BackendID, d.Attempt)
}

// count adds one to a Stats counter and to the matching decision metric.
func (g *Guard) count(ctx context.Context, n *atomic.Uint64, outcome string) {
	n.Add(1)
	g.m.add(ctx, outcome)
}

// storeDown notes a failed claim, logging once per outage.
func (g *Guard) storeDown(err error) {
	if g.down.CompareAndSwap(false, true) {
		g.outage.Add(1)
		what := "nacking deliveries until it answers again (fail-closed)"
		if g.opts.FailOpen {
			what = "running handlers without a dedup decision until it answers again (FailOpen)"
		}
		g.log.Error("dedup: store unavailable; "+what, "err", err)
	}
}

// storeUp notes a claim that succeeded after it began during an outage,
// logging the end of the outage once.
func (g *Guard) storeUp(outage uint64) {
	if g.outage.Load() == outage && g.down.CompareAndSwap(true, false) {
		s := g.Stats()
		g.log.Info("dedup: store answering again; deliveries are processed", "unavailable_total", s.Unavailable, "bypassed_total", s.Bypassed)
	}
}

// run executes h under an acquired claim and settles the claim.
func (g *Guard) run(ctx context.Context, h dedupq.Handler, d *dedupq.Delivery, key, token string, lease time.Duration) (err error) {
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	claim := g.keepClaimed(hctx, cancel, key, token, lease)
	defer g.keepers.Put(claim) // deferred first: runs after the release below
	// The settle context is made once h has returned: SettleTimeout bounds
	// the completion or release, and a handler that ran longer than it
	// must still have its success recorded or its key freed.
	var sctx *settlectx.Ctx
	defer func() {
		if sctx != nil {
			sctx.Release()
		}
	}()

	completed := false
	defer func() {
		// Runs on error and on panic alike: the key must not stay held
		// by a handler that did not finish.
		if completed || claim.stopAndLost() {
			return
		}
		sctx = settlectx.New(ctx, g.opts.SettleTimeout)
		if rerr := g.store.Release(sctx, key, token); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			g.log.Warn("dedup: releasing a key after a failed handler failed; it frees itself when the lease ends", "key", key, "err", rerr)
		}
	}()

	if err = h(hctx, d); err != nil {
		g.count(ctx, &g.stats.failed, outcomeFailed)
		return err
	}
	completed = true
	if claim.stopAndLost() {
		// Another consumer took the key over while h ran: its run may
		// repeat the effect. Nothing here can undo that; say so.
		g.count(ctx, &g.stats.unrecorded, outcomeUnrecorded)
		g.log.Error("dedup: lease lost while the handler ran; another consumer may repeat the effect", "key", key)
		return nil
	}
	sctx = settlectx.New(ctx, g.opts.SettleTimeout)
	var cerr error
	for i := range 3 {
		if cerr = g.store.Complete(sctx, key, token, g.opts.TTL, nil); cerr == nil || errors.Is(cerr, ErrLeaseLost) {
			break
		}
		if !clock.Sleep(g.clock, 50*time.Millisecond<<i, sctx.Done()) {
			break
		}
	}
	if cerr != nil {
		// The effect happened; nacking would make the redelivery repeat
		// it for sure, acking only leaves the key unrecorded.
		g.count(ctx, &g.stats.unrecorded, outcomeUnrecorded)
		g.log.Error("dedup: handler succeeded but its completion was not recorded; a duplicate after the lease ends would run again",
			"key", key, "err", cerr)
		return nil
	}
	g.count(ctx, &g.stats.ran, outcomeRan)
	return nil
}

// claimKeeper extends a claim every third of its lease while its handler
// runs, on the Guard's Scheduler: no timer or goroutine per delivery. If
// the claim is lost it cancels the handler's context with ErrLeaseLost.
type claimKeeper struct {
	clock.Job
	tick       func() bool // k.extend, bound once: keepers are reused
	g          *Guard
	ctx        context.Context
	cancel     context.CancelCauseFunc
	key, token string
	lease      time.Duration
	lost       atomic.Bool
}

// keepClaimed starts extending the claim until stopAndLost is called.
func (g *Guard) keepClaimed(ctx context.Context, cancel context.CancelCauseFunc, key, token string, lease time.Duration) *claimKeeper {
	k, _ := g.keepers.Get().(*claimKeeper)
	if k == nil {
		k = &claimKeeper{g: g}
		k.tick = k.extend
	}
	k.ctx, k.cancel, k.key, k.token, k.lease = ctx, cancel, key, token, lease
	k.lost.Store(false)
	g.leases.Repeat(&k.Job, lease/3, k.tick)
	return k
}

func (k *claimKeeper) extend() bool {
	err := k.g.store.Extend(k.ctx, k.key, k.token, k.lease)
	if errors.Is(err, ErrLeaseLost) {
		k.lost.Store(true)
		k.cancel(ErrLeaseLost)
		return false
	}
	if err != nil && k.ctx.Err() == nil {
		k.g.log.Warn("dedup: extending a claim failed; retrying", "key", k.key, "err", err)
	}
	return true
}

// stopAndLost stops extending (waiting for an extension in progress) and
// reports whether the claim was lost. Once stopped, k may go back to
// g.keepers: the Job runs nothing of a stopped repetition.
func (k *claimKeeper) stopAndLost() bool {
	k.Stop()
	k.ctx, k.cancel = nil, nil // not kept alive by the pool
	return k.lost.Load()
}
