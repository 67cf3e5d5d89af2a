// Package outbox is a transactional outbox on PostgreSQL (pgx v5) that knows
// the dedup window: the publish side of exactly-once.
//
// A service that commits its own write and then publishes can crash in
// between (the message is lost) or publish and then roll back (a message
// about nothing). Enqueue instead writes the messages into an outbox table
// inside the caller's transaction, so they commit or roll back with the
// write; a Relay then publishes the committed rows through a
// *dedupq.Publisher, each with its own dedup ID, and marks them sent.
//
// # Crashes and the window
//
// A relay that dies after publishing and before marking publishes the row
// again later. That resend is harmless only while the broker's dedup window
// (or a consumer dedup TTL the caller declares) still remembers the first
// send. So a row records its first send attempt, and a relay resends it only
// while the resend's whole retry span still ends inside that protection,
// less the margin; a row older than that is parked instead, counted, and
// reported with what to do. It is never silently sent as a duplicate.
//
// The relay's worst-case span from a row's first send to its last resend is
// Relay.Span, and no attempt of any pass, chunk or retry ends later: give
// it to the consumers as ConsumerOptions.PublisherSpan.
// NewRelay refuses a relay whose span the protection cannot cover, as
// dedupq.NewPublisher refuses an unsafe retry policy.
//
// # Order and concurrency
//
// Rows are claimed with FOR UPDATE SKIP LOCKED and a lease, so any number
// of relays can run against one table. Rows with the same GroupKey are
// published in the order of their ids (their insertion order), one at a
// time: a row is claimed only when every earlier row of its group is sent,
// and a parked row holds its group back until it is resolved.
package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dedupq/dedupq"
)

// DefaultTable is the table used when a table name is empty.
const DefaultTable = "dedupq_outbox"

// Querier is what Status needs of a database handle; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx have it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Execer is what EnsureSchema needs; *pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func tableIdent(table string) (string, error) {
	table = cmp.Or(table, DefaultTable)
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("outbox: table %q: want name or schema.name", table)
	}
	for _, p := range parts {
		if p == "" {
			return "", fmt.Errorf("outbox: table %q: empty name part", table)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// channel is the LISTEN/NOTIFY channel of a table: its name, unquoted.
func channel(table string) string { return "dedupq_outbox:" + cmp.Or(table, DefaultTable) }

// Migration returns the SQL that creates table (DefaultTable when empty)
// and its indexes, idempotently: put it in your migrations, or call
// EnsureSchema.
func Migration(table string) (string, error) {
	t, err := tableIdent(table)
	if err != nil {
		return "", err
	}
	parts := strings.Split(cmp.Or(table, DefaultTable), ".")
	idx := func(suffix string) string { return pgx.Identifier{parts[len(parts)-1] + suffix}.Sanitize() }
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	msg_id           text        NOT NULL,
	group_key        text        NOT NULL DEFAULT '',
	body             bytea       NOT NULL,
	attributes       jsonb,
	created_at       timestamptz NOT NULL DEFAULT now(),
	first_attempt_at timestamptz,
	attempts         integer     NOT NULL DEFAULT 0,
	claimed_until    timestamptz,
	sent_at          timestamptz,
	parked_at        timestamptz,
	park_reason      text
);
CREATE INDEX IF NOT EXISTS %[2]s ON %[1]s (id) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS %[3]s ON %[1]s (group_key, id) WHERE sent_at IS NULL;
CREATE INDEX IF NOT EXISTS %[4]s ON %[1]s (sent_at) WHERE sent_at IS NOT NULL;
`, t, idx("_pending_idx"), idx("_group_idx"), idx("_sent_idx")), nil
}

// EnsureSchema runs Migration's SQL on db.
func EnsureSchema(ctx context.Context, db Execer, table string) error {
	sql, err := Migration(table)
	if err != nil {
		return err
	}
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("outbox: ensure schema: %w", err)
	}
	return nil
}

// ErrInvalid matches the error of Enqueue when a message is invalid.
var ErrInvalid = errors.New("outbox: invalid message, nothing enqueued")

// Enqueue writes msgs into the outbox table DefaultTable inside tx, the
// caller's own transaction, so that they are published if and only if tx
// commits. Each message is first checked as dedupq.Validate does (a
// non-empty dedup ID is required: it is what makes a relay's resend
// harmless); if any is invalid nothing is written and the error wraps
// ErrInvalid and the *dedupq.BatchError. Relay.Enqueue also checks the
// backend's limits, and uses the relay's table. A row written here that
// the relay's backend refuses is parked by the relay, alone and never
// sent (ParkedError.Refused); the other rows are sent.
func Enqueue(ctx context.Context, tx pgx.Tx, msgs ...*dedupq.Message) error {
	if err := dedupq.Validate(msgs...); err != nil {
		return errors.Join(ErrInvalid, err)
	}
	return insert(ctx, tx, "", msgs)
}

func insert(ctx context.Context, tx pgx.Tx, table string, msgs []*dedupq.Message) error {
	t, err := tableIdent(table)
	if err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	ids := make([]string, len(msgs))
	groups := make([]string, len(msgs))
	bodies := make([][]byte, len(msgs))
	attrs := make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], groups[i], bodies[i] = m.ID, m.GroupKey, m.Body
		if bodies[i] == nil {
			bodies[i] = []byte{}
		}
		if len(m.Attributes) > 0 {
			if attrs[i], err = json.Marshal(m.Attributes); err != nil {
				return fmt.Errorf("outbox: enqueue: attributes of %q: %w", m.ID, err)
			}
		}
	}
	// Ids are taken at INSERT, not at commit: two transactions enqueuing
	// into one group could commit in the other order than their ids and a
	// relay would publish the later commit first. A transaction-scoped lock
	// per group (in sorted order, so two enqueuers cannot deadlock) makes
	// a group's enqueuers take their ids one after the other.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1 || '/' || g, 0))
FROM (SELECT DISTINCT g FROM unnest($2::text[]) AS u(g) WHERE g <> '' ORDER BY g) AS s`, t, groups); err != nil {
		return fmt.Errorf("outbox: enqueue: locking groups: %w", err)
	}
	// One statement over arrays inserts every row in one round trip; WITH ORDINALITY keeps the ids in the order of msgs. The NOTIFY
	// is delivered when tx commits, and not at all if it rolls back.
	sql := fmt.Sprintf(`WITH ins AS (
	INSERT INTO %s (msg_id, group_key, body, attributes)
	SELECT m, g, b, a::jsonb FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]) WITH ORDINALITY AS u(m, g, b, a, n) ORDER BY n
	RETURNING 1)
SELECT pg_notify($5, ''), (SELECT count(*) FROM ins)`, t)
	attrText := make([]*string, len(attrs))
	for i, a := range attrs {
		if a != nil {
			s := string(a)
			attrText[i] = &s
		}
	}
	if _, err := tx.Exec(ctx, sql, ids, groups, bodies, attrText, channel(table)); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	return nil
}

// Status reports the outbox in DefaultTable: how many rows wait to be
// published, how many are parked, and how long the oldest waiting row has
// waited (zero when none waits).
func Status(ctx context.Context, db Querier) (pending, parked int, oldestPending time.Duration, err error) {
	return TableStatus(ctx, db, "")
}

// TableStatus is Status for the outbox in table (DefaultTable when empty).
func TableStatus(ctx context.Context, db Querier, table string) (pending, parked int, oldestPending time.Duration, err error) {
	t, err := tableIdent(table)
	if err != nil {
		return 0, 0, 0, err
	}
	var age float64
	err = db.QueryRow(ctx, fmt.Sprintf(`SELECT
	count(*) FILTER (WHERE parked_at IS NULL),
	count(*) FILTER (WHERE parked_at IS NOT NULL),
	COALESCE(EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE parked_at IS NULL)), 0)::float8
FROM %s WHERE sent_at IS NULL`, t)).Scan(&pending, &parked, &age)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("outbox: status: %w", err)
	}
	return pending, parked, time.Duration(age * float64(time.Second)), nil
}
