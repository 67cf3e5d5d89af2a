package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/metric"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
)

// TxFunc does a delivery's writes in tx and returns a small result to keep
// with the key (nil for none). It must neither commit nor roll back tx.
// Its ctx carries tx as well, for code it calls that asks Tx(ctx).
type TxFunc func(ctx context.Context, tx pgx.Tx) (result []byte, err error)

// Outcome says what Do did.
type Outcome struct {
	// Ran is true when fn ran and its writes committed in the same
	// transaction as the key's completion record.
	Ran bool
	// Result is fn's result when Ran, else the result stored by the run
	// that did.
	Result []byte
}

// Do runs fn at most once to completion per key within ttl: in one
// transaction it records key as completed, runs fn, and commits both. If
// the key was completed before, Do does not run fn and reports the stored
// result. The ttl runs from the commit, when the record becomes visible,
// however long fn took, as the startup check assumes; the key may be
// remembered up to a minute longer than ttl, which spares most commits a
// second write of the record. A crash or an error anywhere before the
// commit rolls back fn's writes and the record together, so the
// redelivery runs fn again as if for the first time; a crash after the
// commit leaves both, so the redelivery finds the key completed.
//
// While the transaction is open, its row lock holds the key: a concurrent
// Do on the same key waits for the commit (then reports Completed) or the
// rollback (then runs fn itself). Bound that wait, and a hung holder, with
// lock_timeout and idle_in_transaction_session_timeout on the database or
// role. A key held by a Claim of the dedup.Store API fails with an error
// matching dedup.ErrInProgress; a key recorded with another fingerprint
// fails with a *dedup.ConflictError. fn's own error is returned as it is,
// wrapped in dedup.ErrStoreUnavailable too when the transaction's
// connection broke under fn (the database went away, not fn's logic).
//
// If the commit itself fails without an answer (the connection died), the
// effect may or may not have committed: the error wraps
// dedup.ErrStoreUnavailable, and the redelivery finds out which.
func (s *Store) Do(ctx context.Context, key, fingerprint string, ttl time.Duration, fn TxFunc) (Outcome, error) {
	if key == "" {
		// "" would be one key shared by every caller that has none.
		return Outcome{}, fmt.Errorf("pgstore: do: %w", dedup.ErrEmptyKey)
	}
	if ttl <= 0 {
		return Outcome{}, fmt.Errorf("pgstore: do %q: ttl %s is not positive", key, ttl)
	}
	return s.doTimed(ctx, key, fingerprint, ttl, fn, dedup.StoreTimer{})
}

// doTimed is Do with its statements timed on timer (TxGuard's): the
// transaction's start and the record's take or read as OpClaim, the
// record's completion and the commit as OpComplete, the rollback after fn
// failed as OpRelease; fn's own time is not counted.
func (s *Store) doTimed(ctx context.Context, key, fingerprint string, ttl time.Duration, fn TxFunc, timer dedup.StoreTimer) (Outcome, error) {
	// One claim budget for every attempt of this call, not one each.
	var claimBy time.Time
	if budget, ok := ctx.Value(claimBudgetKey{}).(time.Duration); ok {
		claimBy = time.Now().Add(budget)
	}
	for attempt := 0; ; attempt++ {
		out, again, err := s.do(ctx, claimBy, key, fingerprint, ttl, fn, timer)
		if !again || attempt == 10 {
			return out, err
		}
	}
}

// claimBudgetKey carries, from TxGuard.Wrap to do, how long a delivery
// may still take to claim its key: its claim deadline, less now.
type claimBudgetKey struct{}

func (s *Store) do(ctx context.Context, claimBy time.Time, key, fingerprint string, ttl time.Duration, fn TxFunc, timer dedup.StoreTimer) (out Outcome, again bool, err error) {
	// The claim (the transaction's start and the record's take, or the
	// read of a record already there) ends by claimBy, where TxGuard gave
	// a delivery's claim deadline: a database that answers only after it
	// would let the effect start later than the startup check counts.
	// fn and the commit are not bounded by it.
	claimCtx := ctx
	if !claimBy.IsZero() {
		var cancel context.CancelFunc
		claimCtx, cancel = context.WithDeadline(ctx, claimBy)
		defer cancel()
	}
	claiming := timer.Start(ctx)
	tx, commitFinishes, err := s.begin(claimCtx)
	if err != nil {
		err = fail(ctx, "do", key, err)
		claiming.Done(ctx, dedup.OpClaim, err)
		return Outcome{}, false, err
	}
	// After a commit this is a no-op; on every other path, a panic in fn
	// included, it undoes the record with fn's writes.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	tag, err := tx.Exec(claimCtx, s.takeSQL, s.ns, key, claimtoken.New(fingerprint), fingerprint, micros(ttl))
	if err != nil {
		err = fail(ctx, "do", key, err)
		claiming.Done(ctx, dedup.OpClaim, err)
		return Outcome{}, retryable(err), err
	}
	if tag.RowsAffected() == 0 {
		var completed, free bool
		var storedFP string
		var until *time.Time
		var result []byte
		err := tx.QueryRow(claimCtx, s.readSQL, s.ns, key).Scan(&completed, &storedFP, &until, &result, &free)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || (err == nil && free):
			// Deleted or expired between the two statements: start over.
			claiming.Done(ctx, dedup.OpClaim, nil)
			return Outcome{}, true, nil
		case err != nil:
			err = fail(ctx, "do", key, err)
			claiming.Done(ctx, dedup.OpClaim, err)
			return Outcome{}, false, err
		}
		// The statements answered: what they found is a decision, not the
		// store's failure.
		claiming.Done(ctx, dedup.OpClaim, nil)
		state := dedup.InProgress
		if completed {
			state = dedup.Completed
		}
		if storedFP != fingerprint {
			return Outcome{}, false, &dedup.ConflictError{Key: key, Stored: storedFP, Got: fingerprint, StoredWhen: state}
		}
		if !completed {
			return Outcome{}, false, fmt.Errorf("pgstore: do %q (held until %s): %w", key, until, dedup.ErrInProgress)
		}
		return Outcome{Result: result}, false, nil
	}

	claiming.Done(ctx, dedup.OpClaim, nil)

	// ctx carries tx too, so that code fn calls finds it with Tx.
	result, err := fn(context.WithValue(ctx, txKey{}, tx), tx)
	if err != nil {
		// Read before the rollback, which gives a pool's connection back.
		broken := tx.Conn().IsClosed()
		// Rolled back here rather than by the deferred call, to time it:
		// it gives the key back, as a Guard's Release does.
		releasing := timer.Start(ctx)
		rerr := tx.Rollback(context.WithoutCancel(ctx))
		if rerr != nil {
			rerr = fail(ctx, "do: rollback", key, rerr)
		}
		releasing.Done(ctx, dedup.OpRelease, rerr)
		if broken && !errors.Is(err, dedup.ErrStoreUnavailable) {
			// The connection broke under fn: the database failed, not
			// fn, and the retry that ErrStoreUnavailable asks for is
			// safe, since nothing of fn's committed.
			return Outcome{}, false, fail(ctx, "do", key, err)
		}
		return Outcome{}, false, err
	}
	// The take above set expires_at from now(), the transaction's start,
	// plus the TTL and doSlack, but the record only becomes visible at the
	// commit: counted from there, a handler that ran for d would leave
	// ttl + slack − d, and the startup check counts the TTL from the
	// completion. So the commit checks, in the same round trip, that the
	// record still covers clock_timestamp() + ttl, and restarts the TTL
	// from there when it does not (see commitSQL); the epsilon left is
	// the commit itself. A result needs a statement of its own, since the
	// commit's takes no parameters, and so does a DB that cannot begin a
	// transaction with its own commit query.
	if len(result) == 0 {
		result = nil // stored as none
	}
	completing := timer.Start(ctx)
	if err := s.complete(ctx, tx, key, result, ttl, commitFinishes); err != nil {
		completing.Done(ctx, dedup.OpComplete, err)
		return Outcome{}, false, err
	}
	completing.Done(ctx, dedup.OpComplete, nil)
	return Outcome{Ran: true, Result: bytes.Clone(result)}, false, nil
}

// complete records key as completed with result, where the commit does
// not (commitFinishes), and commits tx.
func (s *Store) complete(ctx context.Context, tx pgx.Tx, key string, result []byte, ttl time.Duration, commitFinishes bool) error {
	if result != nil || !commitFinishes {
		tag, err := tx.Exec(ctx, s.finishSQL(), s.ns, key, result, micros(ttl))
		if err != nil {
			return fail(ctx, "do", key, err)
		}
		if tag.RowsAffected() != 1 {
			return errRecordRemoved(key)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42704" && strings.Contains(pgErr.Message, recordRemovedSetting) {
			return errRecordRemoved(key)
		}
		return fail(ctx, "do: commit", key, err)
	}
	return nil
}

// recordRemovedSetting names a setting that nobody sets: Do's commit
// statement reads it to fail, and so not commit, when the handler removed
// the key's record (see commitSQL).
const recordRemovedSetting = "dedupq.the_handler_removed_the_record_of_its_key"

// errRecordRemoved is Do's error when fn deleted the key's record (or
// rewrote its key): committing would keep fn's effect with nothing to
// dedup its redelivery, so Do rolled back.
func errRecordRemoved(key string) error {
	return fmt.Errorf("pgstore: do %q: the handler's transaction removed the key's record; rolled back", key)
}

// txBeginner is the part of *pgxpool.Pool (and *pgx.Conn) that lets Do's
// commit restart the TTL in the same round trip (see commitSQL).
type txBeginner interface {
	BeginTx(ctx context.Context, o pgx.TxOptions) (pgx.Tx, error)
}

// begin starts Do's transaction, whose Commit also restarts the record's
// TTL when the DB lets it choose the commit query (commitFinishes).
func (s *Store) begin(ctx context.Context) (tx pgx.Tx, commitFinishes bool, err error) {
	if b, ok := s.db.(txBeginner); ok {
		commit := s.commitSQL
		if s.sessionStatements {
			commit = s.commitPreparedSQL
		}
		tx, err = b.BeginTx(ctx, pgx.TxOptions{CommitQuery: commit})
		if err != nil || !s.sessionStatements {
			return tx, true, err
		}
		// pgx prepares a name once per connection, and then answers
		// from its own record.
		if _, err := tx.Conn().Prepare(ctx, s.finishStmtName, s.finishStmtSQL); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, false, err
		}
		return tx, true, nil
	}
	tx, err = s.db.Begin(ctx)
	return tx, false, err
}

// finishSQL completes Do's record just before the commit when the commit
// statement cannot: it stores the result ($3, NULL for none) and makes the
// TTL ($4 microseconds) run at least from the statement's own clock, not
// the transaction's start. It keeps a later expires_at (the take's slack),
// so that the commit statement, where there is one, finds nothing to
// restart, and the update leaves the indexed column alone. It is built here
// rather than beside the other statements, and on each call: a few bytes
// beside a round trip, and pgx caches the prepared statement by its text.
func (s *Store) finishSQL() string {
	return "UPDATE " + s.table + ` SET result = $3,
	expires_at = greatest(expires_at, clock_timestamp() + $4 * interval '1 microsecond')
WHERE namespace = $1 AND key = $2`
}

type txKey struct{}

// ErrNoTx is Tx's error for a context that carries no transaction: the
// code asking for one does not run under a TxGuard or inside Do. Writing
// through the pool instead would commit the effect apart from the dedup
// record, and lose exactly-once without a word.
var ErrNoTx = errors.New("pgstore: no transaction in the context: the handler does not run under a pgstore.TxGuard " +
	"(set one as dedupq.ConsumerOptions.Dedup, or call its Wrap) or inside Store.Do; " +
	"writing through the pool instead would commit the effect apart from its dedup record")

// Tx returns the transaction that TxGuard or Do runs the caller in, so
// that the effect's writes commit with the key's record. Use it for every
// write of the effect, and neither commit nor roll it back:
//
//	tx, err := pgstore.Tx(ctx)
//	if err != nil {
//		return err
//	}
//	_, err = tx.Exec(ctx, `INSERT INTO charges …`)
//
// Outside a TxGuard or Do it returns ErrNoTx; a handler that returns it is
// nacked, so a consumer set up without the guard fails loudly on its first
// delivery instead of writing without a dedup record.
func Tx(ctx context.Context) (pgx.Tx, error) {
	if tx, ok := ctx.Value(txKey{}).(pgx.Tx); ok {
		return tx, nil
	}
	return nil, ErrNoTx
}

// TxGuard is a dedupq.Deduplicator that runs each handler inside Do: the
// handler finds its transaction with Tx(ctx), and its writes commit with
// the delivery's dedup record. Set it as ConsumerOptions.Dedup.
type TxGuard struct {
	store       *Store
	ttl         time.Duration
	fingerprint func(*dedupq.Message) string
	clock       clock.Clock
	decisions   dedup.DecisionCounter
	timer       dedup.StoreTimer
	stats       struct {
		ran, failed, suppressed, deferred, conflicts, unavailable, emptyKey atomic.Uint64
	}
}

var (
	_ dedupq.Deduplicator = (*TxGuard)(nil)
	_ dedupq.Checker      = (*TxGuard)(nil)
)

// TxGuardOptions configure a TxGuard.
type TxGuardOptions struct {
	// TTL is how long a completed key is remembered, from its commit
	// (up to a minute longer, see Store.Do); it must cover the redelivery
	// span (the Consumer checks). Required.
	TTL time.Duration
	// Fingerprint identifies a message's payload, so that a key reused
	// for another payload is reported instead of skipped; nil means
	// dedup.BodyFingerprint, as for the Guard.
	Fingerprint func(*dedupq.Message) string
	// MeterProvider receives the TxGuard's decisions as
	// dedupq.dedup.decisions with dedupq.store=pgstore, as a Guard's, and
	// the time of its statements as dedupq.store.duration (the
	// transaction's start and the record's take as op claim, the record's
	// completion and the commit as complete, the rollback after a failed
	// handler as release); nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Clock reads a delivery's claim deadline (dedupq.Delivery's
	// ClaimDeadline, from the Consumer's clock); nil means the real
	// clock. Give it the Consumer's.
	Clock clock.Clock
}

// NewTxGuard returns a TxGuard on s.
func NewTxGuard(s *Store, o TxGuardOptions) (*TxGuard, error) {
	if o.TTL <= 0 {
		return nil, fmt.Errorf("pgstore: TxGuard TTL %s is not positive", o.TTL)
	}
	if o.Fingerprint == nil {
		o.Fingerprint = dedup.BodyFingerprint
	}
	return &TxGuard{store: s, ttl: o.TTL, fingerprint: o.Fingerprint, clock: clock.Or(o.Clock),
		decisions: dedup.NewDecisionCounter(o.MeterProvider, s), timer: dedup.NewStoreTimer(o.MeterProvider, s)}, nil
}

// TTL implements dedupq.Deduplicator.
func (g *TxGuard) TTL() time.Duration { return g.ttl }

// Check implements dedupq.Checker, so that dedupq.NewConsumer fails at
// startup when the database cannot be reached or the table is missing,
// instead of nacking every delivery. An error wraps dedup.ErrNotReady.
func (g *TxGuard) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := g.store.Check(ctx); err != nil {
		return fmt.Errorf("%w: %w", dedup.ErrNotReady, err)
	}
	return nil
}

// Stats returns what the TxGuard did so far, in the Guard's terms: Ran
// (committed with its record), Suppressed, Deferred, Conflicts,
// Unavailable, EmptyKey, and Failed for a handler error or a failed
// commit (rolled back, so nothing was recorded). Bypassed and Unrecorded
// stay zero: a TxGuard never runs without a decision, and its record
// commits with the handler's writes or not at all.
func (g *TxGuard) Stats() dedup.Stats {
	s := &g.stats
	return dedup.Stats{Ran: s.ran.Load(), Failed: s.failed.Load(), Suppressed: s.suppressed.Load(),
		Deferred: s.deferred.Load(), Conflicts: s.conflicts.Load(), Unavailable: s.unavailable.Load(),
		EmptyKey: s.emptyKey.Load()}
}

func (g *TxGuard) count(ctx context.Context, out Outcome, err error) {
	s := &g.stats
	var n *atomic.Uint64
	var d dedup.Decision
	switch {
	case err == nil && out.Ran:
		n, d = &s.ran, dedup.DecisionRan
	case err == nil:
		n, d = &s.suppressed, dedup.DecisionSuppressed
	case errors.Is(err, dedup.ErrInProgress):
		n, d = &s.deferred, dedup.DecisionDeferred
	case errors.Is(err, dedup.ErrFingerprintMismatch):
		n, d = &s.conflicts, dedup.DecisionConflict
	case errors.Is(err, dedup.ErrStoreUnavailable):
		n, d = &s.unavailable, dedup.DecisionUnavailable
	default:
		n, d = &s.failed, dedup.DecisionFailed
	}
	n.Add(1)
	g.decisions.Add(ctx, d)
}

// Wrap implements dedupq.Deduplicator. A delivery whose key completed
// before is acked without running h. One whose key another handler holds
// is nacked (its error matches dedup.ErrInProgress). A key reused with
// another payload is a permanent failure (dedup.ErrFingerprintMismatch):
// no redelivery can make it right. An unreachable database fails it with
// dedup.ErrStoreUnavailable, which a Consumer answers by holding the
// delivery and trying again, never nacking it for that: the delivery is never processed without a
// dedup decision. A delivery without a dedup ID (where the backend gives
// no fallback identity, see its package doc) is nacked with an error
// matching dedup.ErrEmptyKey, for the reasons the Guard gives: it is never
// run under the one key "" that every such delivery would share, and never
// dropped.
func (g *TxGuard) Wrap(h dedupq.Handler) dedupq.Handler {
	return func(ctx context.Context, d *dedupq.Delivery) error {
		if d.Message.ID == "" {
			g.stats.emptyKey.Add(1)
			g.decisions.Add(ctx, dedup.DecisionEmptyKey)
			return fmt.Errorf("pgstore: delivery with backend ID %q (attempt %d): %w", d.BackendID, d.Attempt, dedup.ErrEmptyKey)
		}
		if !d.ClaimDeadline.IsZero() {
			left := d.ClaimDeadline.Sub(g.clock.Now())
			if left <= 0 {
				// It waited too long to claim at all; its Consumer nacks it.
				return fmt.Errorf("pgstore: do %q: past the delivery's claim deadline: %w", d.Message.ID, dedupq.ErrUnavailable)
			}
			ctx = context.WithValue(ctx, claimBudgetKey{}, left)
		}
		out, err := g.store.doTimed(ctx, d.Message.ID, g.fingerprint(&d.Message), g.ttl, func(ctx context.Context, _ pgx.Tx) ([]byte, error) {
			return nil, h(ctx, d) // ctx carries the transaction: see Tx
		}, g.timer)
		g.count(ctx, out, err)
		if errors.Is(err, dedup.ErrFingerprintMismatch) {
			return dedupq.Permanent(err)
		}
		return err
	}
}
