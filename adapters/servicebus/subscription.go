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
// mode: through one Receiver from an entity without sessions, through the
// sessions it accepts from a session entity (see OpenSessionSubscription).
// It implements driver.Subscription and driver.GroupOrderer.
type Subscription struct {
	recv   receiver     // an entity without sessions
	pool   *sessionPool // a session entity
	entity Entity
	opts   Options

	mu      sync.Mutex
	props   EntityProperties
	missing bool // Options.Create's entity, to be created (Provision)
	closed  bool
}

var (
	_ driver.Subscription = (*Subscription)(nil)
	_ driver.NackHolder   = (*Subscription)(nil)
	_ driver.GroupOrderer = (*Subscription)(nil)
)

// DeadLetterReason is the DeadLetterReason Terminate sets; the handler's
// error goes into DeadLetterErrorDescription.
const DeadLetterReason = "dedupq: permanent failure"

// OpenSubscription reads the entity's properties and returns a
// Subscription receiving through recv, which must be in peek-lock mode
// (the SDK's default). It refuses a session entity, which a Receiver
// cannot receive from: open that with OpenSessionSubscription. On success
// the Subscription owns recv. Make recv's client with ClientOptions.
func OpenSubscription(ctx context.Context, recv *azservicebus.Receiver, entity Entity, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, recv, entity, opts)
}

// OpenSessionSubscription reads the entity's properties and returns a
// Subscription on a session entity (RequiresSession), which accepts the
// next available sessions through client (AcceptNextSessionForQueue or
// ForSubscription) as it receives; see the package doc for how it holds,
// renews and releases them. It refuses an entity without sessions (open
// that with OpenSubscription). The Subscription closes the sessions it
// accepted, never client. Make client with ClientOptions.
func OpenSessionSubscription(ctx context.Context, client *azservicebus.Client, entity Entity, opts *Options) (*Subscription, error) {
	return openSessionSubscription(ctx, sdkAcceptor{client: client, entity: entity}, entity, opts)
}

func openSubscription(ctx context.Context, recv receiver, entity Entity, opts *Options) (*Subscription, error) {
	s, err := readSubscription(ctx, entity, opts)
	if err != nil {
		return nil, err
	}
	if s.props.RequiresSession {
		return nil, fmt.Errorf("dedupq/servicebus: %s requires sessions, which a Receiver cannot receive from: open it with OpenSessionSubscription", entity)
	}
	s.recv = recv
	return s, nil
}

func openSessionSubscription(ctx context.Context, acc sessionAcceptor, entity Entity, opts *Options) (*Subscription, error) {
	s, err := readSubscription(ctx, entity, opts)
	if err != nil {
		return nil, err
	}
	if !s.props.RequiresSession {
		return nil, fmt.Errorf("dedupq/servicebus: %s has no sessions (RequiresSession is off): open it with OpenSubscription", entity)
	}
	s.pool = newSessionPool(acc, entity, s.opts.SessionIdle, func() time.Duration { return s.Properties().LockDuration })
	return s, nil
}

// readSubscription reads the entity's properties for a Subscription that
// has yet to get its receiver.
func readSubscription(ctx context.Context, entity Entity, opts *Options) (*Subscription, error) {
	o := opts.orZero()
	if err := entity.check(true); err != nil {
		return nil, err
	}
	p, missing, err := o.read(ctx, entity)
	if err != nil {
		return nil, err
	}
	return &Subscription{entity: entity, opts: o, props: p, missing: missing}, nil
}

// OrdersGroups reports nil on a session entity, whose sessions keep each
// SessionId (GroupKey) in order and hand it to one receiver at a time;
// an entity without sessions cannot order, and the error says how to get
// one that does.
func (s *Subscription) OrdersGroups(context.Context) error {
	if s.pool != nil {
		return nil
	}
	return fmt.Errorf("dedupq/servicebus: %s has no sessions (RequiresSession, fixed at creation), so a GroupKey's messages come in any order: "+
		"use a session entity (create=true&sessions=true creates one; sessions=true with window states one)", s.entity)
}

// Properties are the entity properties as last read.
func (s *Subscription) Properties() EntityProperties {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.props
}

func (s *Subscription) refresh(ctx context.Context) (EntityProperties, error) {
	p, missing, err := s.opts.read(ctx, s.entity)
	if err != nil {
		return p, err
	}
	s.mu.Lock()
	s.props, s.missing = p, missing
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
	return windowOf(s.entity, p, s.opts.Stated != nil, s.isMissing()), nil
}

func (s *Subscription) isMissing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.missing
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
//
// On a session entity it returns the messages of the sessions it holds,
// each session's one at a time and in order (see the package doc).
func (s *Subscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	s.mu.Lock()
	closed, lease, missing := s.closed, s.props.LockDuration, s.missing
	s.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if missing {
		// Used without the portable layer, which provisions first.
		if err := s.Provision(ctx); err != nil {
			return nil, err
		}
	}
	if s.pool != nil {
		return s.pool.receive(ctx, n)
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

// settler is what settles a message: the Subscription's Receiver, or the
// receiver of the session it came from.
type settler interface {
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
}

// settle runs one settlement of d on the receiver d came from; a
// session's next message may come once it returns.
func (s *Subscription) settle(d *driver.Delivery, f func(settler, *azservicebus.ReceivedMessage) error) error {
	switch h := d.Handle.(type) {
	case *azservicebus.ReceivedMessage:
		if h != nil && s.recv != nil {
			return f(s.recv, h)
		}
	case *sessionMessage:
		if h != nil && h.s.p == s.pool {
			err := f(h.s.sr, h.m)
			h.s.settled(err)
			return err
		}
	}
	return fmt.Errorf("dedupq/servicebus: delivery %q was not received by this Subscription", d.Message.ID)
}

// Ack completes the message.
func (s *Subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	return s.settle(d, func(r settler, m *azservicebus.ReceivedMessage) error { return r.CompleteMessage(ctx, m, nil) })
}

// Nack abandons the message, which Service Bus makes available again at
// once with DeliveryCount + 1 (in a session, at its place: before the
// session's later messages), and returns the abandon's error. Service Bus
// has no per-message redelivery delay on abandon: the Consumer honours a
// delay by holding the delivery, its lock renewed (Extend), before it calls
// Nack (driver.NackHolder); delay is ignored.
func (s *Subscription) Nack(ctx context.Context, d *driver.Delivery, _ time.Duration) error {
	return s.settle(d, func(r settler, m *azservicebus.ReceivedMessage) error { return r.AbandonMessage(ctx, m, nil) })
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
	desc := "no reason given"
	if reason != nil {
		desc = reason.Error()
	}
	if len(desc) > 1024 {
		desc = desc[:1021] + "..."
	}
	r := DeadLetterReason
	return s.settle(d, func(rc settler, m *azservicebus.ReceivedMessage) error {
		return rc.DeadLetterMessage(ctx, m, &azservicebus.DeadLetterOptions{Reason: &r, ErrorDescription: &desc})
	})
}

// Extend renews the message lock, or, for a message of a session, the
// session lock (which every message of the session shares), which
// Service Bus always renews by the entity's LockDuration whatever by
// asks; by larger than that is refused as unsupported. A session whose
// lock is found lost is let go.
func (s *Subscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	if lock := s.Properties().LockDuration; lock > 0 && by > lock {
		return fmt.Errorf("dedupq/servicebus: a lock renewal extends by the LockDuration %s, not %s: %w", lock, by, errors.ErrUnsupported)
	}
	switch h := d.Handle.(type) {
	case *azservicebus.ReceivedMessage:
		if h != nil && s.recv != nil {
			return s.recv.RenewMessageLock(ctx, h, nil)
		}
	case *sessionMessage:
		if h != nil && h.s.p == s.pool {
			err := h.s.renew(ctx)
			if isLockLost(err) {
				h.s.cancel()
			}
			return err
		}
	}
	return fmt.Errorf("dedupq/servicebus: delivery %q was not received by this Subscription", d.Message.ID)
}

// IsRetryable reports whether a Receive error is transient.
func (s *Subscription) IsRetryable(err error) bool { return isRetryable(err) }

// Close closes the receiver; the messages it holds locked come back after
// their locks expire. On a session entity it closes every session it
// holds, which gives each back to Service Bus at once, its unsettled
// messages first, in order.
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
	if s.pool != nil {
		return s.pool.close(ctx)
	}
	return s.recv.Close(ctx)
}
