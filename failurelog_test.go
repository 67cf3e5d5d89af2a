// Tests of the Consumer's logging of handler failures, against the
// channel-fed driver of consumer_test.go, on a fake clock: no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/internal/testutil"
)

// records is a slog handler that keeps every record.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// matching returns the records whose message contains msg, each as its
// attributes by key.
func (r *records) matching(msg string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.all {
		if !strings.Contains(rec.Message, msg) {
			continue
		}
		attrs := map[string]string{"level": rec.Level.String()}
		rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
		out = append(out, attrs)
	}
	return out
}

// A handler's failure is logged at Warn with what happens to its delivery;
// a flood of one kind logs one line every failureLogEvery, with the count
// it left out; another kind is logged on its own; a panic is logged at
// Error with its stack, and its delivery nacked.
func TestHandlerFailuresAreLogged(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	sub := newChanSub()
	var rec records
	c, err := NewConsumer(context.Background(), sub, ConsumerOptions{Clock: fake, Logger: slog.New(&rec)})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c, func(_ context.Context, d *Delivery) error {
		switch {
		case strings.HasPrefix(d.Message.ID, "db-"):
			return fmt.Errorf("insert order %q: %w", d.Message.ID, errors.New("duplicate key value"))
		case d.Message.ID == "poison":
			return Permanent(errors.New("cannot parse"))
		case d.Message.ID == "bug":
			var m map[string]int
			m["x"]++ // panics: a nil map
		}
		return nil
	})
	defer stop()
	for i := range 50 {
		sub.push(fmt.Sprintf("db-%d", i), 0)
	}
	sub.push("poison", 0)
	sub.push("bug", 0)
	testutil.WaitFor(t, func() bool { return sub.get("bug") != "" && sub.get("db-49") != "" })

	failed := rec.matching("handler failed")
	if len(failed) != 2 {
		t.Fatalf("%d failure lines for 50 failures of one kind and one of another, want 2: %v", len(failed), failed)
	}
	byID := map[string]map[string]string{}
	for _, f := range failed {
		byID[f["id"]] = f
	}
	if f := byID["db-0"]; f == nil || f["level"] != "WARN" || f["attempt"] != "1" || f["next"] != "nack, redelivered after 7s" || !strings.Contains(f["err"], "duplicate key value") {
		t.Errorf("the first failure's line: %v", f)
	}
	if f := byID["poison"]; f == nil || f["next"] != "terminate (dead-letter where the backend can)" {
		t.Errorf("the permanent failure's line: %v", f)
	}
	panics := rec.matching("handler panicked")
	if len(panics) != 1 || panics[0]["level"] != "ERROR" || !strings.Contains(panics[0]["stack"], "TestHandlerFailuresAreLogged") ||
		!strings.Contains(panics[0]["err"], "assignment to entry in nil map") {
		t.Fatalf("the panic's lines: %v", panics)
	}
	if got := sub.get("bug"); got != "nack 7s" {
		t.Errorf("the panicking delivery settled %q, want nacked", got)
	}

	// failureLogEvery later, the kind is logged again, with the count of
	// the lines it left out.
	fake.Advance(failureLogEvery)
	sub.push("db-last", 0)
	testutil.WaitFor(t, func() bool { return sub.get("db-last") != "" })
	failed = rec.matching("handler failed")
	if last := failed[len(failed)-1]; last["id"] != "db-last" || last["suppressed_since_last"] != "49" {
		t.Errorf("the next line of the kind: %v, want it to count the 49 left out", last)
	}
}

func TestPanicErrorUnwrapsAnErrorValue(t *testing.T) {
	cause := errors.New("boom")
	err := safeCall(context.Background(), func(context.Context, *Delivery) error { panic(cause) }, &Delivery{})
	var pe *PanicError
	if !errors.As(err, &pe) || !errors.Is(err, cause) || len(pe.Stack) == 0 {
		t.Fatalf("safeCall = %v, want a *PanicError with its stack, wrapping the value", err)
	}
}
