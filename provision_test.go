// The order NewPublisher and NewConsumer open a driver in (check, then
// Provision, then check again), over the in-memory broker wrapped in a
// recording Provisioner: no services.
package dedupq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// plan is what a recording driver reports before and after Provision.
type plan struct {
	window            window.Window
	before, after     window.RedeliveryPolicy // the consumer's
	windowAfter       *window.Window          // nil: the same as before
	failWith          error                   // Provision's error
	provisions, reads int
}

func (p *plan) Provision(context.Context) error {
	p.provisions++
	return p.failWith
}

func (p *plan) Window(context.Context) (window.Window, error) {
	p.reads++
	if p.provisions > 0 && p.windowAfter != nil {
		return *p.windowAfter, nil
	}
	return p.window, nil
}

func (p *plan) Redelivery(context.Context) (window.RedeliveryPolicy, error) {
	if p.provisions > 0 {
		return p.after, nil
	}
	return p.before, nil
}

type planTopic struct {
	driver.Topic
	*plan
}

func (t planTopic) Window(ctx context.Context) (window.Window, error) { return t.plan.Window(ctx) }

type planSub struct {
	driver.Subscription
	*plan
}

func (s planSub) Window(ctx context.Context) (window.Window, error) { return s.plan.Window(ctx) }
func (s planSub) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	return s.plan.Redelivery(ctx)
}

// TestProvisionOnlyAfterTheCheck: a driver creates nothing unless the
// startup check passed on what it will create, and what exists after
// Provision is checked again.
func TestProvisionOnlyAfterTheCheck(t *testing.T) {
	long := window.Window{Backend: "test", Duration: 10 * time.Minute, Kind: window.KindConfigured, Source: window.SourceConfigured}
	short := long
	short.Duration = 10 * time.Second
	bounded := window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}
	unbounded := window.RedeliveryPolicy{AckWait: 30 * time.Second}
	broken := errors.New("no rights to create streams")
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	unsafe := func(err error) bool { return errors.Is(err, window.ErrUnsafeRetry) }
	cases := []struct {
		name           string
		consumer       bool
		plan           plan
		wantProvisions int
		wantErr        func(error) bool // nil: opens
	}{
		{"publisher refused", false, plan{window: short}, 0, unsafe},
		{"consumer refused", true, plan{window: long, before: unbounded, after: unbounded}, 0, unsafe},
		{"publisher provisioned", false, plan{window: long}, 1, nil},
		{"consumer provisioned", true, plan{window: long, before: bounded, after: bounded}, 1, nil},
		// Made meanwhile by another process, and used as it is.
		{"publisher rechecked", false, plan{window: long, windowAfter: &short}, 1, unsafe},
		{"consumer rechecked", true, plan{window: long, before: bounded, after: unbounded}, 1, unsafe},
		{"publisher provision fails", false, plan{window: long, failWith: broken}, 1, func(err error) bool { return errors.Is(err, broken) }},
		{"consumer provision fails", true, plan{window: long, before: bounded, after: bounded, failWith: broken}, 1, func(err error) bool { return errors.Is(err, broken) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := mem.NewBroker(mem.Options{})
			p := tc.plan
			var err error
			if tc.consumer {
				var c *dedupq.Consumer
				if c, err = dedupq.NewConsumer(t.Context(), planSub{b.Subscription("q"), &p}, dedupq.ConsumerOptions{Dedup: guard}); err == nil {
					defer c.Close(t.Context())
				}
			} else {
				var pub *dedupq.Publisher
				if pub, err = dedupq.NewPublisher(t.Context(), planTopic{b.Topic("q"), &p}, dedupq.PublisherOptions{}); err == nil {
					defer pub.Close(t.Context())
				}
			}
			if p.provisions != tc.wantProvisions {
				t.Errorf("Provision called %d times, want %d", p.provisions, tc.wantProvisions)
			}
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("open: %v", err)
			case tc.wantErr != nil && !tc.wantErr(err):
				t.Errorf("open: %v, not the error wanted", err)
			}
			if p.provisions > 0 && p.failWith == nil && p.reads != 2 {
				t.Errorf("the window was read %d times, want twice: before and after Provision", p.reads)
			}
		})
	}
}
