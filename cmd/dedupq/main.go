// Command dedupq answers "is this deployment window-safe?" against live
// brokers, for people and for deployment pipelines.
//
//	dedupq check [flags] URL...
//	dedupq outbox status [flags] DSN
//
// opens each URL through dedupq's URL registry (every backend is linked
// in, and jetstream://embedded/… too), reads the live dedup window and
// redelivery settings without creating anything (a URL with create=true is
// checked against what would be created), and runs the two startup checks
// of dedupq.NewPublisher and dedupq.NewConsumer on them with the retry
// policy and the consumer dedup TTL given by flags. Several URLs are
// checked with the same policy and summed up side by side: the migration
// question of whether a policy safe on one broker is safe on another.
//
// The retry policy is DefaultRetryPolicy's, changed by --policy FILE (a
// JSON object with the flags' names as keys, durations as strings such as
// "10s") and then by the flags given. Of a URL it prints what
// dedupq.RedactURL shows: of the query, only the values of known
// parameters that are checked to carry no secret (durations, counts,
// booleans, names); a backend's error is printed without whatever that
// hides.
//
// outbox status prints how many rows of a transactional outbox (package
// outbox) wait to be published, how many the relay parked, and the age of
// the oldest waiting one; it exits 1 when rows are parked. The DSN is never
// printed.
//
// Exit status: 0 when every check passes, 1 when a check fails (the
// policy is unsafe on some backend), 2 when a URL could not be opened or
// read (takes precedence: the answer is incomplete), 64 on a usage error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	_ "github.com/dedupq/dedupq/adapters/mem"
	_ "github.com/dedupq/dedupq/adapters/pubsub"
	_ "github.com/dedupq/dedupq/adapters/servicebus"
	_ "github.com/dedupq/dedupq/adapters/sqs"
)

// Exit statuses.
const (
	exitOK       = 0
	exitUnsafe   = 1
	exitNoAnswer = 2
	exitUsage    = 64
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  dedupq check [flags] URL...          check a retry policy against live brokers
  dedupq outbox status [flags] DSN     pending and parked rows of a transactional outbox

Run "dedupq check -h" for the flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "check":
		return check(ctx, args[1:], stdout, stderr)
	case "outbox":
		return outboxCmd(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "dedupq: unknown command %q\n%s", args[0], usage)
	return exitUsage
}

func check(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dedupq check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: dedupq check [flags] URL...\n\nflags:\n")
		fs.PrintDefaults()
	}
	var f policyFlags
	f.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on opening and reading each URL")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "dedupq check: give at least one URL")
		fs.Usage()
		return exitUsage
	}
	opts, err := f.options(fs)
	if err != nil {
		fmt.Fprintf(stderr, "dedupq check: %v\n", err)
		return exitUsage
	}
	defer func() {
		// The embedded server, started by a jetstream://embedded/… URL,
		// leaves its store directory behind otherwise.
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = embedded.Shutdown(sctx)
	}()

	var reps []report
	for _, raw := range fs.Args() {
		c, cancel := context.WithTimeout(ctx, *timeout)
		in, err := dedupq.Inspect(c, raw, opts)
		cancel()
		reps = append(reps, newReport(raw, in, err, opts.DedupTTL))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(reps); err != nil {
			fmt.Fprintf(stderr, "dedupq check: %v\n", err)
			return exitNoAnswer
		}
	} else {
		printText(stdout, reps)
	}
	return status(reps)
}

// status is the exit status for reps.
func status(reps []report) int {
	code := exitOK
	for _, r := range reps {
		switch {
		case r.Error != "":
			return exitNoAnswer
		case !r.Publisher.OK || !r.Consumer.OK:
			code = exitUnsafe
		}
	}
	return code
}
