// Opening backends from URLs, over the in-memory broker: no services.
package dedupq_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/window"
)

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		url   string
		check func(error) bool
	}{
		{"kafka://broker/orders", func(err error) bool {
			return errors.Is(err, dedupq.ErrUnknownScheme) && strings.Contains(err.Error(), "mem")
		}},
		{"orders", func(err error) bool { return err != nil && strings.Contains(err.Error(), "no scheme") }},
		{"mem://%zz", func(err error) bool { return err != nil && strings.Contains(err.Error(), "malformed URL") }},
		{"mem://open-errors?window=soon", func(err error) bool {
			var pe *dedupq.ParamError
			return errors.As(err, &pe) && pe.Param == "window"
		}},
		{"mem://open-errors?colour=blue", func(err error) bool {
			var pe *dedupq.ParamError
			return errors.As(err, &pe) && pe.Param == "colour"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := dedupq.OpenPublisher(ctx, tt.url, dedupq.PublisherOptions{})
			if !tt.check(err) {
				t.Errorf("OpenPublisher(%q) = %v", tt.url, err)
			}
		})
	}
}

func TestOpenRunsTheStartupCheck(t *testing.T) {
	_, err := dedupq.OpenPublisher(context.Background(), "mem://open-check?window=10s", dedupq.PublisherOptions{})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		t.Fatalf("the default 51.5s policy on a 10s window: %v, want ErrUnsafeRetry", err)
	}
}

// FuzzOpenPublisher: any string either opens a publisher or fails with an
// error; it never panics.
func FuzzOpenPublisher(f *testing.F) {
	for _, s := range []string{"mem://q", "mem://q?window=2m&ackwait=1s", "mem://", "mem:q", "://", "mem://q?backoff=1s,,2s", "mem://q?seed=-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := dedupq.OpenPublisher(context.Background(), raw, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
		if err == nil {
			_ = p.Close(context.Background())
		}
	})
}
