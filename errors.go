package dedupq

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrInvalidMessage matches every *ValidationError.
	ErrInvalidMessage = errors.New("invalid message")
	// ErrNotSent marks a valid message that was not sent because another
	// message in the same batch was invalid: its *PublishError (Attempts 0,
	// MaybeSent false) wraps it.
	ErrNotSent = errors.New("not sent: another message in the batch is invalid")
	// ErrClosed is returned by a Publisher or Consumer used after Close.
	ErrClosed = errors.New("dedupq: closed")
	// ErrPermanent matches every error made by Permanent.
	ErrPermanent = errors.New("permanent failure")
	// ErrUnavailable marks a handler error caused by something the handler
	// depends on being down (a dedup store, the database it writes to),
	// not by the message: dedup.ErrStoreUnavailable matches it, and a
	// handler may wrap its own such errors in it. A Consumer does not nack
	// such a delivery, which would spend one of the message's deliveries
	// per failed try (a broker that redelivers a nack at once would
	// dead-letter every message in flight within seconds of an outage):
	// it keeps the delivery and runs the handler on it again, with
	// backoff, until the handler returns something else, the Consumer
	// stops (its Run's context done, Close, or a receive failed for good),
	// or the next try would start after the delivery's claim deadline
	// (window.ConsumerPlan's ClaimDeadline): the earliest of the broker's
	// ack wait from its receipt, half its lease (when the Consumer would
	// first renew it) and the dedup TTL. Then it nacks the delivery as any
	// failure. The deadline keeps the startup check true: the check counts
	// each delivery as claiming the key within its ack wait and lasting no
	// longer unless it holds the claim, and a try after it could claim a
	// key whose completion had expired meanwhile, running the effect
	// twice. An outage longer than the redelivery span (every delivery's
	// share of it, and the backoffs) therefore dead-letters the messages
	// it holds up; ride out longer outages with a longer ack wait, more
	// deliveries or a longer backoff, which the check then asks the dedup
	// TTL to cover. Handlers must be safe to run again on ErrUnavailable,
	// as on any redelivery.
	ErrUnavailable = errors.New("dedupq: a dependency of the handler is unavailable")
)

// ValidationError says why a message was refused before anything was sent.
type ValidationError struct {
	// Index is the message's position in the batch.
	Index int
	// ID is the message's dedup ID (possibly empty).
	ID string
	// Field is the part that is wrong: "ID", "Body", "Attributes",
	// "GroupKey".
	Field string
	// Reason says what is wrong, with the backend's limit.
	Reason string
	// Backend names the backend whose limit was hit.
	Backend string
	// Err is the backend's own error when its final check refused the
	// message (driver.Limits.Check), nil otherwise.
	Err error
}

// Error implements the error interface.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("dedupq: message %d (id %q) refused before sending: %s: %s", e.Index, trimID(e.ID), e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidMessage) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidMessage }

// Unwrap returns the backend's own error, if any.
func (e *ValidationError) Unwrap() error { return e.Err }

func trimID(id string) string {
	if len(id) > 64 {
		return id[:61] + "..."
	}
	return id
}

// PublishError is the final failure of one message. Attempts 0 means it was
// never handed to the broker: another message of its batch was invalid
// (Err is ErrNotSent), or ctx ended before its chunk's turn (Err is the
// context's cause).
type PublishError struct {
	// Index is the message's position in the batch.
	Index int
	// ID is the message's dedup ID; resend with the same ID.
	ID string
	// Attempts is how many sends were made (0 if none).
	Attempts int
	// MaybeSent is true when an attempt ended without a clear answer
	// (timeout, lost connection, cancelled context, no result from the
	// driver for this message), so the broker may have stored the message. Resending with the same ID is then safe only
	// within the window; a false MaybeSent means the broker refused every
	// attempt.
	MaybeSent bool
	// Err is the last attempt's error.
	Err error
}

// Error implements the error interface.
func (e *PublishError) Error() string {
	if e.Attempts == 0 {
		return fmt.Sprintf("dedupq: message %d (id %q) not sent: %v", e.Index, trimID(e.ID), e.Err)
	}
	sent := "not sent"
	if e.MaybeSent {
		sent = "may have been sent; resend with the same ID"
	}
	return fmt.Sprintf("dedupq: publish of message %d (id %q) failed after %d attempt(s), %s: %v", e.Index, trimID(e.ID), e.Attempts, sent, e.Err)
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *PublishError) Unwrap() error { return e.Err }

// BatchError lists every message of a batch that the broker did not
// store, or may not have: every message not listed was stored (or dropped
// by the broker as a duplicate of a stored one). Resending the listed
// messages with the same IDs, once the invalid ones are fixed, therefore
// resends everything that is missing. When any message is invalid nothing
// is sent and every message is listed. errors.Is and errors.As see each
// listed error: ErrInvalidMessage, ErrNotSent, a context's error, the
// driver's own errors.
type BatchError struct {
	// Total is the batch size.
	Total int
	// Failed holds one error per message not stored, in batch order, each
	// carrying the message's Index and ID: a *ValidationError for an
	// invalid message (nothing of the batch was sent), else a
	// *PublishError, whose MaybeSent says whether the broker may have
	// stored it anyway.
	Failed []error
}

// Error implements the error interface.
func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "dedupq: %d of %d messages failed", len(e.Failed), e.Total)
	for i, err := range e.Failed {
		if i == 3 {
			fmt.Fprintf(&b, "; and %d more", len(e.Failed)-3)
			break
		}
		b.WriteString("; ")
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is and errors.As look at every failure.
func (e *BatchError) Unwrap() []error { return e.Failed }

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// Permanent marks a handler error as one no redelivery can fix: the consumer
// terminates the message (dead-letters it where the backend can) instead of
// nacking it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// RetryAfterError asks the consumer to nack a delivery with a given delay
// instead of the redelivery policy's.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

// Error implements the error interface.
func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter wraps a handler error so that the delivery is redelivered after
// delay (as far as the backend allows). Keep delay within the delivery's
// Lease: the startup check counts each delivery as lasting at most its
// lease, so longer delays stretch the redelivery span past what it checked.
func RetryAfter(err error, delay time.Duration) error {
	if err == nil {
		return nil
	}
	return &RetryAfterError{Delay: delay, Err: err}
}
