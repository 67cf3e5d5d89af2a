// Test-only exports: the error classification both drivers share, so that
// the external tests can check it case by case.
package pubsub

// IsRetryable is the classification behind Topic.IsRetryable and
// Subscription.IsRetryable.
var IsRetryable = isRetryable

// ObserveTerminated makes f see each redelivery of a terminated message
// that s settles without handing it out, and how ("nack" or "ack"). Call
// it before the first Receive.
func ObserveTerminated(s *Subscription, f func(id, op string)) { s.onTerminated = f }
