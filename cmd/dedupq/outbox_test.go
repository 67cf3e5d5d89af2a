package main

// dedupq outbox status against the real PostgreSQL at 127.0.0.1:5432
// (database test, trust auth: the password in the DSN is ignored by the
// server and must never be printed by the command).

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/outbox"
)

func TestOutboxStatus(t *testing.T) {
	needService(t, "PostgreSQL", "127.0.0.1:5432")
	dsn := "postgres://postgres:" + secret + "@127.0.0.1:5432/test"
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	table := fmt.Sprintf("cmd_outbox_%d", time.Now().UnixNano())
	if err := outbox.EnsureSchema(t.Context(), pool, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(t.Context(), "DROP TABLE IF EXISTS "+table) })
	// Rows as Enqueue writes them (the command only reads), one parked
	// as the relay parks it.
	if _, err := pool.Exec(t.Context(), "INSERT INTO "+table+" (msg_id, body) VALUES ('a', ''), ('b', ''), ('c', '')"); err != nil {
		t.Fatalf("inserting outbox rows: %v", err)
	}
	if _, err := pool.Exec(t.Context(), "UPDATE "+table+" SET parked_at = now() WHERE msg_id = 'c'"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{"text, parked rows", []string{"outbox", "status", "--table", table, dsn}, exitUnsafe,
			[]string{"outbox " + table, "pending:        2", "parked:         1", "parked rows were not resent"}},
		{"json", []string{"outbox", "status", "--json", "--table", table, dsn}, exitUnsafe,
			[]string{`"pending": 2`, `"parked": 1`}},
		{"no table", []string{"outbox", "status", "--table", table + "_missing", dsn}, exitNoAnswer, nil},
		{"unreachable", []string{"outbox", "status", "--timeout", "5s", "postgres://postgres:" + secret + "@127.0.0.1:1/test"}, exitNoAnswer, nil},
		{"malformed", []string{"outbox", "status", "postgres://postgres:" + secret + "@127.0.0.1:notaport/test"}, exitUsage, nil},
		{"usage", []string{"outbox", "frob"}, exitUsage, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, tc.args...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.wantCode, stdout.String(), stderr.String())
			}
			if strings.Contains(stdout.String()+stderr.String(), secret) {
				t.Errorf("the output shows the DSN's password:\n%s%s", stdout.String(), stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}
