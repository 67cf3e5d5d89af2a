package servicebus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// receiver is the part of *azservicebus.Receiver a Subscription uses; the
// SDK's type implements it as it is. A test can supply its own where the
// double cannot go.
type receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	Close(ctx context.Context) error
}

var _ receiver = (*azservicebus.Receiver)(nil)

// Subscription receives from a queue or topic subscription in peek-lock
// mode. It implements driver.Subscription.
type Subscription struct {
	recv   receiver
	entity Entity
	opts   Options

	mu     sync.Mutex
	props  EntityProperties
	closed bool
}

var (
	_ driver.Subscription = (*Subscription)(nil)
	_ driver.NackHolder   = (*Subscription)(nil)
)

// DeadLetterReason is the DeadLetterReason Terminate sets; the handler's
// error goes into DeadLetterErrorDescription.
const DeadLetterReason = "dedupq: permanent failure"

// OpenSubscription reads the entity's properties and returns a
// Subscription receiving through recv, which must be in peek-lock mode
// (the SDK's default). It refuses a session entity: receiving from one
// needs a session receiver per SessionId, which this version does not
// drive. On success the Subscription owns recv. Make recv's client with
// ClientOptions.
func OpenSubscription(ctx context.Context, recv *azservicebus.Receiver, entity Entity, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, recv, entity, opts)
}

func openSubscription(ctx context.Context, recv receiver, entity Entity, opts *Options) (*Subscription, error) {
	o := opts.orZero()
	if err := entity.check(true); err != nil {
		return nil, err
	}
	p, err := o.props(ctx, entity)
	if err != nil {
		return nil, err
	}
	if p.RequiresSession {
		return nil, fmt.Errorf("dedupq/servicebus: %s requires sessions; this adapter receives from entities without sessions only", entity)
	}
	return &Subscription{recv: recv, entity: entity, opts: o, props: p}, nil
}

// Properties are the entity properties as last read.
func (s *Subscription) Properties() EntityProperties {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.props
}

func (s *Subscription) refresh(ctx context.Context) (EntityProperties, error) {
	p, err := s.opts.props(ctx, s.entity)
	if err != nil {
		return p, err
	}
	s.mu.Lock()
	s.props = p
	s.mu.Unlock()
	return p, nil
}

// Window reads the properties again and reports the publish-side window
// (the queue's, or the topic's for a subscription).
func (s *Subscription) Window(ctx context.Context) (window.Window, error) {
	p, err := s.refresh(ctx)
	if err != nil {
		return window.Window{}, err
	}
	return windowOf(s.entity, p, s.opts.Stated != nil), nil
}

// Redelivery is LockDuration as AckWait, MaxDeliveryCount, and a Backoff
// of the longest hold of a nack (LockDuration, see MaxNackHold) before
// every redelivery. Service Bus itself redelivers an abandoned message at
// once, but a nacked delivery may stay locked by the Consumer for up to
// LockDuration before it is abandoned, so each redelivery can come that
// much later: the backoff keeps Span a true worst case for the startup
// check. The Consumer also takes it as the delay of a nack whose handler
// asked for none, so such a redelivery comes after LockDuration.
func (s *Subscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	p, err := s.refresh(ctx)
	if err != nil {
		return window.RedeliveryPolicy{}, err
	}
	return redeliveryOf(p), nil
}

// redeliveryOf is the redelivery policy the properties give; see
// Subscription.Redelivery.
func redeliveryOf(p EntityProperties) window.RedeliveryPolicy {
	r := window.RedeliveryPolicy{MaxDeliveries: p.MaxDeliveryCount, AckWait: p.LockDuration}
	if p.LockDuration > 0 {
		r.Backoff = []time.Duration{p.LockDuration}
	}
	return r
}

// Receive blocks until a message is available and returns it, locked for
// LockDuration; Attempt is the message's DeliveryCount. It takes one
// message a call whatever n asks: ReceiveMessages leaves the credits it did
// not use open on the link, and the SDK releases every message that arrives
// on them before the next call, which the broker counts as a delivery
// (seen on the AMQP double as a first delivery with attempt 2, under load):
// enough of them would dead-letter a message no handler ever saw. With one
// credit a call, none is left open except by a call its context ended.
func (s *Subscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	s.mu.Lock()
	closed, lease := s.closed, s.props.LockDuration
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	for {
		msgs, err := s.recv.ReceiveMessages(ctx, 1, nil)
		if len(msgs) > 0 {
			out := make([]*driver.Delivery, len(msgs))
			for i, m := range msgs {
				out[i] = fromSB(m, lease, s.entity)
			}
			return out, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			return nil, err
		}
	}
}

func fromSB(m *azservicebus.ReceivedMessage, lease time.Duration, e Entity) *driver.Delivery {
	d := &driver.Delivery{
		Message:   driver.Message{ID: m.MessageID, Body: m.Body},
		Attempt:   int(m.DeliveryCount),
		BackendID: m.MessageID,
		Lease:     lease,
		Handle:    m,
	}
	if d.Message.ID == "" {
		d.Message.ID = fallbackID(m, e)
	}
	if m.SessionID != nil {
		d.Message.GroupKey = *m.SessionID
	}
	if len(m.ApplicationProperties) > 0 {
		d.Message.Attributes = make(map[string]string, len(m.ApplicationProperties))
		for k, v := range m.ApplicationProperties {
			if str, ok := v.(string); ok {
				d.Message.Attributes[k] = str
			} else {
				// Set by another publisher: dedupq sends strings only.
				d.Message.Attributes[k] = fmt.Sprint(v)
			}
		}
	}
	return d
}

// fallbackID is the dedup key of a message sent without a MessageId (by a
// publisher other than dedupq): "<entity> seq <sequence number> time
// <enqueued time in Unix nanoseconds>". Every redelivery carries the same
// sequence number and enqueued time; the entity keeps apart entities whose
// consumers share a dedup store, and the enqueued time keeps apart the
// messages of an entity that was deleted and created again, whose
// sequence starts over. Service Bus takes any MessageId, so nothing but
// its form keeps it from a publisher's own IDs: one would have to send
// exactly this string. Without a sequence number it is "", which the
// dedup Guard refuses rather than share.
func fallbackID(m *azservicebus.ReceivedMessage, e Entity) string {
	if m.SequenceNumber == nil {
		return ""
	}
	var at int64
	if m.EnqueuedTime != nil {
		at = m.EnqueuedTime.UnixNano()
	}
	return fmt.Sprintf("%s seq %d time %d", e, *m.SequenceNumber, at)
}

func handle(d *driver.Delivery) (*azservicebus.ReceivedMessage, error) {
	m, ok := d.Handle.(*azservicebus.ReceivedMessage)
	if !ok || m == nil {
		return nil, fmt.Errorf("dedupq/servicebus: delivery %q was not received by this adapter", d.Message.ID)
	}
	return m, nil
}

// Ack completes the message.
func (s *Subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	m, err := handle(d)
	if err != nil {
		return err
	}
	return s.recv.CompleteMessage(ctx, m, nil)
}

// Nack abandons the message, which Service Bus makes available again at
// once with DeliveryCount + 1, and returns the abandon's error. Service Bus
// has no per-message redelivery delay on abandon: the Consumer honours a
// delay by holding the delivery, its lock renewed (Extend), before it calls
// Nack (driver.NackHolder); delay is ignored.
func (s *Subscription) Nack(ctx context.Context, d *driver.Delivery, _ time.Duration) error {
	m, err := handle(d)
	if err != nil {
		return err
	}
	return s.recv.AbandonMessage(ctx, m, nil)
}

// MaxNackHold is the entity's LockDuration (at most 5 minutes on Service
// Bus), which covers the wait dedup.Guard asks for (at most the delivery's
// lease): the longest the Consumer holds a nacked delivery before Nack.
func (s *Subscription) MaxNackHold(*driver.Delivery) time.Duration {
	return s.Properties().LockDuration
}

// Terminate dead-letters the message with reason DeadLetterReason and the
// handler's error as the description.
func (s *Subscription) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	m, err := handle(d)
	if err != nil {
		return err
	}
	desc := "no reason given"
	if reason != nil {
		desc = reason.Error()
	}
	if len(desc) > 1024 {
		desc = desc[:1021] + "..."
	}
	r := DeadLetterReason
	return s.recv.DeadLetterMessage(ctx, m, &azservicebus.DeadLetterOptions{Reason: &r, ErrorDescription: &desc})
}

// Extend renews the message lock, which Service Bus always renews by the
// entity's LockDuration whatever by asks; by larger than that is refused
// as unsupported.
func (s *Subscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	m, err := handle(d)
	if err != nil {
		return err
	}
	if lock := s.Properties().LockDuration; lock > 0 && by > lock {
		return fmt.Errorf("dedupq/servicebus: a lock renewal extends by the LockDuration %s, not %s: %w", lock, by, errors.ErrUnsupported)
	}
	return s.recv.RenewMessageLock(ctx, m, nil)
}

// IsRetryable reports whether a Receive error is transient.
func (s *Subscription) IsRetryable(err error) bool { return isRetryable(err) }

// Close closes the receiver; the messages it holds locked come back after
// their locks expire.
func (s *Subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout(s.opts))
	defer cancel()
	return s.recv.Close(ctx)
}
