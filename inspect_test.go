// Inspect over the in-memory broker wrapped in a recording Provisioner, on
// a mux of the test's own: no services.
package dedupq_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// planOpener opens every URL as the in-memory broker reporting p.
type planOpener struct {
	b *mem.Broker
	p *plan
}

func (o planOpener) OpenTopic(context.Context, *url.URL) (driver.Topic, error) {
	return planTopic{o.b.Topic("q"), o.p}, nil
}

func (o planOpener) OpenSubscription(context.Context, *url.URL) (driver.Subscription, error) {
	return planSub{o.b.Subscription("q"), o.p}, nil
}

// TestInspectCreatesNothing: Inspect runs both startup checks on what the
// driver reports and never calls Provision, whether they pass or fail.
func TestInspectCreatesNothing(t *testing.T) {
	long := window.Window{Backend: "test", Duration: 10 * time.Minute, Kind: window.KindConfigured, Source: window.SourceConfigured}
	short := long
	short.Duration = 10 * time.Second
	bounded := window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}
	unbounded := window.RedeliveryPolicy{AckWait: 30 * time.Second}
	cases := []struct {
		name                   string
		plan                   plan
		wantPublisher, wantCon bool // the check passes
	}{
		{"both pass", plan{window: long, before: bounded}, true, true},
		{"publisher fails", plan{window: short, before: bounded}, false, true},
		{"consumer fails", plan{window: long, before: unbounded}, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.plan
			mux := new(dedupq.URLMux)
			mux.Register("plan", planOpener{mem.NewBroker(mem.Options{}), &p})
			in, err := mux.Inspect(t.Context(), "plan://q?secret_param=hunter2", dedupq.InspectOptions{DedupTTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if p.provisions != 0 {
				t.Errorf("Provision called %d times, want none", p.provisions)
			}
			if (in.Publisher == nil) != tc.wantPublisher || (in.Consumer == nil) != tc.wantCon {
				t.Errorf("publisher check %v, consumer check %v; want passes %v, %v", in.Publisher, in.Consumer, tc.wantPublisher, tc.wantCon)
			}
			for _, e := range []error{in.Publisher, in.Consumer} {
				if e != nil && !errors.Is(e, window.ErrUnsafeRetry) {
					t.Errorf("check error %v is not ErrUnsafeRetry", e)
				}
			}
			if strings.Contains(in.URL, "hunter2") || in.Retry != window.DefaultRetryPolicy() {
				t.Errorf("URL %q, retry %v", in.URL, in.Retry)
			}
		})
	}
}
