package servicebus

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
	"github.com/Azure/go-amqp"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/recent"
	"github.com/dedupq/dedupq/window"
)

// messageBatch is the part of *azservicebus.MessageBatch a Topic uses, so
// that a batchSender in a test can hand out batches of its own (the SDK's
// cannot be built outside it).
type messageBatch interface {
	// AddMessage adds m, or fails with azservicebus.ErrMessageTooLarge when
	// it does not fit.
	AddMessage(m *azservicebus.Message, o *azservicebus.AddMessageOptions) error
	// NumMessages is how many messages were added.
	NumMessages() int32
}

// batchSender is what a Topic sends through. sdkSender adapts the SDK's
// concrete *azservicebus.Sender; a test can supply its own where the
// double cannot go (a send that fails half-way, say).
type batchSender interface {
	// NewBatch starts an empty batch sized by the link's batch limit
	// (com.microsoft:max-message-batch-size where the link states one: 1 MB
	// on Premium, below its largest message).
	NewBatch(ctx context.Context) (messageBatch, error)
	// SendBatch sends b in one transfer: all of it is stored, or none.
	SendBatch(ctx context.Context, b messageBatch) error
	// SendMessage sends m alone, bounded by the link's max-message-size
	// rather than its batch limit; azservicebus.ErrMessageTooLarge when it
	// exceeds it.
	SendMessage(ctx context.Context, m *azservicebus.Message) error
	// Close closes the sender.
	Close(ctx context.Context) error
}

// sdkSender adapts an *azservicebus.Sender.
type sdkSender struct{ s *azservicebus.Sender }

func (s sdkSender) NewBatch(ctx context.Context) (messageBatch, error) {
	b, err := s.s.NewMessageBatch(ctx, nil)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (s sdkSender) SendBatch(ctx context.Context, b messageBatch) error {
	mb, ok := b.(*azservicebus.MessageBatch)
	if !ok {
		return fmt.Errorf("dedupq/servicebus: sdkSender got a %T, not a batch it made", b)
	}
	return s.s.SendMessageBatch(ctx, mb, nil)
}

func (s sdkSender) SendMessage(ctx context.Context, m *azservicebus.Message) error {
	return s.s.SendMessage(ctx, m, nil)
}

func (s sdkSender) Close(ctx context.Context) error { return s.s.Close(ctx) }

// Options configure a Topic or Subscription.
type Options struct {
	// Admin reads the entity's properties through the management API on
	// open and on every Window call; it needs Manage rights on the
	// namespace. Required unless Stated is set.
	Admin *admin.Client
	// Stated gives the entity's properties instead of reading them, for
	// programs without Manage rights. The window is then reported as
	// SourceConfigured and labelled "stated by the program" — keep it in
	// step with the entity, because nothing checks it.
	Stated *EntityProperties
	// Create, when set, makes the Topic and the Subscription create the
	// entity if it is missing (driver.Provisioner), with these properties,
	// through Admin (Manage rights): the queue, or the topic (its
	// duplicate detection, size and partitioning fields) and the
	// subscription (its lock, delivery count and sessions). Until it
	// exists, Window and Redelivery report these properties, and the
	// window's scope says "to be created". An entity that exists is used as
	// it is, but must agree on RequiresSession, which Service Bus fixes at
	// creation. Stated and Create exclude each other.
	Create *EntityProperties
	// MaxBatch caps the messages in one SendBatch call; 0 means 100. Each
	// call sends as few MessageBatch transfers as the size limit allows.
	MaxBatch int
	// CloseTimeout bounds closing the SDK links; 0 means 10s.
	CloseTimeout time.Duration
	// SessionIdle is how long a Subscription on a session entity keeps a
	// session with nothing of it in flight and no new message before it
	// lets it go, for another process or another session; 0 means
	// DefaultSessionIdle.
	SessionIdle time.Duration

	// propsFrom, when set, replaces Admin: the seam through which the
	// tests answer for the management API (HTTP/ATOM), which no AMQP
	// double serves. See export_test.go.
	propsFrom propertiesSource
}

func (o *Options) orZero() Options {
	if o == nil {
		return Options{}
	}
	return *o
}

// props reads the entity's properties from Stated or Admin.
func (o Options) props(ctx context.Context, e Entity) (EntityProperties, error) {
	switch {
	case o.Stated != nil && o.Create != nil:
		return EntityProperties{}, errors.New("dedupq/servicebus: Options has both Stated and Create: an entity to create is read after its creation, not stated")
	case o.Stated != nil:
		return *o.Stated, nil
	case o.propsFrom != nil:
		return o.propsFrom.Properties(ctx, e)
	case o.Admin != nil:
		return adminClient{o.Admin}.Properties(ctx, e)
	}
	return EntityProperties{}, errors.New("dedupq/servicebus: Options has neither Admin (to read the entity's properties) nor Stated (to state them)")
}

// ErrClosed is returned by a Topic or Subscription used after Close.
var ErrClosed = errors.New("dedupq/servicebus: closed")

// Topic sends to a queue or topic. It implements driver.Topic.
type Topic struct {
	sender batchSender
	entity Entity
	opts   Options
	seen   recent.IDs

	mu      sync.Mutex
	props   EntityProperties
	missing bool // Options.Create's entity, to be created (Provision)
	closed  bool
}

var _ driver.Topic = (*Topic)(nil)

// OpenTopic reads the entity's properties and returns a Topic sending
// through sender. On an entity that requires sessions every message needs
// a GroupKey (its SessionId), and one without is refused before anything
// is sent (Limits). On success the Topic owns sender. Make sender's client
// with ClientOptions (see HiddenRetrySpan).
func OpenTopic(ctx context.Context, sender *azservicebus.Sender, entity Entity, opts *Options) (*Topic, error) {
	return openTopic(ctx, sdkSender{sender}, entity, opts)
}

func openTopic(ctx context.Context, sender batchSender, entity Entity, opts *Options) (*Topic, error) {
	o := opts.orZero()
	if err := entity.check(false); err != nil {
		return nil, err
	}
	p, missing, err := o.read(ctx, entity)
	if err != nil {
		return nil, err
	}
	return &Topic{sender: sender, entity: entity, opts: o, props: p, missing: missing}, nil
}

// Properties are the entity properties as last read.
func (t *Topic) Properties() EntityProperties {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.props
}

// MaxBatch is Options.MaxBatch, 100 by default.
func (t *Topic) MaxBatch() int {
	if t.opts.MaxBatch > 0 {
		return t.opts.MaxBatch
	}
	return 100
}

// Limits are Service Bus's: IDs and group keys (MessageId, SessionId) of
// at most 128 characters, the entity's message size, and the property
// quotas (CheckProperties). On a session entity a GroupKey is required
// (GroupKeyRequired): Service Bus refuses a message without SessionId
// there, and the portable layer refuses it first, before anything of its
// batch is sent.
func (t *Topic) Limits() driver.Limits {
	p := t.Properties()
	maxBytes := p.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxMessageBytes
	}
	return driver.Limits{
		MaxIDLength:       MaxIDLength,
		MaxGroupKeyLength: MaxIDLength,
		MaxMessageBytes:   maxBytes,
		GroupKeyRequired:  p.RequiresSession,
		Check:             CheckProperties,
	}
}

// Window reads the entity's properties again and reports its duplicate
// detection window: KindConfigured (the length can change after creation),
// or KindNone when RequiresDuplicateDetection is off.
func (t *Topic) Window(ctx context.Context) (window.Window, error) {
	p, missing, err := t.opts.read(ctx, t.entity)
	if err != nil {
		return window.Window{}, err
	}
	t.mu.Lock()
	t.props, t.missing = p, missing
	t.mu.Unlock()
	return windowOf(t.entity, p, t.opts.Stated != nil, missing), nil
}

// HiddenRetrySpan is zero: the clients the URL opener makes
// (ClientOptions) let the SDK retry once, to recover a lost connection,
// within the call's context, and a Sender passed to OpenTopic should be
// made the same way, or at least bounded by the context.
func (t *Topic) HiddenRetrySpan() time.Duration { return 0 }

// TooLargeError is a message Service Bus cannot take at its size: the
// SDK's ErrMessageTooLarge (which it matches), or the broker's
// amqp:link:message-size-exceeded.
type TooLargeError struct {
	ID  string
	Err error
}

// Error implements the error interface.
func (e *TooLargeError) Error() string {
	return fmt.Sprintf("dedupq/servicebus: message %q is too large for the entity: %v", e.ID, e.Err)
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *TooLargeError) Unwrap() error { return e.Err }

// BatchSendError is the failure of one transfer, a MessageBatch or a
// message sent alone (Size 1), reported on each message in it: Service Bus
// stores a batch whole or not at all.
type BatchSendError struct {
	// Size is the number of messages in the failed transfer.
	Size int
	Err  error
}

// Error implements the error interface.
func (e *BatchSendError) Error() string {
	return fmt.Sprintf("dedupq/servicebus: batch of %d message(s) failed as a whole (Service Bus stores a batch all or nothing): %v", e.Size, e.Err)
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *BatchSendError) Unwrap() error { return e.Err }

// SendBatch sends msgs in as few transfers as the entity allows and
// reports each message's outcome: a transfer's failure is every message's
// in it, because a batch is all or nothing.
//
// What one transfer may hold depends on the entity: a MessageBatch up to
// the link's batch limit; on a partitioned entity only messages of one
// GroupKey (its PartitionKey and SessionId), and, where duplicate
// detection is on as well, a single message, because Service Bus refuses
// there any batch of distinct MessageIds. A message larger than the batch
// limit, which on Premium is below the entity's own message limit, is sent
// alone. The order of msgs is kept: a batch is cut, not regrouped.
//
// Service Bus accepts a duplicate send silently and says nothing; so
// SendResult.Duplicate is true only when this Topic itself stored the same
// ID (under the same GroupKey, on a partitioned entity) earlier within the
// entity's window, and never on an entity without duplicate detection,
// which stores every send. A duplicate of a message another process sent
// is reported as a plain success. BackendID is the MessageId: Service Bus
// returns no sequence number on send.
func (t *Topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	t.mu.Lock()
	closed, p, missing := t.closed, t.props, t.missing
	t.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if missing {
		// Used without the portable layer, which provisions first.
		if err := t.Provision(ctx); err != nil {
			return nil, err
		}
		p = t.Properties()
	}
	// Only an entity with RequiresDuplicateDetection drops a repeated
	// MessageId; the management API reports a history window on the
	// others too, and windowOf gives them KindNone.
	w := windowOf(t.entity, p, t.opts.Stated != nil, false)
	results := make([]driver.SendResult, len(msgs))
	settle := func(index []int, err error) {
		now := time.Now()
		for _, i := range index {
			if err != nil {
				results[i].Err = &BatchSendError{Size: len(index), Err: err}
				continue
			}
			results[i].BackendID = msgs[i].ID
			results[i].Duplicate = t.seen.Observe(dedupKey(p, msgs[i]), now, w)
		}
	}
	alone := func(i int, sm *azservicebus.Message) {
		err := t.sender.SendMessage(ctx, sm)
		if errors.Is(err, azservicebus.ErrMessageTooLarge) {
			results[i].Err = &TooLargeError{ID: msgs[i].ID, Err: err}
			return
		}
		settle([]int{i}, err)
	}
	var batch messageBatch
	var index []int
	flush := func() {
		if batch == nil || len(index) == 0 {
			return
		}
		settle(index, t.sender.SendBatch(ctx, batch))
		batch, index = nil, nil
	}
	for i, m := range msgs {
		sm := toSB(m)
		if p.EnablePartitioning && p.RequiresDuplicateDetection {
			// "Batching brokered messages with distinct SessionId,
			// PartitionKey, or MessageId is not supported for an entity
			// with partitioning and duplicate detection enabled": every
			// message of dedupq has its own ID, so each goes alone.
			alone(i, sm)
			continue
		}
		if p.EnablePartitioning && len(index) > 0 && msgs[index[0]].GroupKey != m.GroupKey {
			// One transfer, one partition key.
			flush()
		}
		for try := 0; ; try++ {
			if batch == nil {
				b, err := t.sender.NewBatch(ctx)
				if err != nil {
					// Nothing of this message was sent: a whole-call
					// failure would hide which earlier batches were
					// stored, so report it on the remaining messages.
					for j := i; j < len(msgs); j++ {
						results[j].Err = fmt.Errorf("dedupq/servicebus: starting a batch: %w", err)
					}
					return results, nil
				}
				batch = b
			}
			err := batch.AddMessage(sm, nil)
			if err == nil {
				index = append(index, i)
				break
			}
			if errors.Is(err, azservicebus.ErrMessageTooLarge) && batch.NumMessages() > 0 && try == 0 {
				flush()
				continue
			}
			if errors.Is(err, azservicebus.ErrMessageTooLarge) {
				// Too large for an empty batch: the batch limit is below
				// the entity's message limit on Premium (1 MB against up to
				// 100 MB), and only the link's max-message-size bounds a
				// message sent alone. The batch before it went out first,
				// so the order holds.
				alone(i, sm)
				break
			}
			results[i].Err = err
			break
		}
	}
	flush()
	return results, nil
}

// dedupKey is what Service Bus compares to drop a duplicate of m: its
// MessageId, with its partition key (the GroupKey) on a partitioned entity
// ("If partitioning is enabled, MessageId+PartitionKey is used to
// determine uniqueness"). A message without one is placed by its
// MessageId, which then "serves as the partition key".
func dedupKey(p EntityProperties, m *driver.Message) string {
	if !p.EnablePartitioning {
		return m.ID
	}
	key := m.GroupKey
	if key == "" {
		key = m.ID
	}
	return key + "\x00" + m.ID
}

// toSB maps a driver message: ID → MessageId (duplicate detection),
// GroupKey → SessionId and PartitionKey (which must equal SessionId where
// both are set), attributes → application properties.
func toSB(m *driver.Message) *azservicebus.Message {
	sm := &azservicebus.Message{Body: m.Body}
	id := m.ID
	sm.MessageID = &id
	if m.GroupKey != "" {
		g := m.GroupKey
		sm.SessionID, sm.PartitionKey = &g, &g
	}
	if len(m.Attributes) > 0 {
		sm.ApplicationProperties = make(map[string]any, len(m.Attributes))
		for k, v := range maps.All(m.Attributes) {
			sm.ApplicationProperties[k] = v
		}
	}
	return sm
}

// IsRetryable reports whether a send may succeed when repeated: lost
// connections, timeouts, busy servers and link or session failures are;
// a refused message (too large, unauthorized, no such entity) is not.
func (t *Topic) IsRetryable(err error) bool { return isRetryable(err) }

func isRetryable(err error) bool {
	if err == nil {
		return false
	}
	var tl *TooLargeError
	if errors.As(err, &tl) || errors.Is(err, azservicebus.ErrMessageTooLarge) || errors.Is(err, ErrClosed) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		switch sbErr.Code {
		case azservicebus.CodeConnectionLost, azservicebus.CodeTimeout:
			return true
		case azservicebus.CodeUnauthorizedAccess, azservicebus.CodeNotFound, azservicebus.CodeClosed, azservicebus.CodeLockLost:
			return false
		}
	}
	var ae *amqp.Error
	if errors.As(err, &ae) {
		switch ae.Condition {
		case "com.microsoft:server-busy", "com.microsoft:timeout", amqp.ErrCondResourceLimitExceeded, amqp.ErrCondInternalError:
			return true
		}
		return false
	}
	var ce *amqp.ConnError
	var le *amqp.LinkError
	var se *amqp.SessionError
	return errors.As(err, &ce) || errors.As(err, &le) || errors.As(err, &se)
}

// Close closes the sender.
func (t *Topic) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	t.closed = true
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout(t.opts))
	defer cancel()
	return t.sender.Close(ctx)
}

func closeTimeout(o Options) time.Duration {
	if o.CloseTimeout > 0 {
		return o.CloseTimeout
	}
	return 10 * time.Second
}
