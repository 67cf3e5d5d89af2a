package pgstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dedupq/dedupq/dedup"
)

var _ dedup.Checker = (*Store)(nil)

// schemaColumns are the columns the store's statements use, with their
// types as format_type names them: what Migration creates.
var schemaColumns = map[string]string{
	"namespace":    "text",
	"key":          "text",
	"token":        "text",
	"fingerprint":  "text",
	"completed":    "boolean",
	"locked_until": "timestamp with time zone",
	"expires_at":   "timestamp with time zone",
	"result":       "bytea",
}

// checkSQL answers, in one round trip and from the catalog only: whether
// the table exists (as the store's statements would resolve its name,
// through search_path), its columns and their types, whether a unique
// index on exactly (namespace, key) backs the claim's ON CONFLICT, and
// whether the current role may read and write it. Nothing is read from
// the table itself, so the check costs the same on a table of any size.
const checkSQL = `
WITH t AS (SELECT to_regclass($1) AS oid)
SELECT t.oid IS NOT NULL,
       COALESCE((SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod))
                 FROM pg_attribute a
                 WHERE a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
       COALESCE((SELECT bool_or(
                   (SELECT array_agg(a.attname::text ORDER BY a.attname)
                    FROM pg_attribute a
                    WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)) = ARRAY['key', 'namespace']
                   AND i.indnkeyatts = 2 AND i.indpred IS NULL)
                 FROM pg_index i WHERE i.indrelid = t.oid AND i.indisunique), false),
       COALESCE(has_table_privilege(t.oid, 'SELECT, INSERT, UPDATE, DELETE'), false)
FROM t`

// Check implements dedup.Checker: it finds out in one catalog query, before
// any delivery, whether the database answers and the table is there with
// the columns, unique key and privileges the store's statements need. An
// error names what is missing and how to create it (EnsureSchema, or
// Migration's SQL in your migrations).
//
// New takes no context, so it does no I/O; call Check (or let
// dedupq.NewConsumer call it through the Guard or TxGuard) at startup.
func (s *Store) Check(ctx context.Context) error {
	var exists, uniqueKey, privileged bool
	var cols []string
	err := s.db.QueryRow(ctx, checkSQL, s.table).Scan(&exists, &cols, &uniqueKey, &privileged)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) || (errors.Is(err, context.Canceled) && ctx.Err() != nil) {
			return fmt.Errorf("pgstore: check table %s: %w", s.table, err)
		}
		return fmt.Errorf("pgstore: check table %s: %w: cannot reach PostgreSQL (is it running, and is the pool's address right?): %w",
			s.table, dedup.ErrStoreUnavailable, err)
	}
	fix := fmt.Sprintf("create it with pgstore.EnsureSchema(ctx, db, %q) at startup, or add the SQL of pgstore.Migration(%[1]q) to your migrations", s.tableName())
	if !exists {
		return fmt.Errorf("pgstore: table %s does not exist (in the connection's search_path); %s", s.table, fix)
	}
	got := make(map[string]string, len(cols))
	for _, c := range cols {
		name, typ, _ := strings.Cut(c, " ")
		got[name] = typ
	}
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(schemaColumns)) {
		switch typ, ok := got[name]; {
		case !ok:
			problems = append(problems, "column "+name+" is missing")
		case typ != schemaColumns[name]:
			problems = append(problems, fmt.Sprintf("column %s is %s, want %s", name, typ, schemaColumns[name]))
		}
	}
	if !uniqueKey {
		problems = append(problems, "no primary key or unique index on (namespace, key)")
	}
	if len(problems) > 0 {
		return fmt.Errorf("pgstore: table %s does not have the store's shape: %s; set Options.Table to a table of its own and %s, or bring this one to the shape of pgstore.Migration",
			s.table, strings.Join(problems, "; "), fix)
	}
	if !privileged {
		return fmt.Errorf("pgstore: the current role may not SELECT, INSERT, UPDATE and DELETE on table %s; grant it those", s.table)
	}
	return nil
}

// tableName is the table's name as Options.Table gave it, for telling the
// user what to pass to EnsureSchema and Migration.
func (s *Store) tableName() string {
	parts := strings.Split(s.table, ".")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(p, `"`), `"`), `""`, `"`)
	}
	return strings.Join(parts, ".")
}
