// Package dedup makes message handlers idempotent by dedup key.
//
// A Store records, per key, one of three states: free, in progress (claimed
// under a lease by one consumer) or completed (with a TTL). A Guard wraps a
// dedupq.Handler with the only safe order of operations: claim, run the
// handler, then complete — or release the claim when the handler fails, so
// that the redelivery is processed instead of swallowed.
//
// The one gap no separate store can close: the handler's effect commits,
// then the completion write fails (the store is down, the process dies in
// between). The key then stays in progress until its lease expires and a
// later duplicate runs the effect again. Closing it needs the dedup record
// to commit in the same transaction as the effect: see the pgstore package's
// transactional API.
package dedup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dedupq/dedupq"
)

// State is what a Claim found.
type State int

const (
	// Acquired means the caller now holds the key under a lease and must
	// Complete or Release it.
	Acquired State = iota + 1
	// Completed means the key was processed before and its record has not
	// expired.
	Completed
	// InProgress means another claimant holds a live lease on the key.
	InProgress
)

// String implements fmt.Stringer.
func (s State) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case Completed:
		return "completed"
	case InProgress:
		return "in progress"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Claim is the answer to Store.Claim.
type Claim struct {
	State State
	// Token proves ownership of an Acquired claim; pass it to Extend,
	// Complete and Release.
	Token string
	// Fingerprint is the fingerprint stored with the key by whoever
	// claimed or completed it (Completed, InProgress). Compare it with the
	// caller's to detect a key reused for a different payload.
	Fingerprint string
	// LeaseUntil is when the holder's lease ends (InProgress).
	LeaseUntil time.Time
	// Result is the small result stored at completion, if any (Completed).
	Result []byte
}

var (
	// ErrLeaseLost is returned by Extend, Complete and Release when another
	// claimant took the key over after the caller's lease expired.
	ErrLeaseLost = errors.New("dedup: lease lost to another claimant")
	// ErrInProgress is the cause of the nack of a delivery whose key is held
	// by another in-flight handler.
	ErrInProgress = errors.New("dedup: key is being processed by another consumer")
	// ErrFingerprintMismatch matches every *ConflictError.
	ErrFingerprintMismatch = errors.New("dedup: key reused with a different payload")
	// ErrStoreUnavailable wraps store errors on the fail-closed path: the
	// delivery is never processed without a dedup decision. It matches
	// dedupq.ErrUnavailable, so a Consumer holds the delivery and tries
	// again until the store answers, instead of spending its deliveries,
	// for as long as the startup check allows (the delivery's ack wait;
	// see dedupq.ErrUnavailable).
	ErrStoreUnavailable error = storeUnavailable("dedup: store unavailable")
	// ErrEmptyKey is the cause of the nack of a delivery whose dedup key
	// came out empty: a message without a dedup ID on a backend that gives
	// no fallback identity, or a GuardOptions.Key that returned "". An
	// empty key would be shared by every such delivery, so that all but the
	// first were skipped or reported as conflicts.
	ErrEmptyKey = errors.New("dedup: empty dedup key")
	// ErrNotReady matches the error of a readiness check (Guard.Check,
	// a Checker store) that found the store unusable.
	ErrNotReady = errors.New("dedup: store not ready")
)

// storeUnavailable is ErrStoreUnavailable's type: it matches
// dedupq.ErrUnavailable without changing its message.
type storeUnavailable string

func (e storeUnavailable) Error() string { return string(e) }

// Is makes errors.Is(ErrStoreUnavailable, dedupq.ErrUnavailable) true.
func (e storeUnavailable) Is(target error) bool { return target == dedupq.ErrUnavailable }

// ConflictError reports a dedup key seen with a different payload
// fingerprint than the one recorded for it.
type ConflictError struct {
	Key        string
	Stored     string
	Got        string
	StoredWhen State
}

// Error implements the error interface.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("dedup: key %q was %s with payload fingerprint %s, now seen with %s", e.Key, e.StoredWhen, short(e.Stored), short(e.Got))
}

// Is makes errors.Is(err, ErrFingerprintMismatch) true.
func (e *ConflictError) Is(target error) bool { return target == ErrFingerprintMismatch }

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// Store records dedup keys. Implementations must be safe for concurrent use
// by many processes: Claim is atomic, so of any number of concurrent callers
// on a free key exactly one gets Acquired.
type Store interface {
	// Claim takes key under a lease if it is free (never seen, released,
	// completion expired, or its holder's lease expired), recording
	// fingerprint with it. Otherwise it reports Completed or InProgress.
	Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (Claim, error)
	// Extend renews the lease of the claim token holds. It fails with
	// ErrLeaseLost only if another claimant took the key over; a lease that
	// lapsed without a takeover is renewed.
	Extend(ctx context.Context, key, token string, lease time.Duration) error
	// Complete marks key done for ttl, storing result (may be nil). Same
	// ownership rule as Extend.
	Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error
	// Release frees key so the next delivery processes it. Releasing a key
	// the caller no longer holds returns ErrLeaseLost and changes nothing.
	Release(ctx context.Context, key, token string) error
}

// Checker is implemented by a Store that can tell, cheaply and before the
// first delivery, whether it can work: the server answers, and what the
// claim needs (a table, a command) is there. Guard.Check calls it, and
// dedupq.NewConsumer calls Guard.Check, so that a dead or unprepared store
// fails the consumer's startup instead of nacking every delivery.
type Checker interface {
	// Check returns nil if the store is ready. An error wraps
	// ErrStoreUnavailable when the store could not be reached (it may come
	// back by itself); any other error means it answered but is not set up
	// (a missing table, a server too old), and says what to do.
	Check(ctx context.Context) error
}
