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

// ParkedError reports a row the relay parked, and what to do about it:
// one whose resend could land outside the protection, or, when Refused is
// set, one the publisher refuses to send at all.
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
	// Refused, when not nil, is why the publisher refused the row (a
	// *dedupq.ValidationError: the backend's limits, which the
	// package-level Enqueue does not know). Such a row was never handed
	// to the broker, whatever its age; the others of its batch were sent.
	Refused error
}

// Unwrap returns Refused, so that errors.Is(err, dedupq.ErrInvalidMessage)
// and errors.As to a *dedupq.ValidationError see a refusal.
func (e *ParkedError) Unwrap() error { return e.Refused }

func (e *ParkedError) Error() string {
	if e.Refused != nil {
		return fmt.Sprintf("outbox: row %d (message %q) parked: the publisher refuses it, so it was never sent: %v. "+
			"Fix the row and release it (UPDATE %s SET parked_at = NULL, park_reason = NULL WHERE id = %d), or delete it; "+
			"until then it holds back the later rows of its group. Relay.Enqueue checks the backend's limits before a row "+
			"is written; the package-level Enqueue cannot.", e.RowID, e.MessageID, e.Refused, e.Table, e.RowID)
	}
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
// the end of the last attempt of its last resend: declare it on the
// consumers as ConsumerOptions.PublisherSpan.
//
// It holds for every attempt, in every pass and every chunk: a claimed
// batch is published in chunks one after another, so a pass stops sending
// at the first moment one of its resent rows reaches Span after the claim
// that first may have sent it (or its lease ends), and leaves the rows it
// did not reach for a later pass, which checks their age again.
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
	until    time.Time // the end of the claim's lease, the same for all its rows
}

func (r *Relay) step(s string) {
	if r.hook != nil {
		r.hook(s)
	}
}

// ErrSendDeadline is the cause of a pass's publish cut short because a
// resent row of its batch reached the end of the relay's Span, or its
// lease ended: the rows not yet sent are released, and a later pass
// claims them again and checks their age. RunOnce's error then matches
// it.
var ErrSendDeadline = errors.New("outbox: a row of the batch reached the end of the relay's span, or its lease ended")

// RunOnce claims one batch of rows, publishes them and marks them sent,
// and returns how many rows it published or tried to (not those it
// parked). The publish is bounded by the lease and by Span, not by ctx,
// once it has begun, so that a shutdown does not leave a row published
// and unmarked. A row the publisher refuses is parked alone (see
// ParkedError.Refused) and the others are sent.
func (r *Relay) RunOnce(ctx context.Context) (int, error) {
	rows, err := r.claim(ctx)
	if err != nil || len(rows) == 0 {
		return len(rows), err
	}
	r.step("claimed")
	for i := range rows {
		if rows[i].attempts > 1 {
			r.resent.Add(1)
		}
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.lease)
	defer cancel()
	out, perr := r.publish(pctx, rows, r.deadline(rows))
	r.step("published")
	var sent, unsent, released []int64
	var refused []*ParkedError
	now := r.clock.Now()
	for i, o := range out {
		switch id := rows[i].id; {
		case o.sent:
			sent = append(sent, id)
			if o.duplicate {
				r.dups.Add(1)
			}
		case o.refused != nil:
			refused = append(refused, &ParkedError{RowID: id, MessageID: rows[i].msg.ID, Age: now.Sub(rows[i].first),
				ResendFor: r.resendFor, Table: r.table, Refused: o.refused})
		case o.unsent:
			unsent = append(unsent, id)
			released = append(released, id)
		default:
			released = append(released, id)
		}
	}
	_, err = r.pool.Exec(pctx, fmt.Sprintf(`UPDATE %s SET sent_at = $1, claimed_until = NULL WHERE id = ANY($2);
`, r.table), now, sent)
	if err != nil {
		return len(rows), fmt.Errorf("outbox: marking %d rows sent: %w", len(sent), err)
	}
	r.sent.Add(int64(len(sent)))
	r.step("marked")
	for _, p := range refused {
		if err := r.park(pctx, r.pool, now, p); err != nil {
			return len(rows), err
		}
		r.parked.Add(1)
		if r.opts.OnParked != nil {
			r.opts.OnParked(p)
		}
	}
	if len(released) == 0 {
		return len(rows), nil
	}
	// Released rows are tried again at once; a first attempt that may have
	// reached the broker stays recorded, so the retry is a resend and its
	// age is checked. A claim that handed its row nothing is taken back, so
	// that its next claim is not taken for a resend, nor the row, once
	// old, parked as "maybe sent".
	if _, err := r.pool.Exec(pctx, fmt.Sprintf(`UPDATE %s SET claimed_until = NULL,
	attempts = attempts - CASE WHEN id = ANY($1) THEN 1 ELSE 0 END,
	first_attempt_at = CASE WHEN id = ANY($1) AND attempts <= 1 THEN NULL ELSE first_attempt_at END
WHERE id = ANY($2)`, r.table), unsent, released); err != nil {
		return len(rows), errors.Join(perr, fmt.Errorf("outbox: releasing rows: %w", err))
	}
	return len(rows), fmt.Errorf("outbox: publishing %d of %d rows failed: %w", len(released), len(rows), perr)
}

// outcome is what became of one row of a pass.
type outcome struct {
	sent, duplicate bool
	refused         error // the publisher's *dedupq.ValidationError: never sent
	unsent          bool  // never handed to the broker in this pass
}

// deadline is when the sends of a claimed batch must end: its lease's end,
// or the earliest end of a resent row's Span. A row claimed for the first
// time needs no such bound: its first chunk is its first send, and the
// publisher keeps the chunk's retries within the retry span. A row's first
// attempt went to the database truncated to microseconds, so the deadline
// errs early, never late.
func (r *Relay) deadline(rows []row) time.Time {
	d := rows[0].until
	for _, x := range rows {
		if end := x.first.Add(r.Span()); x.attempts > 1 && end.Before(d) {
			d = end
		}
	}
	return d
}

// publish sends rows, no attempt after deadline, and says what became of
// each. A refusal sends nothing of the batch (dedupq.ErrNotSent for the
// others): the refused rows are taken out and the rest sent again at once.
func (r *Relay) publish(ctx context.Context, rows []row, deadline time.Time) ([]outcome, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if d := deadline.Sub(r.clock.Now()); d > 0 {
		t := r.clock.AfterFunc(d, func() { cancel(ErrSendDeadline) })
		defer t.Stop()
	} else {
		cancel(ErrSendDeadline)
	}
	out := make([]outcome, len(rows))
	todo := make([]int, len(rows))
	for i := range todo {
		todo[i] = i
	}
	for {
		msgs := make([]*dedupq.Message, len(todo))
		for j, i := range todo {
			msgs[j] = &rows[i].msg
		}
		results, err := r.pub.PublishBatch(ctx, msgs)
		var again []int
		for j, i := range todo {
			var res dedupq.Result
			if j < len(results) {
				res = results[j]
			}
			var ve *dedupq.ValidationError
			switch {
			case err == nil || (j < len(results) && res.Err == nil):
				out[i] = outcome{sent: true, duplicate: res.Duplicate}
			case errors.As(res.Err, &ve):
				out[i].refused = ve
			case errors.Is(res.Err, dedupq.ErrNotSent):
				again = append(again, i)
			default:
				// No result at all (a closed publisher) also means nothing
				// was handed over.
				out[i].unsent = res.Attempts == 0
			}
		}
		if len(again) == 0 || len(again) == len(todo) {
			for _, i := range again {
				out[i].unsent = true
			}
			if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrSendDeadline) {
				err = errors.Join(err, cause)
			}
			return out, err
		}
		todo = again
	}
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
RETURNING o.id, o.msg_id, o.group_key, o.body, o.attributes::text, o.first_attempt_at, o.attempts, o.claimed_until`, r.table)
	rs, err := tx.Query(ctx, q, now, now.Add(r.lease), r.opts.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	var rows []row
	for rs.Next() {
		var x row
		var attrs *string
		if err := rs.Scan(&x.id, &x.msg.ID, &x.msg.GroupKey, &x.msg.Body, &attrs, &x.first, &x.attempts, &x.until); err != nil {
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
	// A row the publisher refuses (the package-level Enqueue cannot check
	// the backend's limits) is parked before anything is sent: in the
	// batch it would stop every other row from being sent.
	keep, refused := r.refused(keep, now)
	parked = append(parked, refused...)
	for _, p := range parked {
		if err := r.park(ctx, tx, now, p); err != nil {
			return nil, err
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

// refused splits rows into those the publisher accepts and a ParkedError
// for each it refuses.
func (r *Relay) refused(rows []row, now time.Time) ([]row, []*ParkedError) {
	msgs := make([]*dedupq.Message, len(rows))
	for i := range rows {
		msgs[i] = &rows[i].msg
	}
	var be *dedupq.BatchError
	if err := r.pub.Validate(msgs...); !errors.As(err, &be) {
		return rows, nil
	}
	bad := map[int]error{}
	for _, f := range be.Failed {
		if ve := (*dedupq.ValidationError)(nil); errors.As(f, &ve) {
			bad[ve.Index] = ve
		}
	}
	var keep []row
	var parked []*ParkedError
	for i, x := range rows {
		if bad[i] == nil {
			keep = append(keep, x)
			continue
		}
		parked = append(parked, &ParkedError{RowID: x.id, MessageID: x.msg.ID, Age: now.Sub(x.first), ResendFor: r.resendFor,
			Table: r.table, Refused: bad[i]})
	}
	return keep, parked
}

// park parks p's row. A refused row's claim is taken back: it handed
// nothing to the broker.
func (r *Relay) park(ctx context.Context, db Execer, now time.Time, p *ParkedError) error {
	uncount := 0
	if p.Refused != nil {
		uncount = 1
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`UPDATE %s SET parked_at = $1, park_reason = $2, claimed_until = NULL,
	attempts = attempts - $4, first_attempt_at = CASE WHEN attempts > $4 THEN first_attempt_at END WHERE id = $3`, r.table),
		now, p.Error(), p.RowID, uncount); err != nil {
		return fmt.Errorf("outbox: parking row %d: %w", p.RowID, err)
	}
	return nil
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
