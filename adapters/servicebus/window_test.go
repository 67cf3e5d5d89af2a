package servicebus_test

// The startup window check on Service Bus entities: the double (through the
// real SDK) for the entity, the Admin seam for its properties.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/window"
)

// retry is a policy whose worst-case span (5m1s) fits a 10-minute
// window less the 20% margin, and not a 1-minute one.
var retry = window.RetryPolicy{
	MaxAttempts: 6, InitialBackoff: time.Second, MaxBackoff: 30 * time.Second,
	Multiplier: 2, AttemptTimeout: 45 * time.Second,
}

func TestWindowCheck(t *testing.T) {
	d := needDouble(t)
	cases := []struct {
		name    string
		window  time.Duration
		wantErr []string // substrings of the real error text; nil means the check passes
	}{
		{"fits the configured 10-minute window", 10 * time.Minute, nil},
		{"refused on a 1-minute entity", time.Minute, []string{
			"dedupq: unsafe publisher retry policy: worst-case span 5m1s",
			"exceeds the broker window 1m less a 20% safety margin = 48s",
			"servicebus dedup window 1m (configured on the entity, discovered from the broker, scope queue ",
			"; fix: lower PublisherOptions.Retry.AttemptTimeout from 45s to 2s" +
				", or raise the queue's DuplicateDetectionHistoryTimeWindow from 1m to ≥ 6m17s" +
				", or declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m17s, and ConsumerOptions.PublisherSpan to 5m1s on the consumers, whose TTL must also cover their redelivery span" +
				", or set PublisherOptions.Retry.MaxAttempts to 1 (no retries)",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			q := newQueue(t, d, a, servicebus.EntityProperties{
				RequiresDuplicateDetection: true, DuplicateDetectionWindow: tc.window,
				LockDuration: time.Minute, MaxDeliveryCount: 10,
			})
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer sub.Close()
			p, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{Retry: &retry})
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("NewPublisher: %v", err)
				}
				defer p.Close(context.Background())
				if w := p.Window(); w.Duration != tc.window || w.Kind != window.KindConfigured || w.Source != window.SourceDiscovered {
					t.Errorf("Window = %+v, want %s, configured, discovered", w, tc.window)
				}
				// A real publish through the checked publisher.
				if _, err := p.Publish(t.Context(), &dedupq.Message{ID: "w-1", Body: []byte("x")}); err != nil {
					t.Errorf("Publish: %v", err)
				}
				return
			}
			defer tp.Close()
			if !errors.Is(err, window.ErrUnsafeRetry) {
				t.Fatalf("NewPublisher error %v, want one matching window.ErrUnsafeRetry", err)
			}
			t.Logf("refused as expected: %v", err)
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error text lacks %q:\n%s", s, err)
				}
			}
		})
	}
}

// TestWindowReread: Window reads the entity again on every call, so a
// window shortened after startup is caught by Recheck, and an entity
// without duplicate detection reports KindNone.
func TestWindowReread(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	props := servicebus.EntityProperties{
		RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
		LockDuration: time.Minute, MaxDeliveryCount: 10,
	}
	q := newQueue(t, d, a, props)
	tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
	defer sub.Close()
	p, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{Retry: &retry})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer p.Close(context.Background())

	steps := []struct {
		name     string
		change   func(*servicebus.EntityProperties)
		wantKind window.Kind
		wantOK   bool
	}{
		{"unchanged", func(*servicebus.EntityProperties) {}, window.KindConfigured, true},
		{"window shortened to 1m", func(p *servicebus.EntityProperties) { p.DuplicateDetectionWindow = time.Minute }, window.KindConfigured, false},
		{"duplicate detection off", func(p *servicebus.EntityProperties) { p.RequiresDuplicateDetection = false }, window.KindNone, false},
	}
	for _, st := range steps {
		st.change(&props)
		a.set(q, props)
		before := a.calls.Load()
		err := p.Recheck(t.Context())
		if a.calls.Load() == before {
			t.Errorf("%s: Recheck did not read the entity again", st.name)
		}
		if (err == nil) != st.wantOK {
			t.Errorf("%s: Recheck = %v, want ok %v", st.name, err, st.wantOK)
		}
		if k := p.Window().Kind; k != st.wantKind {
			t.Errorf("%s: Window().Kind = %s, want %s", st.name, k, st.wantKind)
		}
	}
}

// TestStatedWindow: properties stated by the program are labelled as such.
func TestStatedWindow(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	st := servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: time.Minute, MaxDeliveryCount: 10}
	q := newQueue(t, d, a, st)
	tp, sub := openPair(t, newClient(t, d), q, &servicebus.Options{Stated: &st})
	defer tp.Close()
	defer sub.Close()
	w, err := tp.Window(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if w.Source != window.SourceConfigured || !strings.Contains(w.String(), "given by the program, scope queue "+q+", not read from the entity") {
		t.Errorf("stated window = %s, want SourceConfigured and labelled as stated", w)
	}
	if a.calls.Load() != 0 {
		t.Errorf("the admin seam was called %d times with Stated set", a.calls.Load())
	}
}
