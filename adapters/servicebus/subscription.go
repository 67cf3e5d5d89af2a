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

// Receiver is the part of *azservicebus.Receiver a Subscription uses; the
// SDK's type implements it as it is. A test can supply its own where the
// double cannot go.
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	Close(ctx context.Context) error
}

var _ Receiver = (*azservicebus.Receiver)(nil)

// Subscription receives from a queue or topic subscription in peek-lock
// mode. It implements driver.Subscription.
type Subscription struct {
	recv   Receiver
	entity Entity
	opts   Options

	mu     sync.Mutex
	props  EntityProperties
	closed bool
}

var _ driver.Subscription = (*Subscription)(nil)

// DeadLetterReason is the DeadLetterReason Terminate sets; the handler's
// error goes into DeadLetterErrorDescription.
const DeadLetterReason = "dedupq: permanent failure"

// OpenSubscription reads the entity's properties and returns a
// Subscription receiving through recv, which must be in peek-lock mode
// (the SDK's default). It refuses a session entity: receiving from one
// needs a session receiver per SessionId, which this version does not
// drive. On success the Subscription owns recv.
func OpenSubscription(ctx context.Context, recv Receiver, entity Entity, opts *Options) (*Subscription, error) {
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

// Redelivery is LockDuration and MaxDeliveryCount. Backoff is empty: an
// abandoned message is available again at once (see Nack).
func (s *Subscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	p, err := s.refresh(ctx)
	if err != nil {
		return window.RedeliveryPolicy{}, err
	}
	return window.RedeliveryPolicy{MaxDeliveries: p.MaxDeliveryCount, AckWait: p.LockDuration}, nil
}

// Receive blocks until at least one message is available and returns up to
// n, each locked for LockDuration. Attempt is the message's DeliveryCount.
func (s *Subscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	s.mu.Lock()
	closed, lease := s.closed, s.props.LockDuration
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	n = min(max(n, 1), 5000)
	for {
		msgs, err := s.recv.ReceiveMessages(ctx, n, nil)
		if len(msgs) > 0 {
			out := make([]*driver.Delivery, len(msgs))
			for i, m := range msgs {
				out[i] = fromSB(m, lease)
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

func fromSB(m *azservicebus.ReceivedMessage, lease time.Duration) *driver.Delivery {
	d := &driver.Delivery{
		Message:   driver.Message{ID: m.MessageID, Body: m.Body},
		Attempt:   int(m.DeliveryCount),
		BackendID: m.MessageID,
		Lease:     lease,
		Handle:    m,
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
				// Set by another producer: dedupq sends strings only.
				d.Message.Attributes[k] = fmt.Sprint(v)
			}
		}
	}
	return d
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
// once with DeliveryCount + 1. delay is not honoured: Service Bus has no
// per-message redelivery delay on abandon (deferring or re-scheduling a
// copy would change the message's identity or need its sequence number
// kept by the application), so the redelivery policy reports no backoff
// and the startup check sees the real, shorter span.
func (s *Subscription) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	m, err := handle(d)
	if err != nil {
		return err
	}
	return s.recv.AbandonMessage(ctx, m, nil)
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

// Close closes the receiver; messages it holds locked come back after
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
