// Test-only exports: the seams around the SDK, so that the external tests
// can reach where the AMQP double cannot (the management API, a send that
// fails half-way, a counting receiver) without them being part of the API.
package servicebus

import "context"

type (
	// Batch is the seam around *azservicebus.MessageBatch.
	Batch = messageBatch
	// Sender is the seam around *azservicebus.Sender.
	Sender = batchSender
	// Receiver is the seam around *azservicebus.Receiver.
	Receiver = receiver
	// Admin is the seam around the management API.
	Admin = propertiesSource
)

// OpenTopicWith is OpenTopic over any Sender.
func OpenTopicWith(ctx context.Context, s Sender, entity Entity, opts *Options) (*Topic, error) {
	return openTopic(ctx, s, entity, opts)
}

// OpenSubscriptionWith is OpenSubscription over any Receiver.
func OpenSubscriptionWith(ctx context.Context, r Receiver, entity Entity, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, r, entity, opts)
}

// WithAdmin returns o reading the entity's properties from a.
func WithAdmin(o Options, a Admin) *Options {
	o.propsFrom = a
	return &o
}

type (
	// SessionAcceptor is the seam around Client.AcceptNextSessionFor….
	SessionAcceptor = sessionAcceptor
	// SessionReceiver is the seam around *azservicebus.SessionReceiver.
	SessionReceiver = sessionReceiver
)

// OpenSessionSubscriptionWith is OpenSessionSubscription over any
// SessionAcceptor.
func OpenSessionSubscriptionWith(ctx context.Context, acc SessionAcceptor, entity Entity, opts *Options) (*Subscription, error) {
	return openSessionSubscription(ctx, acc, entity, opts)
}
