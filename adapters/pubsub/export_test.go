// Test-only exports: the error classification both drivers share, so that
// the external tests can check it case by case.
package pubsub

// IsRetryable is the classification behind Topic.IsRetryable and
// Subscription.IsRetryable.
var IsRetryable = isRetryable
