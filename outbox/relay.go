package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/window"
)

// Options configure a Relay. The zero value is usable.
type Options struct {
	// Table is the outbox table, optionally schema-qualified; "" means
	// DefaultTable.
	Table string
	// BatchSize caps the rows claimed and published together; 0 means 100.
	BatchSize int
	// ConsumerDedupTTL declares, as PublisherOptions.ConsumerDedupTTL does,
	// that the consumers run consumer-side dedup remembering keys this
	// long; a resend that does not fit the broker window must then fit it.
	ConsumerDedupTTL time.Duration
	// Margin is the share of the window or TTL kept free, as in
	// PublisherOptions: 0 means window.DefaultMargin, negative means none.
	Margin float64
	// ResendFor is how long after a row's first send attempt a relay may
	// still resend it (after a crash or a failed publish). 0 means as long
	// as the protection allows: the usable window (or TTL) less the
	// publisher's retry span. A negative value means never resend.
	ResendFor time.Duration
	// Lease is how long a claimed row is reserved for the relay that
	// claimed it, and bounds its publish; 0 means the retry span plus 30s.
	Lease time.Duration
	// PollInterval is the longest wait between looks at the table when no
	// notification arrives (leases that lapse wake nobody); 0 means 5s.
	PollInterval time.Duration
	// KeepSent is how long sent rows are kept before Run sweeps them; 0
	// means 24h.
	KeepSent time.Duration
	// OnParked, when set, is called for every row the relay parks.
	OnParked func(*ParkedError)
	// OnError, when set, is called with errors Run recovers from (a
	// failed claim, publish or mark); Run goes on after a PollInterval.
	OnError func(error)
	// Clock stamps first attempts, leases and ages; nil means the real
	// clock. All relays on one table should agree on the time.
	Clock clock.Clock
}

// Relay publishes an outbox table's committed rows through a Publisher.
// Several relays, in one process or many, may share a table.
type Relay struct {
	pool      *pgxpool.Pool
	pub       *dedupq.Publisher
	opts      Options
	table     string
	clock     clock.Clock
	retrySpan time.Duration
	resendFor time.Duration
	lease     time.Duration

	sent, parked, resent, dups atomic.Int64
	// hook, set by tests only, is called at each step of a batch.
	hook func(step string)
}

// ParkedError reports a row the relay would not resend because its resend
// could land outside the protection, and what to do about it.
type ParkedError struct {
	// RowID is the row's id in the outbox table.
	RowID int64
	// MessageID is the message's dedup ID.
	MessageID string
	// Age is how long ago the row's first send attempt was.
	Age time.Duration
	// ResendFor is how long after the first attempt a resend is allowed.
	ResendFor time.Duration
	// Table is the outbox table (quoted).
	Table string
}

func (e *ParkedError) Error() string {
	return fmt.Sprintf("outbox: row %d (message %q) parked: its first send attempt was %s ago, and a resend is only "+
		"protected from duplicates up to %s after it. It may or may not have been stored. Check whether the consumers got "+
		"message %q: if they did, mark it sent (UPDATE %s SET sent_at = now(), parked_at = NULL WHERE id = %d); if not, "+
		"send it again as new (UPDATE %s SET parked_at = NULL, first_attempt_at = NULL, attempts = 0 WHERE id = %d). "+
		"To resend later rows automatically, raise the broker window or declare Options.ConsumerDedupTTL.",
		e.RowID, e.MessageID, window.FormatDuration(e.Age.Round(time.Millisecond)), window.FormatDuration(e.ResendFor), e.MessageID,
		e.Table, e.RowID, e.Table, e.RowID)
}

// Stats counts what a Relay did since it was made.
type Stats struct {
	// Sent counts rows published and marked sent.
	Sent int64
	// Parked counts rows parked rather than resent.
	Parked int64
	// Resent counts rows published again after an earlier attempt.
	Resent int64
	// Duplicates counts rows the broker reported as already stored:
	// resends that the window made harmless.
	Duplicates int64
}

func marginOf(m float64) float64 {
	switch {
	case m == 0:
		return window.DefaultMargin
	case m < 0 || m != m:
		return 0
	case m >= 1:
		return 0.99
	}
	return m
}

// NewRelay returns a relay that publishes the rows of opts.Table through
// pub. It fails, with a *window.UnsafeRetryError and the fix, when the
// relay's worst-case span (Span) does not fit the broker window less the
// margin nor the declared ConsumerDedupTTL. It does no I/O; the table must
// exist (EnsureSchema).
func NewRelay(pool *pgxpool.Pool, pub *dedupq.Publisher, opts Options) (*Relay, error) {
	t, err := tableIdent(opts.Table)
	if err != nil {
		return nil, err
	}
	retry := pub.RetryPolicy()
	w := pub.Window()
	m := marginOf(opts.Margin)
	var budget time.Duration
	if w.Protects() {
		budget = time.Duration(float64(w.Duration) * (1 - m))
	}
	budget = max(budget, time.Duration(float64(opts.ConsumerDedupTTL)*(1-m)))
	retrySpan := retry.Span()
	resendFor := opts.ResendFor
	switch {
	case resendFor < 0:
		resendFor = 0
	case resendFor == 0:
		resendFor = max(budget-retrySpan, 0)
	}
	err = window.CheckPublisher(window.PublisherPlan{
		Retry: retry, HiddenSpan: resendFor, Window: w, DedupTTL: opts.ConsumerDedupTTL, Margin: opts.Margin,
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: the relay's span %s (retry span %s + Options.ResendFor %s) is not covered; "+
			"lower Options.ResendFor to ≤ %s, or see the fixes: %w", window.FormatDuration(retrySpan+resendFor),
			window.FormatDuration(retrySpan), window.FormatDuration(resendFor),
			window.FormatDuration(max(budget-retrySpan, 0)), err)
	}
	lease := opts.Lease
	if lease <= 0 {
		lease = retrySpan + 30*time.Second
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = 100
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 5 * time.Second
	}
	if opts.KeepSent <= 0 {
		opts.KeepSent = 24 * time.Hour
	}
	return &Relay{
		pool: pool, pub: pub, opts: opts, table: t, clock: clock.Or(opts.Clock),
		retrySpan: retrySpan, resendFor: resendFor, lease: lease,
	}, nil
}

// Span is the relay's worst-case span from a row's first send attempt to
// the last attempt of its last resend: declare it on the consumers as
// ConsumerOptions.PublisherSpan.
func (r *Relay) Span() time.Duration { return r.retrySpan + r.resendFor }

// Stats returns what the relay did so far.
func (r *Relay) Stats() Stats {
	return Stats{Sent: r.sent.Load(), Parked: r.parked.Load(), Resent: r.resent.Load(), Duplicates: r.dups.Load()}
}

// Enqueue is the package's Enqueue into the relay's table, checking msgs
// against the publisher's backend limits too (Publisher.Validate).
func (r *Relay) Enqueue(ctx context.Context, tx pgx.Tx, msgs ...*dedupq.Message) error {
	if err := r.pub.Validate(msgs...); err != nil {
		return errors.Join(ErrInvalid, err)
	}
	return insert(ctx, tx, r.opts.Table, msgs)
}

type row struct {
	id       int64
	msg      dedupq.Message
	first    time.Time
	attempts int
}

func (r *Relay) step(s string) {
	if r.hook != nil {
		r.hook(s)
	}
}

// RunOnce claims one batch of rows, publishes them and marks them sent,
// and returns how many rows it published or tried to (not those it
// parked). The
// publish is bounded by the lease, not by ctx, once it has begun, so that
// a shutdown does not leave a row published and unmarked.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	rows, err := r.claim(ctx)
	if err != nil || len(rows) == 0 {
		return len(rows), err
	}
	r.step("claimed")
	msgs := make([]*dedupq.Message, len(rows))
	for i := range rows {
		msgs[i] = &rows[i].msg
		if rows[i].attempts > 1 {
			r.resent.Add(1)
		}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.lease)
	defer cancel()
	results, perr := r.pub.PublishBatch(pctx, msgs)
	r.step("published")
	var sent, failed []int64
	for i, row := range rows {
		if perr == nil || (i < len(results) && results[i].Err == nil) {
			sent = append(sent, row.id)
			if i < len(results) && results[i].Duplicate {
				r.dups.Add(1)
			}
		} else {
			failed = append(failed, row.id)
		}
	}
	now := r.clock.Now()
	_, err = r.pool.Exec(pctx, fmt.Sprintf(`UPDATE %s SET sent_at = $1, claimed_until = NULL WHERE id = ANY($2);
`, r.table), now, sent)
	if err != nil {
		return len(rows), fmt.Errorf("outbox: marking %d rows sent: %w", len(sent), err)
	}
	r.sent.Add(int64(len(sent)))
	r.step("marked")
	if len(failed) > 0 {
		// Released rows are tried again at once; their first attempt stays
		// recorded, so the retry is a resend and its age is checked.
		if _, err := r.pool.Exec(pctx, fmt.Sprintf(`UPDATE %s SET claimed_until = NULL WHERE id = ANY($1)`, r.table), failed); err != nil {
			return len(rows), errors.Join(perr, fmt.Errorf("outbox: releasing rows: %w", err))
		}
		return len(rows), fmt.Errorf("outbox: publishing %d of %d rows failed: %w", len(failed), len(rows), perr)
	}
	return len(rows), nil
}

// claim takes up to BatchSize eligible rows: unsent, not parked, not
// leased, and first of their group among unsent rows. Their first attempt
// is stamped and the claim committed before anything is published, so a
// crash after it leaves the age of any resend known. Rows whose resend
// would be unprotected are parked in the same transaction.
func (r *Relay) claim(ctx context.Context) ([]row, error) {
	now := r.clock.Now()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	q := fmt.Sprintf(`WITH c AS (
	SELECT o.id FROM %[1]s o
	WHERE o.sent_at IS NULL AND o.parked_at IS NULL
	  AND (o.claimed_until IS NULL OR o.claimed_until <= $1)
	  AND (o.group_key = '' OR NOT EXISTS (
	      SELECT 1 FROM %[1]s p WHERE p.group_key = o.group_key AND p.id < o.id AND p.sent_at IS NULL))
	ORDER BY o.id LIMIT $3
	FOR UPDATE OF o SKIP LOCKED)
UPDATE %[1]s o SET claimed_until = $2, first_attempt_at = COALESCE(o.first_attempt_at, $1), attempts = o.attempts + 1
FROM c WHERE o.id = c.id
RETURNING o.id, o.msg_id, o.group_key, o.body, o.attributes::text, o.first_attempt_at, o.attempts`, r.table)
	rs, err := tx.Query(ctx, q, now, now.Add(r.lease), r.opts.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	var rows []row
	for rs.Next() {
		var x row
		var attrs *string
		if err := rs.Scan(&x.id, &x.msg.ID, &x.msg.GroupKey, &x.msg.Body, &attrs, &x.first, &x.attempts); err != nil {
			rs.Close()
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		if attrs != nil {
			if err := json.Unmarshal([]byte(*attrs), &x.msg.Attributes); err != nil {
				rs.Close()
				return nil, fmt.Errorf("outbox: row %d attributes: %w", x.id, err)
			}
		}
		rows = append(rows, x)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	// RETURNING of an UPDATE … FROM gives no order: restore the ids' order.
	sortRows(rows)
	var keep []row
	var parked []*ParkedError
	for _, x := range rows {
		// attempts > 1: an earlier claim may have published the row.
		if age := now.Sub(x.first); x.attempts > 1 && age > r.resendFor {
			parked = append(parked, &ParkedError{RowID: x.id, MessageID: x.msg.ID, Age: age, ResendFor: r.resendFor, Table: r.table})
			continue
		}
		keep = append(keep, x)
	}
	for _, p := range parked {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET parked_at = $1, claimed_until = NULL, park_reason = $2 WHERE id = $3`, r.table),
			now, p.Error(), p.RowID); err != nil {
			return nil, fmt.Errorf("outbox: parking row %d: %w", p.RowID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	for _, p := range parked {
		r.parked.Add(1)
		if r.opts.OnParked != nil {
			r.opts.OnParked(p)
		}
	}
	return keep, nil
}

func sortRows(rows []row) {
	for i := 1; i < len(rows); i++ {
		for j := i; j > 0 && rows[j].id < rows[j-1].id; j-- {
			rows[j], rows[j-1] = rows[j-1], rows[j]
		}
	}
}

// Sweep deletes rows sent more than KeepSent ago and returns how many.
func (r *Relay) Sweep(ctx context.Context) (int64, error) {
	tag, err := r.pool.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE sent_at < $1`, r.table), r.clock.Now().Add(-r.opts.KeepSent))
	if err != nil {
		return 0, fmt.Errorf("outbox: sweep: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Run relays until ctx ends: it publishes batches while rows are ready,
// then waits for a NOTIFY from Enqueue or PollInterval, and sweeps sent
// rows about every KeepSent/24. When ctx ends, the batch in progress is
// finished (bounded by the lease) and Run returns nil.
//
// Run starts with Check: a table that is missing or lacks a column fails
// Run at once with the fix, instead of failing every batch until someone
// reads OnError.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Check(ctx); err != nil {
		return err
	}
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("outbox: listen: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel(r.opts.Table)}.Sanitize()); err != nil {
		return fmt.Errorf("outbox: listen: %w", err)
	}
	defer func() {
		// The connection goes back to the pool: stop listening on it.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "UNLISTEN *")
	}()
	sweepEvery := r.opts.KeepSent / 24
	nextSweep := r.clock.Now()
	for ctx.Err() == nil {
		n, err := r.RunOnce(ctx)
		if err != nil && ctx.Err() == nil && r.opts.OnError != nil {
			r.opts.OnError(err)
		}
		if now := r.clock.Now(); !now.Before(nextSweep) {
			if _, err := r.Sweep(ctx); err != nil && ctx.Err() == nil && r.opts.OnError != nil {
				r.opts.OnError(err)
			}
			nextSweep = now.Add(sweepEvery)
		}
		if err == nil && n >= r.opts.BatchSize {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, r.opts.PollInterval)
		_, werr := conn.Conn().WaitForNotification(wctx)
		cancel()
		if werr != nil && ctx.Err() == nil && !errors.Is(werr, context.DeadlineExceeded) {
			return fmt.Errorf("outbox: listen: %w", werr)
		}
	}
	return nil
}

// Check finds out, before any row is relayed, whether the database answers
// and the table has the columns the relay's statements use; the error says
// how to create it (EnsureSchema, or Migration's SQL in your migrations).
func (r *Relay) Check(ctx context.Context) error {
	_, err := r.pool.Exec(ctx, fmt.Sprintf(`SELECT id, msg_id, group_key, body, attributes, created_at, first_attempt_at,
	attempts, claimed_until, sent_at, parked_at, park_reason FROM %s LIMIT 0`, r.table))
	if err != nil {
		return fmt.Errorf("outbox: table %s is not usable (create it with outbox.EnsureSchema or outbox.Migration's SQL): %w", r.table, err)
	}
	return nil
}
