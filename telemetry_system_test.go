// Tests of messaging.system's values. No services.
package dedupq

import "testing"

// The conventions' well-known values replace the backends' names where
// one exists.
func TestMessagingSystem(t *testing.T) {
	for _, tc := range []struct{ backend, want string }{
		{"sqs", "aws_sqs"},
		{"pubsub", "gcp_pubsub"},
		{"servicebus", "servicebus"},
		{"jetstream", "jetstream"},
		{"mem", "mem"},
	} {
		if got := messagingSystem(tc.backend); got != tc.want {
			t.Errorf("messagingSystem(%q) = %q, want %q", tc.backend, got, tc.want)
		}
	}
}
