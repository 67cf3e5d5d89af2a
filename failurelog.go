package dedupq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
)

// PanicError is a handler's panic, recovered by the Consumer and treated as
// the handler's failure: its delivery is nacked, and the process goes on.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the panicking goroutine's stack.
	Stack []byte
}

// Error implements the error interface.
func (e *PanicError) Error() string { return fmt.Sprintf("dedupq: handler panicked: %v", e.Value) }

// Unwrap returns Value when it is an error, for errors.Is and errors.As.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// failureLogEvery is how often each kind of handler failure is logged: a
// flood of one kind (a database that refuses every write) logs a line per
// kind this often, with the count of those it left out.
const failureLogEvery = 10 * time.Second

// failureLog logs handler failures at Warn, a panic's at Error with its
// stack, at most one line per kind of failure every failureLogEvery.
type failureLog struct {
	log   *slog.Logger
	clock clock.Clock

	mu    sync.Mutex
	kinds map[string]*failureKind
}

// failureKind is one kind of failure's logging state.
type failureKind struct {
	next       time.Time // when a failure of the kind is logged again
	suppressed int       // failures not logged since the last line
}

// maxFailureKinds bounds the kinds remembered: an error text that varies
// where failureKindOf cannot see it must not grow the map without end.
const maxFailureKinds = 1024

// failed logs d's handler failure err, whose delivery is settled as next
// says ("nack, redelivered after 7s", "terminate", …), unless a failure of
// its kind was logged less than failureLogEvery ago.
func (f *failureLog) failed(ctx context.Context, d *driver.Delivery, err error, next string) {
	kind := failureKindOf(err)
	now := f.clock.Now()
	f.mu.Lock()
	k := f.kinds[kind]
	if k == nil {
		if len(f.kinds) >= maxFailureKinds {
			clear(f.kinds)
		}
		k = &failureKind{}
		f.kinds[kind] = k
	}
	if now.Before(k.next) {
		k.suppressed++
		f.mu.Unlock()
		return
	}
	k.next = now.Add(failureLogEvery)
	suppressed := k.suppressed
	k.suppressed = 0
	f.mu.Unlock()

	attrs := []any{"err", err, "id", d.Message.ID, "attempt", d.Attempt, "next", next}
	if d.Message.GroupKey != "" {
		attrs = append(attrs, "group", d.Message.GroupKey)
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed_since_last", suppressed)
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		f.log.ErrorContext(ctx, "dedupq: handler panicked; the delivery is treated as failed", append(attrs, "stack", string(pe.Stack))...)
		return
	}
	f.log.WarnContext(ctx, "dedupq: handler failed", attrs...)
}

// failureKindOf names err's kind: its type and its text with what varies
// from one message to the next (quoted parts, numbers) taken out, and a
// panic by where it happened.
func failureKindOf(err error) string {
	var pe *PanicError
	if errors.As(err, &pe) {
		return "panic " + panicSite(pe.Stack)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%T ", err)
	quoted := false
	for _, r := range err.Error() {
		switch {
		case r == '"':
			quoted = !quoted
		case quoted || unicode.IsDigit(r):
		default:
			b.WriteRune(r)
		}
		if b.Len() > 160 {
			break
		}
	}
	return b.String()
}

// panicSite is the first frame of stack below the runtime's panic
// machinery: the function that panicked.
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "panic(") && i+2 < len(lines) {
			return strings.TrimSpace(lines[i+2]) // the file:line under the panicking function
		}
	}
	return "unknown"
}

// recoverPanic turns a handler's panic into a *PanicError, with its stack.
func recoverPanic(r any) error {
	return &PanicError{Value: r, Stack: debug.Stack()}
}
