// Pure arithmetic: no services.
package window

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestRetrySpan(t *testing.T) {
	tests := []struct {
		name string
		p    RetryPolicy
		want time.Duration
	}{
		{"zero policy", RetryPolicy{}, 0},
		{"one attempt", RetryPolicy{MaxAttempts: 1, AttemptTimeout: 3 * time.Second}, 3 * time.Second},
		{"default", DefaultRetryPolicy(), 50*time.Second + 1500*time.Millisecond},
		{"capped", RetryPolicy{MaxAttempts: 6, InitialBackoff: time.Second, MaxBackoff: 4 * time.Second, Multiplier: 2, AttemptTimeout: time.Second},
			6*time.Second + (1+2+4+4+4)*time.Second},
		{"multiplier below one is one", RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Second, Multiplier: 0.5, AttemptTimeout: time.Second},
			3*time.Second + 2*time.Second},
		{"jitter never lengthens", RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second, Jitter: 1, AttemptTimeout: time.Second}, 3 * time.Second},
		{"no attempt timeout is unbounded", RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Second}, Forever},
		{"saturates", RetryPolicy{MaxAttempts: math.MaxInt, InitialBackoff: time.Hour, Multiplier: 10, AttemptTimeout: time.Hour}, Forever},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Span(); got != tt.want {
				t.Errorf("Span() = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestDelayStaysWithinBackoff(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Second, MaxBackoff: 8 * time.Second, Multiplier: 2, Jitter: 0.5}
	for n := 1; n < 5; n++ {
		for _, u := range []float64{0, 0.25, 0.999999} {
			b, d := p.Backoff(n), p.Delay(n, u)
			if d > b || d < b/2 {
				t.Errorf("Delay(%d, %v) = %s, want within [%s, %s]", n, u, d, b/2, b)
			}
		}
	}
	if got := p.Delay(3, 0); got != 4*time.Second {
		t.Errorf("Delay(3, 0) = %s, want 4s", got)
	}
}

func TestRedeliverySpan(t *testing.T) {
	tests := []struct {
		name string
		r    RedeliveryPolicy
		want time.Duration
	}{
		{"unlimited", RedeliveryPolicy{AckWait: 30 * time.Second}, Forever},
		{"sqs-like", RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}, 150 * time.Second},
		{"backoff repeats last", RedeliveryPolicy{MaxDeliveries: 4, AckWait: time.Second, Backoff: []time.Duration{time.Second, 10 * time.Second}},
			4*time.Second + (1+10+10)*time.Second},
		{"saturates", RedeliveryPolicy{MaxDeliveries: math.MaxInt32, AckWait: Forever / 2}, Forever},
		// A broker whose count is no bound expires the message instead:
		// the last delivery starts before the expiry and holds one lease.
		{"unlimited until the expiry", RedeliveryPolicy{AckWait: 10 * time.Second, Backoff: []time.Duration{time.Minute}, Expiry: 7 * 24 * time.Hour},
			7*24*time.Hour + 10*time.Second},
		{"the count bounds first", RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second, Expiry: time.Hour}, 150 * time.Second},
		{"the expiry bounds first", RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second, Expiry: time.Minute}, 90 * time.Second},
		{"an expiry near forever saturates", RedeliveryPolicy{AckWait: time.Minute, Expiry: Forever - time.Second}, Forever},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Span(); got != tt.want {
				t.Errorf("Span() = %s, want %s", got, tt.want)
			}
		})
	}
}

var (
	sqsWindow       = Window{Backend: "sqs", Duration: 5 * time.Minute, Kind: KindFixed, Source: SourceDocumented, Scope: "queue"}
	serviceBus10m   = Window{Backend: "servicebus", Duration: 10 * time.Minute, Kind: KindConfigured, Source: SourceDiscovered}
	jetstreamWindow = Window{Backend: "jetstream", Duration: 2 * time.Minute, Kind: KindConfigured, Source: SourceDiscovered, Scope: "stream ORDERS"}
	pubsubWindow    = Window{Backend: "pubsub", Kind: KindNone, Source: SourceDocumented}
	memWindow5m     = Window{Backend: "mem", Duration: 5 * time.Minute, Kind: KindConfigured, Source: SourceConfigured}
)

// eightMinutes spans 5m35s: 8 attempts of 10s plus waits of 5+10+20+40+60+60+60s.
// It fits a 10-minute Service Bus window but not SQS's 5 minutes.
var eightMinutes = RetryPolicy{MaxAttempts: 8, InitialBackoff: 5 * time.Second, MaxBackoff: time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}

func TestCheckPublisher(t *testing.T) {
	if got, want := eightMinutes.Span(), 80*time.Second+(5+10+20+40+60+60+60)*time.Second; got != want {
		t.Fatalf("fixture span = %s, want %s", got, want)
	}
	tests := []struct {
		name   string
		plan   PublisherPlan
		unsafe bool
		fixes  []string
	}{
		{"fits a 10m Service Bus window", PublisherPlan{Retry: eightMinutes, Window: serviceBus10m}, false, nil},
		{"same policy refused on SQS", PublisherPlan{Retry: eightMinutes, Window: sqsWindow}, true,
			[]string{"lower PublisherOptions.Retry.MaxAttempts from 8 to 6", "cap PublisherOptions.Retry.MaxBackoff at 31s", "declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s"}},
		{"SQS with covering dedup TTL", PublisherPlan{Retry: eightMinutes, Window: sqsWindow, DedupTTL: 10 * time.Minute}, false, nil},
		{"SQS with too short dedup TTL", PublisherPlan{Retry: eightMinutes, Window: sqsWindow, DedupTTL: 6 * time.Minute}, true,
			[]string{"raise PublisherOptions.ConsumerDedupTTL from 6m to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span"}},
		// A span inside the window never makes a second copy, so a short
		// declared TTL cannot make it unsafe (it used to replace the window).
		{"fits the window whatever the declared TTL", PublisherPlan{Retry: eightMinutes, Window: serviceBus10m, DedupTTL: time.Minute}, false, nil},
		{"fits neither the window nor the declared TTL", PublisherPlan{Retry: eightMinutes, Window: sqsWindow, DedupTTL: time.Minute}, true,
			[]string{"lower PublisherOptions.Retry.MaxAttempts from 8 to 6", "raise PublisherOptions.ConsumerDedupTTL from 1m to ≥ 6m59s"}},
		{"pubsub rejects any retrying policy", PublisherPlan{Retry: DefaultRetryPolicy(), Window: pubsubWindow}, true,
			[]string{"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 1m5s", "set PublisherOptions.Retry.MaxAttempts to 1 (no retries)"}},
		{"pubsub without retries", PublisherPlan{Retry: RetryPolicy{MaxAttempts: 1}, Window: pubsubWindow}, false, nil},
		{"pubsub with dedup declared", PublisherPlan{Retry: DefaultRetryPolicy(), Window: pubsubWindow, DedupTTL: time.Hour}, false, nil},
		{"default fits jetstream", PublisherPlan{Retry: DefaultRetryPolicy(), Window: jetstreamWindow}, false, nil},
		{"margin counts", PublisherPlan{Retry: RetryPolicy{MaxAttempts: 2, AttemptTimeout: 55 * time.Second, InitialBackoff: 5 * time.Second}, Window: jetstreamWindow}, true, nil},
		{"negative margin means none", PublisherPlan{Retry: RetryPolicy{MaxAttempts: 2, AttemptTimeout: 55 * time.Second, InitialBackoff: 10 * time.Second}, Window: jetstreamWindow, Margin: -1}, false, nil},
		{"unbounded attempt", PublisherPlan{Retry: RetryPolicy{MaxAttempts: 3}, Window: sqsWindow}, true,
			[]string{"set PublisherOptions.Retry.AttemptTimeout (without it"}},
		{"hidden SDK retries count", PublisherPlan{Retry: RetryPolicy{MaxAttempts: 2, AttemptTimeout: time.Second}, HiddenSpan: 5 * time.Minute, Window: sqsWindow}, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckPublisher(tt.plan)
			if !tt.unsafe {
				if err != nil {
					t.Fatalf("CheckPublisher: %v", err)
				}
				return
			}
			var ue *UnsafeRetryError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnsafeRetry) {
				t.Fatalf("CheckPublisher = %v, want *UnsafeRetryError", err)
			}
			msg := err.Error()
			for _, f := range tt.fixes {
				if !strings.Contains(msg, f) {
					t.Errorf("error %q\ndoes not suggest %q", msg, f)
				}
			}
			checkPublisherFixes(t, tt.plan, ue)
		})
	}
}

func TestCheckConsumer(t *testing.T) {
	sqsRedelivery := RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}
	tests := []struct {
		name   string
		plan   ConsumerPlan
		unsafe bool
		fix    string
	}{
		{"no store, nothing to check", ConsumerPlan{Redelivery: RedeliveryPolicy{}, Window: sqsWindow}, false, ""},
		{"ttl covers redelivery", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 5 * time.Minute}, false, ""},
		{"ttl too short", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 2 * time.Minute}, true, "lower the broker's max deliveries from 5 to 3"},
		{"unlimited redelivery", ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 30 * time.Second}, Window: jetstreamWindow, DedupTTL: 24 * time.Hour}, true, "set the broker's max deliveries to at most 1000 (deliveries are unlimited now)"},
		{"publisher span within window adds nothing", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 4 * time.Minute}, false, ""},
		// Beyond the window the whole publisher span counts, not the 3m
		// beyond it: 2m30s + 8m = 10m30s, over 0.8 = 13m8s.
		{"publisher span beyond window counts in full", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 8 * time.Minute}, true, "from 4m to ≥ 13m8s"},
		{"publisher span beyond window: the old 6m53s is refused", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 6*time.Minute + 53*time.Second, PublisherSpan: 8 * time.Minute}, true, "keep the publishers' retry span within 4m, the broker window less the margin (ConsumerOptions.PublisherSpan is 8m now)"},
		{"publisher span beyond window, ttl covers all of it", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 13*time.Minute + 8*time.Second, PublisherSpan: 8 * time.Minute}, false, ""},
		// Issue 9, defect 1: mem window 5m, AckWait 30s × 3 deliveries,
		// publishers 2 attempts 9m apart (span 10m), Guard TTL 8m12s. The
		// old check asked 1m30s + (10m − 5m) = 6m30s ≤ 0.8 × 8m12s and
		// accepted; the first copy's key expires at t0+8m12s, the retry at
		// t0+9m is a new message and runs the effect again.
		{"one delivery of one copy needs no TTL", ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 1, AckWait: time.Minute}, Window: sqsWindow, DedupTTL: time.Second, PublisherSpan: time.Minute}, false, ""},
		{"one delivery of each of two copies", ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 1, AckWait: time.Minute}, Window: sqsWindow, DedupTTL: time.Second, PublisherSpan: 6 * time.Minute}, true, "from 1s to ≥ 8m45s"},
		{"issue 9 defect 1", ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second}, Window: memWindow5m, DedupTTL: 8*time.Minute + 12*time.Second, PublisherSpan: 10 * time.Minute}, true, "from 8m12s to ≥ 14m23s"},
		{"margin applies to the window too", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 4*time.Minute + time.Second}, true, "from 4m to ≥ 8m9s"},
		{"no margin: span equal to the window fits", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 150 * time.Second, PublisherSpan: 5 * time.Minute, Margin: -1}, false, ""},
		{"no margin: a span 1ns over the window counts in full", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 150*time.Second + 5*time.Minute, PublisherSpan: 5*time.Minute + 1, Margin: -1}, true, ""},
		{"no window: whole publisher span", ConsumerPlan{Redelivery: sqsRedelivery, Window: pubsubWindow, DedupTTL: 10 * time.Minute, PublisherSpan: 8 * time.Minute}, true, "from 10m to ≥ 13m8s"},
		{"ordered within the window: nothing more", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 4 * time.Minute, Ordered: true}, false, ""},
		// 8m + (3+1) × 2m30s = 18m, over 0.8 = 22m30s; 1h fits
		// (48m − 8m) / 2m30s − 1 = 15 messages between two copies.
		{"ordered beyond the window, no backlog declared", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: time.Hour, PublisherSpan: 8 * time.Minute, Ordered: true}, true, "set ConsumerOptions.GroupBacklog to at most 15"},
		{"ordered beyond the window, backlog too large", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 20 * time.Minute, PublisherSpan: 8 * time.Minute, Ordered: true, GroupBacklog: 3}, true, "from 20m to ≥ 22m30s"},
		{"ordered beyond the window, backlog covered", ConsumerPlan{Redelivery: sqsRedelivery, Window: sqsWindow, DedupTTL: 22*time.Minute + 30*time.Second, PublisherSpan: 8 * time.Minute, Ordered: true, GroupBacklog: 3}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckConsumer(tt.plan)
			if (err != nil) != tt.unsafe {
				t.Fatalf("CheckConsumer = %v, want unsafe=%v", err, tt.unsafe)
			}
			if err == nil {
				return
			}
			if !strings.Contains(err.Error(), tt.fix) {
				t.Errorf("error %q does not contain %q", err, tt.fix)
			}
			var ue *UnsafeRetryError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnsafeRetry) {
				t.Fatalf("CheckConsumer = %v, want *UnsafeRetryError", err)
			}
			checkConsumerFixes(t, tt.plan, ue)
		})
	}
}

// TestChecksAgree walks a grid of plans that declare each other truthfully
// (the publisher's ConsumerDedupTTL is the consumer's TTL, the consumer's
// PublisherSpan the publisher's span) and checks that the two checks state
// one model: whatever the consumer accepts, the publisher accepts; a
// publisher that fits its window costs the consumer nothing beyond R; and a
// publisher refused by both window and TTL is refused by the consumer too.
func TestChecksAgree(t *testing.T) {
	redelivery := RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second, Backoff: []time.Duration{10 * time.Second}}
	r := redelivery.Span()
	windows := []Window{pubsubWindow, jetstreamWindow, sqsWindow, serviceBus10m}
	checked := 0
	for _, w := range windows {
		for _, margin := range []float64{-1, 0, 0.1, 0.5} {
			for attempts := 2; attempts <= 6; attempts++ {
				for _, timeout := range []time.Duration{time.Second, 30 * time.Second, 2 * time.Minute} {
					retry := RetryPolicy{MaxAttempts: attempts, InitialBackoff: 10 * time.Second, Multiplier: 2, AttemptTimeout: timeout}
					span := retry.Span()
					for ttl := 10 * time.Second; ttl <= 30*time.Minute; ttl += 10 * time.Second {
						checked++
						pub := CheckPublisher(PublisherPlan{Retry: retry, Window: w, DedupTTL: ttl, Margin: margin})
						con := CheckConsumer(ConsumerPlan{Redelivery: redelivery, Window: w, DedupTTL: ttl, PublisherSpan: span, Margin: margin})
						bare := CheckPublisher(PublisherPlan{Retry: retry, Window: w, Margin: margin})
						onlyR := CheckConsumer(ConsumerPlan{Redelivery: redelivery, Window: w, DedupTTL: ttl, Margin: margin})
						switch {
						case con == nil && pub != nil:
							t.Fatalf("window %v, margin %v, span %s, ttl %s: consumer accepts, publisher refuses: %v", w, margin, span, ttl, pub)
						case bare == nil && (con == nil) != (onlyR == nil):
							t.Fatalf("window %v, margin %v, span %s, ttl %s: the publisher fits its window but the consumer asks more than R (%s): %v", w, margin, span, ttl, r, con)
						case bare != nil && pub != nil && con == nil:
							t.Fatalf("window %v, margin %v, span %s, ttl %s: publisher refused, consumer accepts", w, margin, span, ttl)
						}
					}
				}
			}
		}
	}
	t.Logf("%d plans agree", checked)
}

// TestErrorText: what the span was compared with is what the bracket
// names, and durations read as FormatDuration prints them.
func TestErrorText(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string // the text up to the fixes, which TestFixTexts shows
	}{
		{"publisher against the window", CheckPublisher(PublisherPlan{Retry: eightMinutes, Window: sqsWindow}),
			"dedupq: unsafe publisher retry policy: worst-case span 5m35s exceeds the broker window 5m less a 20% safety margin = 4m (sqs dedup window 5m (fixed by the broker, documented, scope queue))"},
		{"publisher against the declared TTL", CheckPublisher(PublisherPlan{Retry: eightMinutes, Window: sqsWindow, DedupTTL: 6 * time.Minute}),
			"dedupq: unsafe publisher retry policy: worst-case span 5m35s exceeds the declared consumer dedup TTL 6m less a 20% safety margin = 4m48s (PublisherOptions.ConsumerDedupTTL; the span does not fit the sqs dedup window 5m (fixed by the broker, documented, scope queue) either)"},
		{"publisher against the declared TTL, no window", CheckPublisher(PublisherPlan{Retry: eightMinutes, Window: pubsubWindow, DedupTTL: 6 * time.Minute}),
			"dedupq: unsafe publisher retry policy: worst-case span 5m35s exceeds the declared consumer dedup TTL 6m less a 20% safety margin = 4m48s (PublisherOptions.ConsumerDedupTTL; pubsub has no publish-side dedup window (documented))"},
		{"publisher with nothing", CheckPublisher(PublisherPlan{Retry: DefaultRetryPolicy(), Window: pubsubWindow}),
			"dedupq: unsafe publisher retry policy: worst-case span 51.5s has nothing to protect it: pubsub has no publish-side dedup window (documented) and no consumer-side dedup was declared (PublisherOptions.ConsumerDedupTTL)"},
		{"consumer, redelivery only", CheckConsumer(ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}, Window: sqsWindow, DedupTTL: 2 * time.Minute}),
			"dedupq: unsafe consumer retry policy: worst-case span 2m30s exceeds the dedup store TTL 2m less a 20% safety margin = 1m36s (the TTL of ConsumerOptions.Dedup; redelivery: 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s))"},
		{"consumer, publishers beyond the window", CheckConsumer(ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}, Window: sqsWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 8 * time.Minute}),
			"dedupq: unsafe consumer retry policy: worst-case span 10m30s exceeds the dedup store TTL 4m less a 20% safety margin = 3m12s (the TTL of ConsumerOptions.Dedup; redelivery: 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s), plus the publishers' whole retry span 8m (ConsumerOptions.PublisherSpan), which does not fit the sqs dedup window 5m (fixed by the broker, documented, scope queue) less the margin)"},
		{"consumer, publishers without a window", CheckConsumer(ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}, Window: pubsubWindow, DedupTTL: 4 * time.Minute, PublisherSpan: 8 * time.Minute}),
			"dedupq: unsafe consumer retry policy: worst-case span 10m30s exceeds the dedup store TTL 4m less a 20% safety margin = 3m12s (the TTL of ConsumerOptions.Dedup; redelivery: 5 deliveries, no backoff, ack wait 30s per delivery (worst-case span 2m30s), plus the publishers' whole retry span 8m (ConsumerOptions.PublisherSpan): pubsub has no publish-side dedup window (documented))"},
		{"unbounded spans read forever", CheckConsumer(ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 30 * time.Second}, Window: jetstreamWindow, DedupTTL: 50 * time.Hour}),
			"dedupq: unsafe consumer retry policy: worst-case span forever exceeds the dedup store TTL 2d2h less a 20% safety margin = 1d16h (the TTL of ConsumerOptions.Dedup; redelivery: unlimited deliveries, no backoff, ack wait 30s per delivery (worst-case span forever))"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.err == nil {
				t.Fatal("the check passed")
			}
			got, _, _ := strings.Cut(tc.err.Error(), "; fix: ")
			if got != tc.want {
				t.Errorf("error text\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{time.Nanosecond, "1ns"},
		{100 * time.Millisecond, "100ms"},
		{time.Second, "1s"},
		{51500 * time.Millisecond, "51.5s"},
		{5 * time.Minute, "5m"},
		{6*time.Minute + 59*time.Second, "6m59s"},
		{time.Hour + 30*time.Minute, "1h30m"},
		{time.Hour + 5*time.Second, "1h5s"},
		{time.Minute + 250*time.Millisecond, "1m0.25s"},
		{24 * time.Hour, "1d"},
		{3*24*time.Hour + 4*time.Hour, "3d4h"},
		{7*24*time.Hour + time.Nanosecond, "7d0.000000001s"},
		{1e18, "11574d1h46m40s"}, // time.Duration prints 277777h46m40s
		{Forever - 1, "106751d23h47m16.854775806s"},
		{Forever, "forever"},
		{-time.Second, "-1s"},
	} {
		if got := FormatDuration(tc.d); got != tc.want {
			t.Errorf("FormatDuration(%d) = %q, want %q", int64(tc.d), got, tc.want)
		}
		if tc.d > 0 && tc.d < Forever {
			if back, err := parseDuration(tc.want); err != nil || back != tc.d {
				t.Errorf("%q reads back as %s, %v; want %d", tc.want, back, err, int64(tc.d))
			}
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []RetryPolicy{
		{MaxAttempts: -1},
		{InitialBackoff: -time.Second},
		{Multiplier: math.NaN()},
		{Jitter: 1.5},
	}
	for _, p := range bad {
		if p.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want error", p)
		}
		if CheckPublisher(PublisherPlan{Retry: p, Window: sqsWindow}) == nil {
			t.Errorf("CheckPublisher accepted invalid %+v", p)
		}
	}
}

func FuzzRetrySpan(f *testing.F) {
	f.Add(5, int64(100*time.Millisecond), int64(5*time.Second), 2.0, 0.2, int64(10*time.Second))
	f.Add(math.MaxInt, int64(math.MaxInt64), int64(0), 1e300, 1.0, int64(math.MaxInt64))
	f.Add(3, int64(-5), int64(-1), -2.0, -1.0, int64(-7))
	f.Fuzz(func(t *testing.T, attempts int, initial, maxB int64, mult, jitter float64, timeout int64) {
		if attempts > 1<<20 {
			attempts = 1<<20 + attempts%7 // keep the loop short; saturation is reached far earlier
		}
		p := RetryPolicy{MaxAttempts: attempts, InitialBackoff: time.Duration(initial), MaxBackoff: time.Duration(maxB),
			Multiplier: mult, Jitter: jitter, AttemptTimeout: time.Duration(timeout)}
		span := p.Span()
		if span < 0 {
			t.Fatalf("negative span %d for %+v", span, p)
		}
		if p.Validate() != nil {
			return
		}
		// Adding an attempt never shortens the worst case.
		q := p
		q.MaxAttempts = max(p.MaxAttempts, 1) + 1
		if q.MaxAttempts > 0 && q.Span() < span {
			t.Fatalf("span shrank from %s to %s with one more attempt: %+v", span, q.Span(), p)
		}
		for n := 1; n <= 3; n++ {
			if d := p.Delay(n, 0.5); d < 0 || d > p.Backoff(n) {
				t.Fatalf("Delay(%d) = %s outside [0, %s]", n, d, p.Backoff(n))
			}
		}
		_ = CheckPublisher(PublisherPlan{Retry: p, Window: sqsWindow}) // must not panic
	})
}

// ConsumerPlan.Span is the span CheckConsumer compares with the TTL,
// whatever the TTL: the redelivery span, plus the whole publisher span
// when that does not fit the window less the margin.
func TestConsumerPlanSpan(t *testing.T) {
	r := RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second} // 150s
	w := Window{Backend: "b", Duration: 2 * time.Minute, Kind: KindConfigured}
	for _, tc := range []struct {
		name string
		p    ConsumerPlan
		want time.Duration
	}{
		{"publisher span fits the window", ConsumerPlan{Redelivery: r, Window: w, PublisherSpan: time.Minute}, 150 * time.Second},
		{"publisher span beyond the window", ConsumerPlan{Redelivery: r, Window: w, PublisherSpan: 3 * time.Minute}, 330 * time.Second},
		{"no window", ConsumerPlan{Redelivery: r, PublisherSpan: time.Second}, 151 * time.Second},
		{"with a TTL", ConsumerPlan{Redelivery: r, PublisherSpan: time.Second, DedupTTL: time.Hour}, 151 * time.Second},
		{"one delivery of one copy", ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 1, AckWait: time.Minute}, Window: w}, 0},
		{"unlimited", ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: time.Second}, Window: w}, Forever},
		// Ordered: max(P, R) + (B+1)·R.
		{"ordered, publisher span fits the window", ConsumerPlan{Redelivery: r, Window: w, PublisherSpan: time.Minute, Ordered: true}, 150 * time.Second},
		{"ordered, no backlog declared", ConsumerPlan{Redelivery: r, Window: w, PublisherSpan: 3 * time.Minute, Ordered: true}, Forever},
		{"ordered, P over R", ConsumerPlan{Redelivery: r, Window: w, PublisherSpan: 3 * time.Minute, Ordered: true, GroupBacklog: 2}, 3*time.Minute + 3*150*time.Second},
		{"ordered, P under R", ConsumerPlan{Redelivery: r, PublisherSpan: time.Minute, Ordered: true, GroupBacklog: 2}, 150*time.Second + 3*150*time.Second},
		{"ordered, P far over R", ConsumerPlan{Redelivery: r, PublisherSpan: 10 * time.Minute, Ordered: true, GroupBacklog: 1}, 10*time.Minute + 2*150*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.p.Span(); got != tc.want {
				t.Errorf("Span() = %s, want %s", got, tc.want)
			}
			// It is what CheckConsumer compares: a TTL just covering it
			// passes, one a second shorter does not.
			if tc.want == 0 || tc.want >= Forever {
				return
			}
			p := tc.p
			p.Margin = -1
			p.DedupTTL = tc.want
			if err := CheckConsumer(p); err != nil {
				t.Errorf("a TTL of exactly Span() was refused: %v", err)
			}
			p.DedupTTL = tc.want - time.Second
			if err := CheckConsumer(p); err == nil {
				t.Error("a TTL a second short of Span() passed")
			}
		})
	}
}
