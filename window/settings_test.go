// The fixes of the startup check, as text and as changes that pass: pure
// arithmetic, no services. Each adapter's own tests show the fixes with the
// Settings it really reports.
package window

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Settings shaped like two adapters' (a stream-and-durable broker, and one
// configured through options), short enough to read in the goldens below.
var (
	streamSettings = Settings{Window: "the stream's Duplicates", AckWait: "the durable's AckWait", MaxDeliveries: "the durable's MaxDeliver"}
	optionSettings = Settings{Window: "Options.DedupWindow", AckWait: "Options.AckWait", MaxDeliveries: "Options.MaxDeliveries", Backoff: "Options.Backoff"}
	// expirySettings are a broker's that bounds redelivery by expiring the
	// message, its count of deliveries being no bound (Pub/Sub).
	expirySettings = Settings{AckWait: "the ack deadline", MaxDeliveries: "the best-effort max deliveries", Expiry: "the message retention"}
)

func described(w Window, s Settings) Window { w.Settings = s; return w }

// TestFixTexts shows the exact fixes for each kind of window and for
// settings named by the driver or left to the generic names. Every fix is
// also applied and re-checked (checkPublisherFixes, checkConsumerFixes).
func TestFixTexts(t *testing.T) {
	sqsRedelivery := RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}
	memNone := Window{Backend: "mem", Kind: KindNone, Source: SourceConfigured, Settings: optionSettings}
	tests := []struct {
		name string
		pub  *PublisherPlan
		con  *ConsumerPlan
		want []string
	}{
		{name: "publisher, configured window named by the driver",
			pub: &PublisherPlan{Retry: eightMinutes, Window: described(jetstreamWindow, streamSettings)},
			want: []string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 4",
				"cap PublisherOptions.Retry.MaxBackoff at 2s",
				"raise the stream's Duplicates from 2m to ≥ 6m59s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "publisher, configured window the driver does not name",
			pub: &PublisherPlan{Retry: eightMinutes, Window: jetstreamWindow},
			want: []string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 4",
				"cap PublisherOptions.Retry.MaxBackoff at 2s",
				"raise the jetstream dedup window from 2m to ≥ 6m59s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "publisher, fixed window: nothing to raise",
			pub: &PublisherPlan{Retry: eightMinutes, Window: described(sqsWindow, streamSettings)},
			want: []string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 6",
				"cap PublisherOptions.Retry.MaxBackoff at 31s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "publisher, declared TTL too short: raise it",
			pub: &PublisherPlan{Retry: eightMinutes, Window: sqsWindow, DedupTTL: 6 * time.Minute},
			want: []string{
				"lower PublisherOptions.Retry.MaxAttempts from 8 to 7",
				"cap PublisherOptions.Retry.MaxBackoff at 44s",
				"lower PublisherOptions.Retry.AttemptTimeout from 10s to 4s",
				"raise PublisherOptions.ConsumerDedupTTL from 6m to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "publisher, no window and no way to get one: no retries last",
			pub: &PublisherPlan{Retry: DefaultRetryPolicy(), Window: pubsubWindow},
			want: []string{
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 1m5s, and ConsumerOptions.PublisherSpan to 51.5s on the consumers, whose TTL must also cover their redelivery span",
				"set PublisherOptions.Retry.MaxAttempts to 1 (no retries)",
			}},
		{name: "publisher, no window but a setting that gives one",
			pub: &PublisherPlan{Retry: DefaultRetryPolicy(), Window: memNone},
			want: []string{
				"set Options.DedupWindow to ≥ 1m5s",
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 1m5s, and ConsumerOptions.PublisherSpan to 51.5s on the consumers, whose TTL must also cover their redelivery span",
				"set PublisherOptions.Retry.MaxAttempts to 1 (no retries)",
			}},
		{name: "publisher, hidden SDK retries: one attempt is not enough",
			pub: &PublisherPlan{Retry: RetryPolicy{MaxAttempts: 2, AttemptTimeout: time.Second}, HiddenSpan: 5 * time.Minute, Window: sqsWindow},
			want: []string{
				"declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m18s, and ConsumerOptions.PublisherSpan to 5m2s on the consumers, whose TTL must also cover their redelivery span",
			}},
		{name: "consumer, redelivery named by the driver",
			con: &ConsumerPlan{Redelivery: sqsRedelivery, Window: described(jetstreamWindow, streamSettings), DedupTTL: 2 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 2m to ≥ 3m8s",
				"lower the durable's MaxDeliver from 5 to 3",
				"lower the durable's AckWait from 30s to 19s",
			}},
		{name: "consumer, redelivery the driver does not name",
			con: &ConsumerPlan{Redelivery: sqsRedelivery, Window: jetstreamWindow, DedupTTL: 2 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 2m to ≥ 3m8s",
				"lower the broker's max deliveries from 5 to 3",
				"lower the broker's ack wait (the lease on one delivery) from 30s to 19s",
			}},
		{name: "consumer, unlimited deliveries",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 30 * time.Second}, Window: described(jetstreamWindow, streamSettings), DedupTTL: 10 * time.Minute},
			want: []string{
				"set the durable's MaxDeliver to at most 16 (deliveries are unlimited now)",
			}},
		{name: "consumer, unlimited deliveries and no TTL left for one",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 30 * time.Second}, Window: described(sqsWindow, streamSettings), DedupTTL: 5 * time.Minute, PublisherSpan: 6 * time.Minute},
			want: []string{
				"bound the durable's MaxDeliver (deliveries are unlimited now), and raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) to cover them",
			}},
		{name: "consumer, deliveries bounded only by an expiry: no count is a fix",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 10 * time.Second, Expiry: time.Hour, ExpirySource: SourceDiscovered}, Window: described(pubsubWindow, expirySettings), DedupTTL: 30 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 30m to ≥ 1h15m13s",
				"lower the message retention from 1h to 23m50s",
			}},
		{name: "consumer, an expiry no shorter than the setting takes: only the TTL",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 10 * time.Second, Expiry: time.Hour}, Window: described(pubsubWindow, Settings{Expiry: "the message retention", MinExpiry: 30 * time.Minute}), DedupTTL: 30 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 30m to ≥ 1h15m13s",
			}},
		{name: "consumer, an expiry the program cannot change: only the TTL",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{AckWait: 10 * time.Second, Expiry: time.Hour}, Window: pubsubWindow, DedupTTL: 30 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 30m to ≥ 1h15m13s",
			}},
		{name: "consumer, a named backoff can be capped",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 4, AckWait: 10 * time.Second, Backoff: []time.Duration{time.Minute, 2 * time.Minute}}, Window: described(memWindow5m, optionSettings), DedupTTL: 5 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 5m to ≥ 7m5s",
				"lower Options.MaxDeliveries from 4 to 3",
				"cap Options.Backoff at 1m10s",
			}},
		{name: "consumer, one delivery is the last resort and says what it costs",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 3, AckWait: time.Minute}, Window: described(jetstreamWindow, streamSettings), DedupTTL: time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 1m to ≥ 3m45s",
				"lower the durable's AckWait from 1m to 16s",
				"set the durable's MaxDeliver to 1, which means no redelivery at all: a message whose first delivery fails is not retried",
			}},
		{name: "consumer, publishers beyond a window that can be raised",
			con: &ConsumerPlan{Redelivery: RedeliveryPolicy{MaxDeliveries: 3, AckWait: 30 * time.Second}, Window: described(memWindow5m, optionSettings), DedupTTL: 8*time.Minute + 12*time.Second, PublisherSpan: 10 * time.Minute},
			want: []string{
				"raise the TTL of ConsumerOptions.Dedup (dedup.GuardOptions.TTL, pgstore.TxGuardOptions.TTL) from 8m12s to ≥ 14m23s",
				"keep the publishers' retry span within 4m, the broker window less the margin (ConsumerOptions.PublisherSpan is 10m now)",
				"raise Options.DedupWindow from 5m to ≥ 12m30s",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.pub != nil {
				err = CheckPublisher(*tt.pub)
			} else {
				err = CheckConsumer(*tt.con)
			}
			var ue *UnsafeRetryError
			if !errors.As(err, &ue) {
				t.Fatalf("check = %v, want an *UnsafeRetryError", err)
			}
			if got := strings.Join(ue.Fixes, "\n"); got != strings.Join(tt.want, "\n") {
				t.Errorf("fixes:\n%s\nwant:\n%s", got, strings.Join(tt.want, "\n"))
			}
			if tt.pub != nil {
				checkPublisherFixes(t, *tt.pub, ue)
			} else {
				checkConsumerFixes(t, *tt.con, ue)
			}
		})
	}
}

// TestFixesPassAcrossPlans applies every fix of every plan of a grid
// that either check refuses: each must pass when re-checked.
func TestFixesPassAcrossPlans(t *testing.T) {
	windows := []Window{
		pubsubWindow, sqsWindow, jetstreamWindow, serviceBus10m,
		described(jetstreamWindow, streamSettings), described(memWindow5m, optionSettings),
		described(pubsubWindow, expirySettings),
		{Backend: "mem", Kind: KindNone, Source: SourceConfigured, Settings: optionSettings},
	}
	redeliveries := []RedeliveryPolicy{
		{AckWait: 30 * time.Second},
		{MaxDeliveries: 1, AckWait: time.Minute},
		{MaxDeliveries: 5, AckWait: 30 * time.Second},
		{MaxDeliveries: 4, AckWait: 10 * time.Second, Backoff: []time.Duration{time.Minute, 2 * time.Minute}},
		{AckWait: 10 * time.Second, Backoff: []time.Duration{20 * time.Second}, Expiry: 10 * time.Minute},
		{MaxDeliveries: 5, AckWait: 30 * time.Second, Expiry: 90 * time.Second},
	}
	refused := 0
	for _, w := range windows {
		for _, margin := range []float64{-1, 0, 0.5} {
			for attempts := 2; attempts <= 6; attempts += 2 {
				for _, timeout := range []time.Duration{time.Second, 40 * time.Second} {
					retry := RetryPolicy{MaxAttempts: attempts, InitialBackoff: 10 * time.Second, Multiplier: 2, AttemptTimeout: timeout}
					for _, ttl := range []time.Duration{0, 30 * time.Second, 3 * time.Minute, 10 * time.Minute} {
						pub := PublisherPlan{Retry: retry, Window: w, DedupTTL: ttl, Margin: margin}
						if err := CheckPublisher(pub); err != nil {
							refused++
							var ue *UnsafeRetryError
							if !errors.As(err, &ue) {
								t.Fatalf("CheckPublisher = %v", err)
							}
							checkPublisherFixes(t, pub, ue)
						}
						for _, r := range redeliveries {
							con := ConsumerPlan{Redelivery: r, Window: w, DedupTTL: ttl, PublisherSpan: retry.Span(), Margin: margin}
							if err := CheckConsumer(con); err != nil {
								refused++
								var ue *UnsafeRetryError
								if !errors.As(err, &ue) {
									t.Fatalf("CheckConsumer = %v", err)
								}
								checkConsumerFixes(t, con, ue)
							}
						}
					}
				}
			}
		}
	}
	if refused < 100 {
		t.Fatalf("only %d refused plans: the grid no longer tests the fixes", refused)
	}
	t.Logf("the fixes of %d refused plans pass", refused)
}

// Fixes that name no value to apply: they say what to do and why.
var adviceOnly = regexp.MustCompile(`^set ` + regexp.QuoteMeta(optAttemptTimeout) + ` \(|^bound .* \(deliveries are unlimited now\), and raise |^declare ` + regexp.QuoteMeta(optGroupBacklog) + `, .* and raise `)

// fixValue is the value a fix sets: the first duration or number after
// "to", "at" or "within" in what follows the setting's name.
var fixValue = regexp.MustCompile(` (?:to|at|within) (?:≥ |at most )?([0-9][0-9a-zµ.]*)`)

// fixChange is one kind of fix: the text up to the value, and how to apply
// the value to a plan.
type fixChange[P any] struct {
	prefix string
	apply  func(p *P, v string) error
}

// applyFix applies fix to p, returning false when no change knows it.
func applyFix[P any](p *P, fix string, changes []fixChange[P]) (bool, error) {
	for _, c := range changes {
		rest, ok := strings.CutPrefix(fix, c.prefix)
		if !ok {
			continue
		}
		m := fixValue.FindStringSubmatch(rest)
		if m == nil {
			return true, fmt.Errorf("no value in %q", rest)
		}
		return true, c.apply(p, m[1])
	}
	return false, nil
}

func setDuration(d *time.Duration) func(string) error {
	return func(v string) (err error) { *d, err = parseDuration(v); return err }
}

func setInt(n *int) func(string) error {
	return func(v string) (err error) { *n, err = strconv.Atoi(v); return err }
}

// windowChanges are the fixes that lengthen w, whichever side.
func windowChanges[P any](w Window, win func(*P) *Window) []fixChange[P] {
	name := windowSetting(w)
	if name == "" {
		return nil
	}
	set := func(p *P, v string) error {
		ww := win(p)
		ww.Kind = KindConfigured
		return setDuration(&ww.Duration)(v)
	}
	return []fixChange[P]{{"raise " + name, set}, {"set " + name, set}}
}

// checkPublisherFixes applies each fix of ue to plan and re-runs the
// check, which must pass; a fix that names no value must be advice.
func checkPublisherFixes(t *testing.T, plan PublisherPlan, ue *UnsafeRetryError) {
	t.Helper()
	changes := append([]fixChange[PublisherPlan]{
		{"lower " + optMaxAttempts, func(p *PublisherPlan, v string) error { return setInt(&p.Retry.MaxAttempts)(v) }},
		{"set " + optMaxAttempts, func(p *PublisherPlan, v string) error { return setInt(&p.Retry.MaxAttempts)(v) }},
		{"cap " + optMaxBackoff, func(p *PublisherPlan, v string) error { return setDuration(&p.Retry.MaxBackoff)(v) }},
		{"lower " + optAttemptTimeout, func(p *PublisherPlan, v string) error { return setDuration(&p.Retry.AttemptTimeout)(v) }},
		{"raise " + optConsumerDedupTTL, func(p *PublisherPlan, v string) error { return setDuration(&p.DedupTTL)(v) }},
		{"declare consumer-side dedup: set " + optConsumerDedupTTL, func(p *PublisherPlan, v string) error { return setDuration(&p.DedupTTL)(v) }},
	}, windowChanges(plan.Window, func(p *PublisherPlan) *Window { return &p.Window })...)
	for _, fix := range ue.Fixes {
		if adviceOnly.MatchString(fix) {
			continue
		}
		p := plan
		known, err := applyFix(&p, fix, changes)
		switch {
		case !known:
			t.Errorf("fix %q: no test knows how to apply it", fix)
		case err != nil:
			t.Errorf("fix %q: %v", fix, err)
		default:
			if err := CheckPublisher(p); err != nil {
				t.Errorf("fix %q does not pass: %v", fix, err)
			}
		}
	}
}

// checkConsumerFixes is checkPublisherFixes for the consumer's check.
func checkConsumerFixes(t *testing.T, plan ConsumerPlan, ue *UnsafeRetryError) {
	t.Helper()
	s := plan.Window.Settings
	changes := append([]fixChange[ConsumerPlan]{
		{"raise " + optDedupTTLFields, func(p *ConsumerPlan, v string) error { return setDuration(&p.DedupTTL)(v) }},
		{"lower " + s.maxDeliveries(), func(p *ConsumerPlan, v string) error { return setInt(&p.Redelivery.MaxDeliveries)(v) }},
		{"set " + s.maxDeliveries(), func(p *ConsumerPlan, v string) error { return setInt(&p.Redelivery.MaxDeliveries)(v) }},
		{"lower " + s.ackWait(), func(p *ConsumerPlan, v string) error { return setDuration(&p.Redelivery.AckWait)(v) }},
		{"lower " + s.Expiry + " ", func(p *ConsumerPlan, v string) error { return setDuration(&p.Redelivery.Expiry)(v) }},
		{"keep the publishers' retry span", func(p *ConsumerPlan, v string) error { return setDuration(&p.PublisherSpan)(v) }},
		{"set " + optGroupBacklog, func(p *ConsumerPlan, v string) error { return setInt(&p.GroupBacklog)(v) }},
		{"lower " + optGroupBacklog, func(p *ConsumerPlan, v string) error { return setInt(&p.GroupBacklog)(v) }},
	}, windowChanges(plan.Window, func(p *ConsumerPlan) *Window { return &p.Window })...)
	if s.Backoff != "" {
		changes = append(changes, fixChange[ConsumerPlan]{"cap " + s.Backoff, func(p *ConsumerPlan, v string) error {
			c, err := parseDuration(v)
			p.Redelivery.Backoff = append([]time.Duration(nil), p.Redelivery.Backoff...)
			capBackoff(p.Redelivery.Backoff, c)
			return err
		}})
	}
	for _, fix := range ue.Fixes {
		if adviceOnly.MatchString(fix) {
			continue
		}
		p := plan
		known, err := applyFix(&p, fix, changes)
		switch {
		case !known:
			t.Errorf("fix %q: no test knows how to apply it", fix)
		case err != nil:
			t.Errorf("fix %q: %v", fix, err)
		default:
			if err := CheckConsumer(p); err != nil {
				t.Errorf("fix %q does not pass: %v", fix, err)
			}
		}
	}
}

// parseDuration reads what FormatDuration prints: an optional whole number
// of days, then what time.ParseDuration reads.
func parseDuration(s string) (time.Duration, error) {
	days := time.Duration(0)
	if n, rest, ok := strings.Cut(s, "d"); ok {
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("days in %q: %w", s, err)
		}
		days, s = time.Duration(v)*24*time.Hour, rest
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	return days + d, err
}
