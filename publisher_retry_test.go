// Tests of how NewPublisher completes a partly filled retry policy, against
// the scripted driver of publisher_test.go: no services.
package dedupq

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/window"
)

func TestNewPublisherFillsUnsetRetryFields(t *testing.T) {
	d := window.DefaultRetryPolicy()
	for _, tc := range []struct {
		name  string
		retry *window.RetryPolicy
		want  window.RetryPolicy
	}{
		{"nil is the default", nil, d},
		{"issue 13 item 7: only MaxAttempts", &window.RetryPolicy{MaxAttempts: 3},
			window.RetryPolicy{MaxAttempts: 3, InitialBackoff: d.InitialBackoff, MaxBackoff: d.MaxBackoff, Multiplier: d.Multiplier, Jitter: d.Jitter, AttemptTimeout: d.AttemptTimeout}},
		{"no retries stays as written", &window.RetryPolicy{MaxAttempts: 1}, window.RetryPolicy{MaxAttempts: 1}},
		{"NoBackoff stays", &window.RetryPolicy{MaxAttempts: 2, InitialBackoff: window.NoBackoff, AttemptTimeout: time.Second},
			window.RetryPolicy{MaxAttempts: 2, InitialBackoff: window.NoBackoff, AttemptTimeout: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPublisher(context.Background(), newScriptTopic(), PublisherOptions{Retry: tc.retry})
			if err != nil {
				t.Fatalf("NewPublisher(%+v): %v", tc.retry, err)
			}
			defer p.Close(context.Background())
			if got := p.RetryPolicy(); got != tc.want {
				t.Fatalf("RetryPolicy() = %s, want %s", got, tc.want)
			}
		})
	}
}
