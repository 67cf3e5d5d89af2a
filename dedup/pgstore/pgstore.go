// Package pgstore is a dedup.Store on PostgreSQL (github.com/jackc/pgx/v5),
// and the transactional path that makes a handler's effect exactly-once.
//
// # Two ways to use it
//
// As a dedup.Store behind the Guard, it records keys durably: a completed
// key survives a crash, a restart and (with synchronous replication) a
// failover, which Redis cannot promise. It still has the gap of every
// separate store: the handler's effect commits, then the completion write
// fails, and a later duplicate repeats the effect.
//
// Do (and TxGuard, which wraps it for a Consumer) closes that gap when the
// effect is itself a write to the same database: the handler gets the
// transaction that also holds the key's completion record, so the effect and
// the record commit together or not at all. A crash at any point leaves
// either both or neither, and the redelivery either finds the key completed
// or runs the handler as if for the first time.
//
// The handler writes through that transaction, which Tx(ctx) returns.
// Outside a TxGuard or Do, Tx returns ErrNoTx instead: a handler wired
// without the guard fails, and its delivery is nacked, rather than writing
// its effect through the pool apart from any record.
//
// # Table
//
// One row per (namespace, key), in the table of Migration: the owner token,
// the fingerprint, whether it is completed, locked_until (the lease end while
// in progress), expires_at (the lease end while in progress, the TTL end
// once completed) and an optional result. A row whose expires_at has passed
// is free: Claim takes it over in place, and Sweep deletes it.
//
// Claim is one INSERT … ON CONFLICT DO UPDATE … WHERE expires_at <= now():
// the primary key makes it atomic across any number of processes. A key the
// statement's snapshot already shows live is answered from it without
// taking the row's lock, so duplicates cost no commit flush and never hold
// up the holder's completion. Complete, Extend and Release act only on the
// row that carries the caller's token.
// Claims and completions made at the same time by concurrent deliveries are
// sent as one statement over arrays each, the two in one round trip and one
// commit (see Options.MaxBatch), so a busy consumer pays one round trip and
// one commit for many keys.
// Claims and completions both wait for the disk by default;
// Options.AsyncClaims trades a little safety for about twice the rate.
//
// # Errors
//
// Every error other than dedup.ErrLeaseLost means the store could not decide
// and wraps dedup.ErrStoreUnavailable and the driver's error, except that
// the caller's own cancelled or expired context is reported as such.
//
// A call's result depends on its own context only: it returns when that
// context ends, while the batch it rides in goes on for the other callers
// in it (and stops when none is left waiting). A claim that commits after
// its caller gave up, or whose caller was told it failed, is released with
// its own token as soon as the store learns of it, so that the key is not
// left in progress for a whole lease with no handler running.
package pgstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
	"github.com/dedupq/dedupq/dedup/internal/coalesce"
)

// DefaultTable is the table a Store uses when Options.Table is empty.
const DefaultTable = "dedupq_keys"

// DB is what the store needs of a database handle; *pgxpool.Pool has it. It
// must be safe for concurrent use, so a single *pgx.Conn is not enough.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// Table is the table's name, optionally schema-qualified
	// ("dedup.keys"); "" means DefaultTable.
	Table string
	// Namespace separates the keys of tenants or consumer groups that
	// share a table; "" means "default".
	Namespace string
	// MaxBatch caps how many claims and completions made at the same time
	// share one round trip and one commit; 0 means 128, 1 sends each on
	// its own.
	MaxBatch int
	// MaxInFlight caps how many batches run at once (claims and
	// completions share them; with AsyncClaims, each has its own); 0
	// means 1. Calls arriving while all are busy go out together in the
	// next one: fewer batches in flight make bigger ones, and so fewer
	// commits.
	MaxInFlight int
	// AsyncClaims commits claims with synchronous_commit off (completions
	// always wait for the disk). A claim is still visible to every
	// consumer at once, but a crash of PostgreSQL itself forgets the claims
	// of its last few hundred milliseconds, so a handler still running
	// when the database crashed may run again, concurrently, for its
	// redelivery — the same gap a lapsed lease has. In exchange a claim
	// costs no disk flush, which roughly doubles the rate of
	// claim-plus-complete at a given concurrency. Off by default: the
	// store's job is to be right.
	AsyncClaims bool
}

// defaultDoSlack is how far past now() + ttl Do's take sets expires_at,
// now() being the transaction's start. The TTL must run from the commit,
// when the record becomes visible; with the slack, a transaction that
// commits within it leaves a record that already lasts the TTL from the
// commit, and the commit statement only reads it, where restarting the TTL
// there wrote a second row version (and index entry) on every delivery.
// The price: a key is remembered up to the slack longer than its TTL
// (never shorter), and the table holds it that much longer. A transaction
// that outlives the slack has its TTL restarted at the commit, as before.
const defaultDoSlack = time.Minute

// Store is a dedup.Store on PostgreSQL, safe for concurrent use.
type Store struct {
	db    DB
	ns    string
	table string // sanitized identifier

	claimSQL, completeSQL, extendSQL, releaseSQL string
	claimOneSQL, completeOneSQL                  string
	takeSQL, readSQL, sweepSQL                   string
	commitSQL, commitPreparedSQL                 string
	finishStmtSQL, finishStmtName                string
	// doSlack: how much longer than its TTL Do's take makes a record
	// last, so that its commit seldom has to write it again (see
	// defaultDoSlack); tests shorten it.
	doSlack time.Duration
	// sessionStatements: the store's statements are prepared once per
	// connection and their plans cached there (see New).
	sessionStatements bool

	claims, completes *coalesce.Batcher[*op]
	asyncClaims       bool
}

// New returns a Store on db. The table must exist: run Migration's SQL with
// your migrations, or call EnsureSchema.
func New(db DB, o Options) (*Store, error) {
	table, err := tableIdent(o.Table)
	if err != nil {
		return nil, err
	}
	o.Namespace = cmp.Or(o.Namespace, "default")
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1
	}
	s := &Store{db: db, ns: o.Namespace, table: table, doSlack: defaultDoSlack}
	s.prepareSQL()
	// A statement prepared on a connection is there for its next
	// transaction only where the connection is the server's own (no
	// transaction-pooling proxy in between), which pgx's default exec
	// mode assumes too.
	switch db := db.(type) {
	case *pgxpool.Pool:
		s.sessionStatements = db.Config().ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	case *pgx.Conn:
		s.sessionStatements = db.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	}
	s.asyncClaims = o.AsyncClaims
	s.claims = coalesce.New(o.MaxBatch, o.MaxInFlight, s.flush, s.abandoned)
	// A claim batch whose callers all gave up still reads its outcome, so
	// that a claim it committed is released after it committed: cut short,
	// the statement could commit after the release had found nothing.
	s.claims.Grace = undoTimeout
	// Claims and completions share batches, and so commits: at a given
	// concurrency that halves the commits per delivery, and the commit's
	// WAL flush is what a durable store waits for. Async claims commit
	// differently (see Options.AsyncClaims), so they batch apart.
	s.completes = s.claims
	if o.AsyncClaims {
		s.completes = coalesce.New(o.MaxBatch, o.MaxInFlight, s.flush, s.abandoned)
	}
	return s, nil
}

// Migration returns the SQL that creates table (DefaultTable when empty)
// and its expiry index, idempotently.
func Migration(table string) (string, error) {
	t, err := tableIdent(table)
	if err != nil {
		return "", err
	}
	parts := strings.Split(cmp.Or(table, DefaultTable), ".")
	index := pgx.Identifier{parts[len(parts)-1] + "_expires_at_idx"}.Sanitize()
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	namespace    text        NOT NULL,
	key          text        NOT NULL,
	token        text        NOT NULL,
	fingerprint  text        NOT NULL,
	completed    boolean     NOT NULL DEFAULT false,
	locked_until timestamptz,
	expires_at   timestamptz NOT NULL,
	result       bytea,
	PRIMARY KEY (namespace, key)
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (expires_at);
`, t, index), nil
}

// EnsureSchema creates table (DefaultTable when empty) and its index if
// they do not exist. Concurrent callers are serialized by an advisory lock,
// because concurrent CREATE TABLE IF NOT EXISTS can still fail.
func EnsureSchema(ctx context.Context, db DB, table string) error {
	sql, err := Migration(table)
	if err != nil {
		return err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('dedupq.pgstore.schema'))`); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: ensure schema: %w", err)
	}
	return nil
}

func tableIdent(table string) (string, error) {
	parts := strings.Split(cmp.Or(table, DefaultTable), ".")
	if len(parts) > 2 || slices.Contains(parts, "") {
		return "", fmt.Errorf("pgstore: table name %q: want name or schema.name", table)
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

func (s *Store) prepareSQL() {
	r := strings.NewReplacer("{T}", s.table, "{SLACK}", strconv.FormatInt(micros(s.doSlack), 10))
	// A key that the statement's snapshot shows live (in progress or
	// completed) is answered from that snapshot without being offered to
	// the INSERT: ON CONFLICT DO UPDATE locks the conflicting row even when
	// its WHERE refuses the update, and that lock takes a transaction id, a
	// WAL record and, with durable claims, a disk flush before the commit
	// lets go of it. The redeliveries of a key in progress would then queue
	// their holder's completion behind their flushes, and a batch of
	// duplicates would cost a commit for nothing. The answer is the key's
	// state when the statement began, which is within the call, and it is
	// a state the key really had: the row was live then, so it was the
	// holder's and no other claimant could take it over. Keys that
	// the snapshot shows free or does not show (written since) go through
	// ON CONFLICT, which decides on the latest row version.
	//
	// When ON CONFLICT refuses such a key, the row it refused on is newer
	// than the snapshot: another claimant (or Do) took the expired row over
	// or inserted it, and committed while this statement waited for the row
	// lock. The snapshot's version of that row is expired or missing, and
	// answering from it would report a stale Completed, or the old holder's
	// fingerprint, for a key another claimant now holds. So the read-back
	// joins only rows the snapshot shows live; a refused key finds none and
	// is asked again in a new statement, whose snapshot includes the commit
	// it waited for (see flush). The common cases stay one round trip.
	s.claimSQL = r.Replace(`WITH req AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS r(key, token, fp, lease_us)
), ins AS (
	INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at, result)
	SELECT $1, key, token, fp, false, now() + lease_us * interval '1 microsecond', now() + lease_us * interval '1 microsecond', NULL
	FROM req
	WHERE (SELECT l.expires_at > now() FROM {T} l WHERE l.namespace = $1 AND l.key = req.key) IS NOT TRUE
	ORDER BY key
	ON CONFLICT (namespace, key) DO UPDATE
	SET token = excluded.token, fingerprint = excluded.fingerprint, completed = false,
		locked_until = excluded.locked_until, expires_at = excluded.expires_at, result = NULL
	WHERE d.expires_at <= now()
	RETURNING d.key
)
SELECT r.key, ins.key IS NOT NULL, d.completed, d.fingerprint, d.locked_until, d.result
FROM req r
LEFT JOIN ins ON ins.key = r.key
LEFT JOIN {T} d ON ins.key IS NULL AND d.namespace = $1 AND d.key = r.key AND d.expires_at > now()`)
	// claimOneSQL is claimSQL for a batch of one claim (every claim at
	// concurrency 1), with scalar parameters. Left to choose, PostgreSQL
	// plans a statement over arrays afresh on every execution (a generic
	// plan expects ten rows from unnest where a custom plan sees one, so
	// it never looks cheaper; batches of several ask for the generic plan
	// with a statement of their own, see forceGenericPlan), and planning
	// claimSQL took twice as long as running it:
	// measured, 0.4 ms planning and 0.2 ms execution. With scalars the
	// generic plan (two lookups by primary key) is chosen after five
	// executions and is reused: 0.01 ms planning, 0.04 ms execution. The
	// answer has claimSQL's columns.
	s.claimOneSQL = r.Replace(`WITH ins AS (
	INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at, result)
	SELECT $1::text, $2::text, $3::text, $4::text, false, now() + $5::bigint * interval '1 microsecond', now() + $5::bigint * interval '1 microsecond', NULL
	WHERE (SELECT l.expires_at > now() FROM {T} l WHERE l.namespace = $1::text AND l.key = $2::text) IS NOT TRUE
	ON CONFLICT (namespace, key) DO UPDATE
	SET token = excluded.token, fingerprint = excluded.fingerprint, completed = false,
		locked_until = excluded.locked_until, expires_at = excluded.expires_at, result = NULL
	WHERE d.expires_at <= now()
	RETURNING d.key
)
SELECT $2::text, ins.key IS NOT NULL, d.completed, d.fingerprint, d.locked_until, d.result
FROM (VALUES (1)) AS one(x)
LEFT JOIN ins ON true
LEFT JOIN {T} d ON ins.key IS NULL AND d.namespace = $1::text AND d.key = $2::text AND d.expires_at > now()`)
	// A missing row lapsed and was swept, or was released, and nobody has
	// taken it since: its holder may write it again, with the fingerprint
	// its token carries.
	s.completeSQL = r.Replace(`WITH req AS (
	SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[]) AS r(key, token, fp, ttl_us, result)
), upd AS (
	INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at, result)
	SELECT $1, key, token, fp, true, NULL, now() + ttl_us * interval '1 microsecond', result
	FROM req ORDER BY key
	ON CONFLICT (namespace, key) DO UPDATE
	SET completed = true, locked_until = NULL, expires_at = excluded.expires_at, result = excluded.result
	WHERE d.token = excluded.token
	RETURNING d.key
)
SELECT r.key, upd.key IS NOT NULL FROM req r LEFT JOIN upd ON upd.key = r.key`)
	// completeOneSQL is completeSQL for a batch of one completion, with
	// scalar parameters, for the reason claimOneSQL has.
	s.completeOneSQL = r.Replace(`WITH upd AS (
	INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at, result)
	SELECT $1::text, $2::text, $3::text, $4::text, true, NULL, now() + $5::bigint * interval '1 microsecond', $6::bytea
	ON CONFLICT (namespace, key) DO UPDATE
	SET completed = true, locked_until = NULL, expires_at = excluded.expires_at, result = excluded.result
	WHERE d.token = excluded.token
	RETURNING d.key
)
SELECT $2::text, EXISTS (SELECT FROM upd)`)
	s.extendSQL = r.Replace(`INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at)
VALUES ($1, $2, $3, $4, false, now() + $5 * interval '1 microsecond', now() + $5 * interval '1 microsecond')
ON CONFLICT (namespace, key) DO UPDATE
SET locked_until = CASE WHEN d.completed THEN d.locked_until ELSE excluded.locked_until END,
	expires_at = CASE WHEN d.completed THEN d.expires_at ELSE excluded.expires_at END
WHERE d.token = excluded.token
RETURNING 1`)
	s.releaseSQL = r.Replace(`WITH del AS (
	DELETE FROM {T} WHERE namespace = $1 AND key = $2 AND token = $3 AND NOT completed RETURNING 1
)
SELECT (SELECT count(*) FROM del), (SELECT token FROM {T} WHERE namespace = $1 AND key = $2)`)
	// Do's take also leaves the key and its TTL in settings local to the
	// transaction, for the statement that Do's commit sends (see
	// commitSQL). Its expires_at runs from the transaction's start with
	// doSlack to spare, so that a handler done within the slack leaves a
	// record that already covers the commit plus the TTL, and the commit
	// has nothing to write (see commitSQL); a takeover of an expired
	// record gets the same, through excluded.
	s.takeSQL = r.Replace(`INSERT INTO {T} AS d (namespace, key, token, fingerprint, completed, locked_until, expires_at)
SELECT $1, $2, $3, $4, true, NULL, now() + ($5::bigint + {SLACK}) * interval '1 microsecond'
FROM (SELECT set_config('dedupq.do_namespace', $1, true), set_config('dedupq.do_key', $2, true),
	set_config('dedupq.do_ttl_us', $5::bigint::text, true)) AS local_settings
ON CONFLICT (namespace, key) DO UPDATE
SET token = excluded.token, fingerprint = excluded.fingerprint, completed = true,
	locked_until = NULL, expires_at = excluded.expires_at, result = NULL
WHERE d.expires_at <= now()
RETURNING 1`)
	// The TTL of Do's record runs from the commit, when the record
	// becomes visible, not from the take at the transaction's start: a
	// handler that ran for a while would otherwise eat into it. Checking
	// it takes a statement after the handler; sent with COMMIT in one
	// simple query, it costs no round trip of its own. A simple query takes
	// no parameters, so it finds the key and the TTL in the settings the
	// take left. The take's slack covers almost every transaction, and
	// then the statement only reads: the UPDATE restarts the TTL from
	// clock_timestamp() only for a transaction that outlived the slack.
	// Writing it always cost a second row version per delivery (and, as
	// expires_at is indexed, a new index entry too). If the handler
	// removed the record, committing would keep its effect with nothing to
	// dedup the redelivery: reading the setting errRecordRemoved names,
	// which nobody sets, fails the statement, and the COMMIT behind it is
	// not run. The UPDATE and the EXISTS see the same snapshot, which
	// holds the take's row and whatever the handler did to it; the UPDATE
	// changes no key, so its row exists for the EXISTS either way.
	s.finishStmtSQL = r.Replace(`WITH fin AS (
	UPDATE {T} SET expires_at = clock_timestamp() + current_setting('dedupq.do_ttl_us')::bigint * interval '1 microsecond'
	WHERE namespace = current_setting('dedupq.do_namespace') AND key = current_setting('dedupq.do_key')
		AND expires_at < clock_timestamp() + current_setting('dedupq.do_ttl_us')::bigint * interval '1 microsecond'
)
SELECT CASE WHEN EXISTS (SELECT FROM {T} WHERE namespace = current_setting('dedupq.do_namespace') AND key = current_setting('dedupq.do_key'))
	THEN '' ELSE current_setting('` + recordRemovedSetting + `') END`)
	s.commitSQL = s.finishStmtSQL + ";\nCOMMIT"
	// Sent as text, the statement is parsed and planned on every commit;
	// prepared once per connection and EXECUTEd, it is planned once (see
	// Store.begin).
	h := fnv.New64a()
	_, _ = h.Write([]byte(s.finishStmtSQL))
	s.finishStmtName = fmt.Sprintf("dedupq_do_finish_%x", h.Sum64())
	s.commitPreparedSQL = "EXECUTE " + s.finishStmtName + ";\nCOMMIT"
	s.readSQL = r.Replace(`SELECT completed, fingerprint, locked_until, result, expires_at <= now() FROM {T} WHERE namespace = $1 AND key = $2`)
	s.sweepSQL = r.Replace(`DELETE FROM {T} d USING (
	SELECT namespace, key FROM {T} WHERE expires_at < now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) old
WHERE d.namespace = old.namespace AND d.key = old.key AND d.expires_at < now()`)
}

// op is a Claim or a Complete waiting for a batch.
type op struct {
	coalesce.Call
	complete bool
	key      string
	token    string
	fp       string
	us       int64  // lease or TTL, in microseconds
	result   []byte // Complete
	out      dedup.Claim
	lost     bool // Complete: the token no longer holds the key
	err      error
	settled  bool // in this round
}

// submit sends o with the next batch and waits for its answer or for ctx,
// whichever comes first; on ctx it returns ctx's error, and o may still
// reach the database (see abandoned).
func (s *Store) submit(ctx context.Context, o *op) error {
	b := s.claims
	if o.complete {
		b = s.completes
	}
	return b.Do(ctx, o)
}

// undoTimeout bounds the release of a claim whose caller was told it
// failed.
const undoTimeout = 10 * time.Second

// abandoned gets the operations that a batch settled after their callers
// had given up. A claim among them that was acquired, or may have been (its
// batch failed), holds its key under a token nobody has: release it, or the
// key would stay in progress for a whole lease with no handler running. The
// token is the claim's own, so the release cannot touch anyone else's.
// Completions need no undoing: one that commits after its caller gave up
// records an effect that did happen, with the token that ran it, which is
// what a redelivery must find.
func (s *Store) abandoned(late []*op) {
	for _, o := range late {
		if !o.complete && (o.err != nil || o.out.State == dedup.Acquired) {
			s.undoClaim(o.key, o.token)
		}
	}
}

// undoClaim releases a claim whose caller was told it failed, as far as the
// database can be reached; if it cannot, the lease frees the key.
func (s *Store) undoClaim(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	_ = s.Release(ctx, key, token)
}

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.Claim, error) {
	if lease <= 0 {
		return dedup.Claim{}, fmt.Errorf("pgstore: claim %q: lease %s is not positive", key, lease)
	}
	o := &op{key: key, token: claimtoken.New(fingerprint), fp: fingerprint, us: micros(lease)}
	if err := s.submit(ctx, o); err != nil {
		return dedup.Claim{}, fail(ctx, "claim", key, err)
	}
	if o.err != nil {
		// The claim may have committed before the error (a connection
		// lost after the commit, say): its caller is told it failed, so
		// it must not keep the key.
		go s.undoClaim(key, o.token)
		return dedup.Claim{}, fail(ctx, "claim", key, o.err)
	}
	return o.out, nil
}

// Complete implements dedup.Store. An empty result is stored as none.
func (s *Store) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if ttl <= 0 {
		return fmt.Errorf("pgstore: complete %q: ttl %s is not positive", key, ttl)
	}
	fp, ok := claimtoken.Fingerprint(token)
	if !ok {
		return fmt.Errorf("pgstore: complete %q: malformed token: %w", key, dedup.ErrLeaseLost)
	}
	if len(result) == 0 {
		result = nil
	}
	o := &op{complete: true, key: key, token: token, fp: fp, us: micros(ttl), result: result}
	if err := s.submit(ctx, o); err != nil {
		return fail(ctx, "complete", key, err)
	}
	if o.err != nil {
		return fail(ctx, "complete", key, o.err)
	}
	if o.lost {
		return fmt.Errorf("pgstore: complete %q: %w", key, dedup.ErrLeaseLost)
	}
	return nil
}

// maxRounds bounds how often one flush goes back to the database for the
// operations a batch could not settle: a second operation on a key already
// in the statement, and a claim refused on a row version committed after
// the statement's snapshot.
const maxRounds = 100

// flush settles a batch of claims or of completions in one round trip and
// one implicit transaction, so that they share one commit: the WAL flush of
// a commit, not the statement, is what limits a durable store. ctx is the
// batch's own (see coalesce.Batcher): it ends only when every caller in
// the batch has given up.
func (s *Store) flush(ctx context.Context, batch []*op) {
	pending := batch
	for round := 0; len(pending) > 0; round++ {
		claims, completes, next := split(pending)
		if round == maxRounds {
			for _, o := range pending {
				o.err = errors.New("operation did not settle")
				o.Settle()
			}
			return
		}
		err := s.sendBatch(ctx, claims, completes)
		for _, group := range [][]*op{claims, completes} {
			for _, o := range group {
				if err == nil && !o.settled {
					next = append(next, o) // claim met an invisible row: ask again
					continue
				}
				if err != nil {
					o.err = err
				}
				o.Settle()
			}
		}
		pending = next
	}
}

// split sorts the first claim and the first completion of each key into
// claims and completes, ordered by key so that concurrent batches lock rows
// in one order, and leaves the rest for the next round: one statement
// cannot write a row twice.
func split(ops []*op) (claims, completes, rest []*op) {
	type seenKey struct {
		complete bool
		key      string
	}
	seen := make(map[seenKey]bool, len(ops))
	for _, o := range ops {
		k := seenKey{o.complete, o.key}
		switch {
		case seen[k]:
			rest = append(rest, o)
		case o.complete:
			completes = append(completes, o)
		default:
			claims = append(claims, o)
		}
		seen[k] = true
	}
	byKey := func(a, b *op) int { return strings.Compare(a.key, b.key) }
	slices.SortFunc(claims, byKey)
	slices.SortFunc(completes, byKey)
	return claims, completes, rest
}

// forceGenericPlan, run in a batch's transaction ahead of the statements
// over arrays, makes PostgreSQL execute them with the plan it made once for
// the prepared statement, instead of planning them afresh for every batch:
// left to choose, it never picks the generic plan, which expects ten rows
// from unnest where a custom plan sees the batch's count, and planning
// claimSQL cost as much as running it (measured with EXPLAIN ANALYZE on a
// batch of 8: 0.4 ms planning, 0.4 ms execution; generic: 0.04 ms
// planning, the same execution, with the same index lookups once the table
// has statistics). The setting is local to the batch's transaction, so the
// connection goes back to the pool as it came.
const forceGenericPlan = `set_config('plan_cache_mode', 'force_generic_plan', true)`

// sendBatch runs the claim and completion statements together, retrying
// the batch when PostgreSQL aborted it for a deadlock or a serialization
// failure, which say nothing was written.
func (s *Store) sendBatch(ctx context.Context, claims, completes []*op) error {
	b := &pgx.Batch{}
	async := len(claims) > 0 && len(completes) == 0 && s.asyncClaims
	generic := s.sessionStatements && (len(claims) > 1 || len(completes) > 1)
	settings := ""
	switch {
	case async && generic:
		settings = `SELECT set_config('synchronous_commit', 'off', true), ` + forceGenericPlan
	case async:
		settings = `SELECT set_config('synchronous_commit', 'off', true)`
	case generic:
		settings = `SELECT ` + forceGenericPlan
	}
	if settings != "" {
		b.Queue(settings)
	}
	if len(claims) == 1 {
		o := claims[0]
		b.Queue(s.claimOneSQL, s.ns, o.key, o.token, o.fp, o.us)
	} else if len(claims) > 0 {
		n := len(claims)
		keys, tokens, fps, leases := make([]string, n), make([]string, n), make([]string, n), make([]int64, n)
		for i, o := range claims {
			keys[i], tokens[i], fps[i], leases[i] = o.key, o.token, o.fp, o.us
		}
		b.Queue(s.claimSQL, s.ns, keys, tokens, fps, leases)
	}
	if len(completes) == 1 {
		o := completes[0]
		b.Queue(s.completeOneSQL, s.ns, o.key, o.token, o.fp, o.us, o.result)
	} else if len(completes) > 0 {
		n := len(completes)
		keys, tokens, fps, ttls, results := make([]string, n), make([]string, n), make([]string, n), make([]int64, n), make([][]byte, n)
		for i, o := range completes {
			keys[i], tokens[i], fps[i], ttls[i], results[i] = o.key, o.token, o.fp, o.us, o.result
		}
		b.Queue(s.completeSQL, s.ns, keys, tokens, fps, ttls, results)
	}
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = s.readBatch(s.db.SendBatch(ctx, b), settings != "", claims, completes); !retryable(err) {
			return err
		}
	}
	return err
}

func (s *Store) readBatch(br pgx.BatchResults, settings bool, claims, completes []*op) (err error) {
	defer func() {
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}()
	if settings {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if len(claims) > 0 {
		byKey := make(map[string]*op, len(claims))
		for _, o := range claims {
			byKey[o.key] = o
			o.settled = false
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var key string
			var acquired bool
			var completed *bool
			var fp *string
			var until *time.Time
			var result []byte
			if err := rows.Scan(&key, &acquired, &completed, &fp, &until, &result); err != nil {
				rows.Close()
				return err
			}
			o := byKey[key]
			switch {
			case o == nil:
			case acquired:
				o.out, o.settled = dedup.Claim{State: dedup.Acquired, Token: o.token}, true
			case completed == nil:
				// Refused on a row version newer than this statement's
				// snapshot: ask again, in a new snapshot.
			case *completed:
				o.out, o.settled = dedup.Claim{State: dedup.Completed, Fingerprint: *fp, Result: result}, true
			default:
				o.out, o.settled = dedup.Claim{State: dedup.InProgress, Fingerprint: *fp, LeaseUntil: *until}, true
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	if len(completes) > 0 {
		byKey := make(map[string]*op, len(completes))
		for _, o := range completes {
			byKey[o.key] = o
			o.lost, o.settled = true, true
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var key string
			var ok bool
			if err := rows.Scan(&key, &ok); err != nil {
				rows.Close()
				return err
			}
			if o := byKey[key]; o != nil {
				o.lost = !ok
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Extend implements dedup.Store. Extending a claim its holder already
// completed leaves the completion as it is.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("pgstore: extend %q: lease %s is not positive", key, lease)
	}
	fp, ok := claimtoken.Fingerprint(token)
	if !ok {
		return fmt.Errorf("pgstore: extend %q: malformed token: %w", key, dedup.ErrLeaseLost)
	}
	found := false
	err := s.query(ctx, func(rows pgx.Rows) error {
		found = rows.Next()
		rows.Close()
		return rows.Err()
	}, s.extendSQL, s.ns, key, token, fp, micros(lease))
	if err != nil {
		return fail(ctx, "extend", key, err)
	}
	if !found {
		return fmt.Errorf("pgstore: extend %q: %w", key, dedup.ErrLeaseLost)
	}
	return nil
}

// Release implements dedup.Store. Releasing a key the same token already
// completed does nothing: forgetting a completed effect would let a
// redelivery repeat it.
func (s *Store) Release(ctx context.Context, key, token string) error {
	var deleted int64
	var holder *string
	err := s.query(ctx, func(rows pgx.Rows) error {
		if rows.Next() {
			if err := rows.Scan(&deleted, &holder); err != nil {
				return err
			}
		}
		return rows.Err()
	}, s.releaseSQL, s.ns, key, token)
	if err != nil {
		return fail(ctx, "release", key, err)
	}
	if deleted == 0 && holder != nil && *holder != token {
		return fmt.Errorf("pgstore: release %q: %w", key, dedup.ErrLeaseLost)
	}
	return nil
}

// query runs sql and hands its rows to read, retrying a statement that
// PostgreSQL aborted for a deadlock or a serialization failure: these say
// nothing was written, and a batch of keys can deadlock with another batch
// or the sweeper.
func (s *Store) query(ctx context.Context, read func(pgx.Rows) error, sql string, args ...any) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var rows pgx.Rows
		rows, err = s.db.Query(ctx, sql, args...)
		if err == nil {
			err = read(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if !retryable(err) {
			return err
		}
	}
	return err
}

func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// fail wraps an error that left the store without an answer.
func fail(ctx context.Context, op, key string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("pgstore: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("pgstore: %s %q: %w: %w", op, key, dedup.ErrStoreUnavailable, err)
}

// micros rounds d up to whole microseconds, PostgreSQL's finest unit, so
// that a lease is never shorter than asked.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
