package driver

// Destination names the broker entity a Topic sends to or a Subscription
// receives from, for the messaging.destination.* attributes of the
// portable layer's spans and metrics (the OpenTelemetry messaging semantic
// conventions).
type Destination struct {
	// Name is the entity messages are sent to and consumed from: the
	// stream, queue or topic (messaging.destination.name). A Topic and a
	// Subscription of the same entity give the same Name, so that the
	// two ends of a destination can be matched.
	Name string
	// Subscription is the named subscription a Subscription receives
	// through (messaging.destination.subscription.name): a Pub/Sub
	// subscription, a Service Bus topic subscription, a JetStream durable
	// consumer. Empty for a Topic, and where the backend has none.
	Subscription string
}

// DestinationNamer is implemented by a Topic or Subscription that names
// its destination. Without it, the portable layer's spans and metrics
// carry the backend (messaging.system) alone.
type DestinationNamer interface {
	// Destination names the entity; it is read once, when the Publisher
	// or Consumer is made.
	Destination() Destination
}
