// Tests of filling a retry policy's unset fields and of the policies'
// String: no services.
package window

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestRetryPolicyWithDefaults(t *testing.T) {
	d := DefaultRetryPolicy()
	for _, tc := range []struct {
		name     string
		in, want RetryPolicy
	}{
		{"zero is the default", RetryPolicy{}, d},
		{"the issue's partly filled policy", RetryPolicy{MaxAttempts: 3},
			RetryPolicy{MaxAttempts: 3, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2, Jitter: 0.2, AttemptTimeout: 10 * time.Second}},
		{"only a timeout", RetryPolicy{AttemptTimeout: 2 * time.Second},
			RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2, Jitter: 0.2, AttemptTimeout: 2 * time.Second}},
		{"unset backoff keeps a set cap, growth and jitter", RetryPolicy{MaxAttempts: 10, MaxBackoff: time.Second, Multiplier: 3, Jitter: 0.5},
			RetryPolicy{MaxAttempts: 10, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second, Multiplier: 3, Jitter: 0.5, AttemptTimeout: 10 * time.Second}},
		{"a set backoff keeps its zeros: constant, uncapped, no jitter", RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond},
			RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, AttemptTimeout: 10 * time.Second}},
		{"NoBackoff resends at once", RetryPolicy{MaxAttempts: 3, InitialBackoff: NoBackoff, AttemptTimeout: time.Second},
			RetryPolicy{MaxAttempts: 3, InitialBackoff: NoBackoff, AttemptTimeout: time.Second}},
		{"no retries: nothing else filled", RetryPolicy{MaxAttempts: 1}, RetryPolicy{MaxAttempts: 1}},
		{"no retries keeps its timeout", RetryPolicy{MaxAttempts: 1, AttemptTimeout: time.Second}, RetryPolicy{MaxAttempts: 1, AttemptTimeout: time.Second}},
		{"a full policy is kept", d, d},
		{"invalid values are left for Validate", RetryPolicy{MaxAttempts: -1, Jitter: 2}, RetryPolicy{MaxAttempts: -1, Jitter: 2}},
		{"a negative timeout is left for Validate", RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, AttemptTimeout: -1},
			RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, AttemptTimeout: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.WithDefaults()
			if got != tc.want {
				t.Fatalf("WithDefaults(%+v)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
			if again := got.WithDefaults(); again != got {
				t.Fatalf("filling twice changed %+v to %+v", got, again)
			}
		})
	}
}

// The policy is refused as it is and accepted once filled, on a
// window the default fits.
func TestPartlyFilledPolicyPassesTheCheck(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 3}
	if err := CheckPublisher(PublisherPlan{Retry: p, Window: sqsWindow}); err == nil {
		t.Fatal("CheckPublisher accepted an unfilled policy whose attempts are unbounded")
	}
	if err := CheckPublisher(PublisherPlan{Retry: p.WithDefaults(), Window: sqsWindow}); err != nil {
		t.Fatalf("CheckPublisher refused the filled policy %s: %v", p.WithDefaults(), err)
	}
}

func TestValidateNoBackoff(t *testing.T) {
	for _, tc := range []struct {
		initial time.Duration
		valid   bool
	}{
		{NoBackoff, true},
		{0, true},
		{-2, false},
		{-time.Second, false},
	} {
		p := RetryPolicy{MaxAttempts: 3, InitialBackoff: tc.initial, AttemptTimeout: time.Second}
		if err := p.Validate(); (err == nil) != tc.valid {
			t.Errorf("Validate(InitialBackoff %d) = %v, want valid %v", tc.initial, err, tc.valid)
		}
	}
	p := RetryPolicy{MaxAttempts: 3, InitialBackoff: NoBackoff, Multiplier: 2, Jitter: 1, AttemptTimeout: time.Second}
	for n := 1; n <= 3; n++ {
		if b, d := p.Backoff(n), p.Delay(n, 0.5); b != 0 || d != 0 {
			t.Errorf("NoBackoff: Backoff(%d) = %s, Delay = %s; want 0", n, b, d)
		}
	}
	if got := p.Span(); got != 3*time.Second {
		t.Errorf("NoBackoff span = %s, want 3s", got)
	}
}

func TestRetryPolicyString(t *testing.T) {
	for _, tc := range []struct {
		p    RetryPolicy
		want string
	}{
		{DefaultRetryPolicy(), "5 attempts, backoff 100ms×2 up to 5s, jitter 20%, 10s per attempt (worst-case span 51.5s)"},
		{RetryPolicy{MaxAttempts: 3}.WithDefaults(), "3 attempts, backoff 100ms×2 up to 5s, jitter 20%, 10s per attempt (worst-case span 30.3s)"},
		{RetryPolicy{MaxAttempts: 1}, "1 attempt (no retries)"},
		{RetryPolicy{}, "1 attempt (no retries)"},
		{RetryPolicy{MaxAttempts: 1, AttemptTimeout: 3 * time.Second}, "1 attempt (no retries), 3s per attempt"},
		{RetryPolicy{MaxAttempts: 3, InitialBackoff: NoBackoff, Jitter: 0.5, AttemptTimeout: time.Second}, "3 attempts, no backoff, 1s per attempt (worst-case span 3s)"},
		{RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, AttemptTimeout: 5 * time.Second}, "3 attempts, backoff 10ms, 5s per attempt (worst-case span 15.02s)"},
		{RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Multiplier: 0.5, MaxBackoff: time.Hour, AttemptTimeout: time.Second}, "3 attempts, backoff 1s, 1s per attempt (worst-case span 5s)"},
		{RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Second, Multiplier: 2, MaxBackoff: 5 * time.Second, AttemptTimeout: time.Second}, "3 attempts, backoff 5s, 1s per attempt (worst-case span 13s)"},
		{RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Second, Multiplier: 1.5, Jitter: 0.125, AttemptTimeout: time.Second}, "4 attempts, backoff 1s×1.5 uncapped, jitter 12.5%, 1s per attempt (worst-case span 8.75s)"},
		{RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second}, "3 attempts, backoff 1s, no attempt timeout (worst-case span forever)"},
		{RetryPolicy{MaxAttempts: -1}, "invalid retry policy {MaxAttempts:-1 InitialBackoff:0s MaxBackoff:0s Multiplier:0 Jitter:0 AttemptTimeout:0s}"},
		{RetryPolicy{MaxAttempts: 2, Multiplier: math.NaN(), AttemptTimeout: time.Second}, "invalid retry policy {MaxAttempts:2 InitialBackoff:0s MaxBackoff:0s Multiplier:NaN Jitter:0 AttemptTimeout:1s}"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("String(%#v)\n got %s\nwant %s", tc.p, got, tc.want)
		}
	}
}

func TestRedeliveryPolicyString(t *testing.T) {
	for _, tc := range []struct {
		r    RedeliveryPolicy
		want string
	}{
		{RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second, Backoff: []time.Duration{time.Second, 5 * time.Second}},
			"3 deliveries, backoff 1s then 5s, ack wait 30s per delivery (worst-case span 1m36s)"},
		{RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}, "5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s)"},
		{RedeliveryPolicy{MaxDeliveries: 1, AckWait: 30 * time.Second, Backoff: []time.Duration{time.Minute}}, "1 delivery (no redelivery), ack wait 30s per delivery (worst-case span 30s)"},
		{RedeliveryPolicy{AckWait: 10 * time.Second, Backoff: []time.Duration{-time.Second, time.Second}},
			"unlimited deliveries, backoff 0s then 1s, ack wait 10s per delivery (worst-case span forever)"},
		{RedeliveryPolicy{AckWait: 10 * time.Second, Backoff: []time.Duration{20 * time.Second}, Expiry: 7 * 24 * time.Hour, ExpirySource: SourceDiscovered},
			"deliveries bounded only by the message's expiry, backoff 20s, ack wait 10s per delivery, none started later than 7d after the first (message expiry, discovered from the broker) (worst-case span 7d10s)"},
		{RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second, Expiry: time.Hour, ExpirySource: SourceConfigured},
			"5 deliveries, no backoff, ack wait 30s per delivery, none started later than 1h after the first (message expiry, given by the program) (worst-case span 2m30s)"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("String(%+v)\n got %s\nwant %s", tc.r, got, tc.want)
		}
	}
}

// Both policies read the same way: count, waits, time each, span.
func TestPolicyStringsAgreeInShape(t *testing.T) {
	retry := DefaultRetryPolicy().String()
	red := RedeliveryPolicy{MaxDeliveries: 3, AckWait: time.Second, Backoff: []time.Duration{time.Second}}.String()
	for _, s := range []string{retry, red} {
		if !strings.Contains(s, ", backoff ") || !strings.HasSuffix(s, ")") || !strings.Contains(s, " (worst-case span ") {
			t.Errorf("%q does not read like its sibling", s)
		}
	}
}

// FuzzWithDefaults: filling is idempotent, never touches a field that is
// set, and leaves no valid retrying policy unbounded for want of a timeout.
func FuzzWithDefaults(f *testing.F) {
	f.Add(3, int64(0), int64(0), 0.0, 0.0, int64(0))
	f.Add(0, int64(NoBackoff), int64(time.Second), 1.5, 0.3, int64(time.Second))
	f.Add(1, int64(0), int64(0), 0.0, 0.0, int64(0))
	f.Add(-4, int64(-5), int64(-1), -2.0, -1.0, int64(-7))
	f.Fuzz(func(t *testing.T, attempts int, initial, maxB int64, mult, jitter float64, timeout int64) {
		p := RetryPolicy{MaxAttempts: attempts, InitialBackoff: time.Duration(initial), MaxBackoff: time.Duration(maxB),
			Multiplier: mult, Jitter: jitter, AttemptTimeout: time.Duration(timeout)}
		q := p.WithDefaults()
		if r := q.WithDefaults(); r != q && !math.IsNaN(mult) && !math.IsNaN(jitter) {
			t.Fatalf("not idempotent: %+v → %+v → %+v", p, q, r)
		}
		set := []struct {
			name     string
			was, now any
			zero     bool
		}{
			{"MaxAttempts", p.MaxAttempts, q.MaxAttempts, p.MaxAttempts == 0},
			{"InitialBackoff", p.InitialBackoff, q.InitialBackoff, p.InitialBackoff == 0},
			{"MaxBackoff", p.MaxBackoff, q.MaxBackoff, p.MaxBackoff == 0},
			{"AttemptTimeout", p.AttemptTimeout, q.AttemptTimeout, p.AttemptTimeout == 0},
		}
		for _, s := range set {
			if !s.zero && s.was != s.now {
				t.Fatalf("%s was set to %v and became %v", s.name, s.was, s.now)
			}
		}
		if (p.Multiplier != 0 && q.Multiplier != p.Multiplier && !math.IsNaN(mult)) || (p.Jitter != 0 && q.Jitter != p.Jitter && !math.IsNaN(jitter)) {
			t.Fatalf("a set Multiplier or Jitter changed: %+v → %+v", p, q)
		}
		if q.Validate() == nil && q.Retries() > 0 && q.AttemptTimeout <= 0 {
			t.Fatalf("filled retrying policy %+v has no attempt timeout", q)
		}
		_ = q.String() // must not panic
	})
}
