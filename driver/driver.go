// Package driver is the narrow interface a backend implements to plug into
// dedupq. Users never call it: they use dedupq.Publisher and
// dedupq.Consumer, which wrap a driver and add everything written once for
// all backends — validation, retries with the same dedup ID, the startup
// window check, concurrency, lease extension and graceful shutdown.
//
// A driver does one attempt of each operation and reports what the broker
// said. It must not retry on its own beyond what its SDK does inside one
// call (and must declare that in Topic.HiddenRetrySpan), because the
// portable layer owns the retry budget.
//
// Opening a driver creates nothing on the broker: see Provisioner for how a
// driver that creates streams, consumers or queues does so only once the
// startup check has passed.
package driver

import (
	"context"
	"time"

	"github.com/dedupq/dedupq/window"
)

// Message is a message as a driver sends and receives it.
type Message struct {
	// ID is the dedup key. Drivers map it to the broker's dedup field
	// (MessageDeduplicationId, MessageId, Nats-Msg-Id) and must return it
	// unchanged on the consumer side.
	ID string
	// Body is the payload.
	Body []byte
	// Attributes are user metadata, returned unchanged to consumers.
	Attributes map[string]string
	// GroupKey is the ordering/group key (SQS MessageGroupId, Service Bus
	// SessionId, Pub/Sub ordering key, JetStream subject suffix).
	GroupKey string
}

// Size is the message's size as dedupq measures it against a backend's
// limit: the body plus every attribute key and value. Brokers that count
// less are then checked conservatively.
func (m *Message) Size() int {
	n := len(m.Body)
	for k, v := range m.Attributes {
		n += len(k) + len(v)
	}
	return n
}

// Limits are what a backend accepts. The portable layer checks every
// message against them before anything is sent. A zero field means no
// limit.
type Limits struct {
	// MaxIDLength is the longest dedup ID, in bytes.
	MaxIDLength int
	// IDAllowed reports whether a character may appear in a dedup ID or
	// group key; nil allows any.
	IDAllowed func(r rune) bool
	// MaxMessageBytes bounds Message.Size.
	MaxMessageBytes int
	// MaxAttributes bounds the number of attributes.
	MaxAttributes int
	// MaxAttributeValueBytes bounds each attribute value.
	MaxAttributeValueBytes int
	// GroupKeyRequired refuses messages without a group key.
	GroupKeyRequired bool
	// MaxGroupKeyLength is the longest group key, in bytes.
	MaxGroupKeyLength int
	// GroupKeyAllowed is IDAllowed for group keys; nil uses IDAllowed.
	GroupKeyAllowed func(r rune) bool
	// AttributeNameAllowed reports whether an attribute name is accepted;
	// nil accepts any non-empty name.
	AttributeNameAllowed func(name string) bool
	// Check is the backend's own final check, for rules the fields above
	// cannot state (SQS counts size after its own encoding). A non-nil
	// error refuses the message before anything in its batch is sent; it
	// names the refused part in field ("ID", "Body", "Attributes",
	// "GroupKey").
	Check func(m *Message) (field string, err error)
}

// SendResult is the broker's answer for one message.
type SendResult struct {
	// BackendID is the broker's own ID for the stored message (sequence
	// number, MessageId).
	BackendID string
	// Duplicate is true when the broker said it dropped this send as a
	// duplicate of an earlier one with the same dedup ID. That is success.
	Duplicate bool
	// Err is this message's failure, nil on success.
	Err error
}

// Topic sends messages.
type Topic interface {
	// SendBatch makes one attempt to send msgs (at most MaxBatch of them)
	// and returns one result per message, in order. A non-nil error means
	// the call failed as a whole, and then any message may or may not have
	// been stored.
	SendBatch(ctx context.Context, msgs []*Message) ([]SendResult, error)
	// MaxBatch is the most messages SendBatch accepts at once (≥ 1).
	MaxBatch() int
	// Limits are what the backend accepts.
	Limits() Limits
	// Window reports the window that deduplicates sends, read from the
	// live broker where it exposes one. Called at startup and on demand.
	// Its Settings name where the backend's user changes the window, so
	// that the startup check's fixes do.
	Window(ctx context.Context) (window.Window, error)
	// HiddenRetrySpan is worst-case extra time the SDK's own retries can
	// add inside one SendBatch call beyond the attempt's context deadline.
	// Usually zero: drivers should let the context bound the SDK.
	HiddenRetrySpan() time.Duration
	// IsRetryable reports whether an error from SendBatch (whole-call or
	// per-message) may succeed on a resend. A non-retryable error must
	// mean the broker refused the message, so it was not stored.
	IsRetryable(err error) bool
	// Close releases the driver's resources.
	Close() error
}

// BatchStarter is implemented by a Topic that can hand a batch to the
// broker and wait for its answers separately, and that keeps the order of
// the batches it starts: every message of one StartBatch call goes out
// before any message of the next call's (one connection written in call
// order, as JetStream's). The portable layer then starts the next chunk of
// a large batch while the broker still answers the earlier ones, instead
// of idling for every answer at each chunk boundary. A driver that cannot
// promise that order must not implement it: SendBatch serves it alone.
type BatchStarter interface {
	// StartBatch makes one attempt to send msgs (at most MaxBatch of
	// them), as SendBatch does, and returns once every message is on its
	// way, without waiting for the broker. wait then blocks until the
	// broker answered each message or ctx ended, and returns what
	// SendBatch would have: one result per message, in order, a message
	// without an answer reported with a retryable error. The caller calls
	// wait exactly once. A non-nil err is the call's failure as a whole,
	// as SendBatch's (any message may have been stored); wait is then nil.
	StartBatch(ctx context.Context, msgs []*Message) (wait func() ([]SendResult, error), err error)
}

// Delivery is one delivery of a message to a consumer.
type Delivery struct {
	Message Message
	// Attempt is 1 for the first delivery and counts up on redelivery.
	Attempt int
	// BackendID is the broker's own message ID.
	BackendID string
	// Lease is how long this delivery is held before the broker redelivers
	// it, unless acked, nacked or extended.
	Lease time.Duration
	// Received is when the broker handed this delivery to the client, for
	// a driver that may hold it a while before Receive returns it (a
	// client that receives ahead, as Pub/Sub's does): its lease and its
	// claim deadline run from then. Zero means when Receive returned it.
	Received time.Time
	// Handle is the driver's own data (ack handle, lock token).
	Handle any
}

// Subscription receives deliveries and settles them.
type Subscription interface {
	// Receive blocks until at least one delivery is available, then
	// returns up to max of them; it returns ctx's error when ctx is done
	// first.
	Receive(ctx context.Context, max int) ([]*Delivery, error)
	// Ack settles d as processed; the broker will not redeliver it. An
	// error means the broker may not have received the ack.
	Ack(ctx context.Context, d *Delivery) error
	// Nack returns d for redelivery after delay (or the broker's own
	// backoff, where it applies one). A NackHolder's Nack returns it at
	// once: the portable layer held it for the delay before the call.
	Nack(ctx context.Context, d *Delivery, delay time.Duration) error
	// Terminate stops redelivery of d: dead-letter it where the backend
	// has a dead-letter queue, drop it otherwise. reason says why.
	Terminate(ctx context.Context, d *Delivery, reason error) error
	// Extend renews d's lease by at least by. Drivers that cannot return
	// an error matching errors.ErrUnsupported.
	Extend(ctx context.Context, d *Delivery, by time.Duration) error
	// Window reports the publish-side window for the entity consumed. Its
	// Settings name where the window and the redelivery policy are set.
	Window(ctx context.Context) (window.Window, error)
	// Redelivery reports the broker's real redelivery settings for this
	// subscription.
	Redelivery(ctx context.Context) (window.RedeliveryPolicy, error)
	// IsRetryable reports whether an error from Receive is transient.
	IsRetryable(err error) bool
	// Close releases the driver's resources. In-flight deliveries that
	// were not settled are redelivered by the broker later.
	Close() error
}

// UnconfirmedAcker is implemented by a Subscription whose broker takes an
// ack without confirming it, at a fraction of a confirmed ack's cost
// (JetStream's plain Ack against its DoubleAck). The portable layer uses
// it only where a consumer-side dedup store covers an ack that is lost:
// the redelivery is then suppressed as a duplicate. Without a dedup store
// every ack goes through Subscription.Ack.
type UnconfirmedAcker interface {
	// AckUnconfirmed sends an ack for d and returns once it is handed to
	// the connection, without waiting for the broker. An error means it
	// was not sent; the caller then falls back to Ack. A Subscription's
	// Close sends every ack handed over before it.
	AckUnconfirmed(d *Delivery) error
}

// NackHolder is implemented by a Subscription whose broker cannot delay a
// redelivery (Pub/Sub, Service Bus: a nacked or abandoned message is
// available again at once). The portable layer honours a nack's delay for
// it by holding the delivery: it keeps the delivery's lease alive with
// Extend, as for a running handler, and calls Nack once the delay (capped
// at MaxNackHold) has passed, or at once when the Consumer's Run stops;
// when the Consumer is closing it leaves the delivery unsettled instead,
// for the Subscription's Close, which comes next, to give back. The
// driver's Nack is always called with a zero delay, and it never holds a
// delivery itself.
type NackHolder interface {
	// MaxNackHold is the longest d may be held before its Nack: the
	// longest the driver can keep its lease (a client that stops
	// extending it, a lock renewal that must not outlast an entity's
	// settings). Redelivery must count it in the backoff before every
	// redelivery, since a nacked delivery can come back that much later.
	// Zero or less means no hold: d is nacked at once.
	MaxNackHold(d *Delivery) time.Duration
}

// GroupOrderer is implemented by a Subscription whose broker keeps the
// messages of one GroupKey in publish order (SQS FIFO message groups,
// Service Bus sessions, Pub/Sub ordering keys, a pinned JetStream consumer,
// the in-memory broker). The portable layer relies on three things only:
// Receive returns a group's deliveries in the group's order (it may return
// several of a group at once, and later ones while an earlier one is still
// being handled); one group is handed to one consumer at a time, until it
// dies or lets the group go, and the next owner gets the unsettled ones
// again before later ones; and a nacked delivery comes again, after its
// delay, before any later message of its group not yet handed out. It then
// runs a group's deliveries one at a time, in the order received; when one
// fails it gives back (nacks) those behind it with the same delay, and any
// later one of the group that arrives before the failed one comes again,
// so that a broker that streams a group cannot let a later message
// overtake an earlier one's redelivery. A driver orders nothing itself.
type GroupOrderer interface {
	// OrdersGroups reports nil when this subscription keeps a group's
	// order, else why not and what would (an entity created without
	// sessions, a subscription without message ordering), for the
	// portable layer's refusal of an ordered consumer.
	OrdersGroups(ctx context.Context) error
}

// Provisioner is implemented by a Topic or Subscription whose
// configuration asks it to create broker state that may be missing: a
// stream, a durable consumer, an in-process queue. It exists so that a
// refused open leaves the broker as it was: the startup check runs on what
// the driver will create, and only an open that passes it creates
// anything.
//
// The contract, for every driver:
//
//   - Opening (the driver's constructor, a URLOpener's OpenTopic or
//     OpenSubscription) only reads: it creates nothing on the broker, and
//     fails at once when what exists does not fit the configuration.
//   - Until Provision has succeeded, Window and Redelivery report what
//     Provision will create, from the configuration and the broker's
//     documented defaults, exactly as the broker will then report it; where
//     the state exists already they report it as it is.
//   - dedupq.NewPublisher and dedupq.NewConsumer run every check first and
//     call Provision only when all of them pass; then they read Window and
//     Redelivery again and repeat the check, for state another process
//     created meanwhile (which Provision uses when it fits, as an open
//     would).
//   - Provision creates what is missing, and nothing else. It is
//     idempotent and safe for concurrent use. When one step fails after an
//     earlier one created something, it removes what it created itself,
//     where that is safe (nothing another party uses yet); it never removes
//     what existed before, or what another process created.
//   - A driver used on its own, without the portable layer, provisions on
//     the first SendBatch or Receive.
//
// A driver that never creates anything (it only uses entities that exist)
// does not implement Provisioner.
type Provisioner interface {
	// Provision creates the broker state the configuration asks for and
	// that does not exist yet.
	Provision(ctx context.Context) error
}

// Attribute names the portable layer itself puts on messages: W3C trace
// context (see the root package's OBSERVABILITY.md). They sit under the
// "dedupq-" prefix that user attributes may not use, so they cannot
// collide; drivers that reserve that prefix for their own attributes must
// still carry these two both ways (see Portable).
const (
	AttrTraceParent = "dedupq-traceparent"
	AttrTraceState  = "dedupq-tracestate"
)

// Portable reports whether name is an attribute the portable layer owns
// (AttrTraceParent, AttrTraceState). A driver sends and returns these like
// user attributes, even where it strips its own reserved ones.
func Portable(name string) bool { return name == AttrTraceParent || name == AttrTraceState }
