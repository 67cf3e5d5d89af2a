package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupq/dedupq/outbox"
	"github.com/dedupq/dedupq/window"
)

// outboxStatus is what `dedupq outbox status` reports.
type outboxStatus struct {
	Table         string  `json:"table"`
	Pending       int     `json:"pending"`
	Parked        int     `json:"parked"`
	OldestPending string  `json:"oldest_pending"`
	OldestSeconds float64 `json:"oldest_pending_seconds"`
}

// outboxCmd runs `dedupq outbox status [flags] DSN`. Its exit status is 1
// when rows are parked: the relay refused to resend them outside the
// protection it can prove, and only an operator can decide what to do.
func outboxCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "status" {
		fmt.Fprint(stderr, "usage: dedupq outbox status [flags] DSN\n")
		return exitUsage
	}
	fs := flag.NewFlagSet("dedupq outbox status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: dedupq outbox status [flags] DSN\n\nflags:\n")
		fs.PrintDefaults()
	}
	table := fs.String("table", outbox.DefaultTable, "the outbox table")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on connecting and reading")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "dedupq outbox status: give one PostgreSQL DSN")
		fs.Usage()
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	// The DSN may hold a password: it is never printed, and neither is an
	// error that could quote it (pgx's parse errors do).
	cfg, err := pgx.ParseConfig(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "dedupq outbox status: the DSN is malformed (not shown)")
		return exitUsage
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "dedupq outbox status: cannot connect to PostgreSQL at %s:%d, database %q\n", cfg.Host, cfg.Port, cfg.Database)
		return exitNoAnswer
	}
	defer conn.Close(context.Background())
	pending, parked, oldest, err := outbox.TableStatus(ctx, conn, *table)
	if err != nil {
		fmt.Fprintf(stderr, "dedupq outbox status: %v\n", err)
		return exitNoAnswer
	}
	st := outboxStatus{Table: *table, Pending: pending, Parked: parked,
		OldestPending: window.FormatDuration(oldest.Round(time.Second)), OldestSeconds: oldest.Seconds()}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	} else {
		fmt.Fprintf(stdout, "outbox %s\n  pending:        %d\n  parked:         %d\n  oldest pending: %s\n", st.Table, st.Pending, st.Parked, st.OldestPending)
		if parked > 0 {
			fmt.Fprintln(stdout, "  parked rows were not resent: their resend could fall outside the dedup window (see outbox.ParkedError for what to do)")
		}
	}
	if parked > 0 {
		return exitUnsafe
	}
	return exitOK
}
