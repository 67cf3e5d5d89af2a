// Package dedupq makes exactly-once effects practical on real message
// brokers: at-least-once delivery, plus deduplication that is proven at
// startup to cover every retry.
//
// A Publisher sends messages with a dedup ID and retries them — always with
// the same ID — only for as long as the broker's dedup window (or a declared
// consumer-side dedup store) still remembers the first attempt. A Consumer
// runs a Handler for each delivery and acks, nacks or dead-letters it by the
// handler's result. Both are portable: a backend plugs in through the narrow
// interfaces of package driver, and programs switch brokers by URL (see
// OpenPublisher) without code changes.
//
// The rule both enforce at construction is "the window is the bug": a retry
// or redelivery policy whose worst-case span outlives the window that
// protects it fails with a *window.UnsafeRetryError naming the numbers and a
// fix.
package dedupq

import (
	"context"
	"maps"
	"time"

	"github.com/dedupq/dedupq/driver"
)

// Message is what a Publisher sends and a Consumer receives.
type Message struct {
	// ID is the dedup key: two messages with the same ID are the same
	// message, however often they are sent. Required, unless the
	// Publisher has a KeyFunc to derive it.
	ID string
	// Body is the payload.
	Body []byte
	// Attributes are user metadata, delivered unchanged.
	Attributes map[string]string
	// GroupKey groups messages for ordering: where the subscription keeps
	// a group's order (SQS FIFO's MessageGroupId, the in-memory broker),
	// the Consumer handles the messages of one key one at a time, in
	// publish order (ConsumerOptions.Ordered). Other backends carry it
	// (Service Bus SessionId, Pub/Sub ordering key, JetStream subject
	// suffix) but their Consumers do not order by it yet: a Consumer with
	// Ordered refuses them at construction rather than drop the order
	// silently.
	GroupKey string
}

// Delivery is one delivery of a message to a Handler. The same message may
// be delivered more than once; Attempt says which delivery this is.
type Delivery struct {
	// Message is the message as published.
	Message Message
	// Attempt is 1 on the first delivery and counts up on each redelivery.
	Attempt int
	// BackendID is the broker's own ID for the message (JetStream stream
	// sequence, SQS MessageId, …).
	BackendID string
	// Lease is how long the broker holds this delivery for this consumer
	// before redelivering it. The Consumer extends it while the handler
	// runs, where the backend allows.
	Lease time.Duration
	// ClaimDeadline is the latest moment the handler may claim the
	// message's key in a dedup store (window.ConsumerPlan.ClaimDeadline):
	// a Deduplicator bounds its claim by it, so that a store that answers
	// slowly cannot let an effect start later than the startup check
	// counts. Zero means no bound.
	ClaimDeadline time.Time
}

// Handler processes one delivery. Returning nil acks it; returning an error
// nacks it for redelivery (after RetryAfter's delay, if the error carries
// one); returning an error made by Permanent terminates it (dead-letter);
// returning one that matches ErrUnavailable (a dependency is down) keeps
// the delivery and runs the handler on it again after a backoff. A panic
// is recovered and treated as an error.
type Handler func(ctx context.Context, d *Delivery) error

// Deduplicator is consumer-side deduplication that a Consumer runs around
// its handler (package dedup's Guard is one). The Consumer checks at startup
// that TTL covers the redelivery span.
type Deduplicator interface {
	// Wrap returns h made idempotent by dedup key.
	Wrap(h Handler) Handler
	// TTL is how long a completed key is remembered.
	TTL() time.Duration
}

// Result is the outcome of publishing one message.
type Result struct {
	// ID is the dedup ID that was sent.
	ID string
	// BackendID is the broker's ID for the stored message.
	BackendID string
	// Duplicate is true when the broker reported that it dropped this send
	// as a duplicate of an earlier one: the message was already stored.
	Duplicate bool
	// Attempts is the number of sends made.
	Attempts int
	// Err is nil on success, else a *PublishError or *ValidationError.
	Err error
}

// toDriverMessage copies m into dm, the attributes too, so that the
// trace context added later does not write into the caller's map. Callers
// pass a dm from a slice they allocated once for a whole batch.
func toDriverMessage(m *Message, dm *driver.Message) {
	*dm = driver.Message{ID: m.ID, Body: m.Body, Attributes: maps.Clone(m.Attributes), GroupKey: m.GroupKey}
}

func fromDriverDelivery(d *driver.Delivery) *Delivery {
	out := new(Delivery)
	copyDelivery(out, d)
	return out
}

func copyDelivery(out *Delivery, d *driver.Delivery) {
	*out = Delivery{
		Message: Message{
			ID: d.Message.ID, Body: d.Message.Body,
			Attributes: d.Message.Attributes, GroupKey: d.Message.GroupKey,
		},
		Attempt:   d.Attempt,
		BackendID: d.BackendID,
		Lease:     d.Lease,
	}
}
