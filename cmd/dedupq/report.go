package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/window"
)

// report is what check prints for one URL, as text or JSON. Every string
// in it comes from a redacted URL or from Inspect, which shows nothing
// that RedactURL hides.
type report struct {
	URL string `json:"url"`
	// Error says why the URL could not be opened or read; the fields
	// below are then empty.
	Error      string      `json:"error,omitempty"`
	Window     *windowJSON `json:"window,omitempty"`
	Redelivery *redelivery `json:"redelivery,omitempty"`
	Retry      *retry      `json:"retry,omitempty"`
	DedupTTL   string      `json:"dedup_ttl,omitempty"`
	// Ordering is "kept per group key", or why the subscription cannot
	// keep it (what an Ordered consumer would be refused with).
	Ordering string `json:"ordering"`
	// WorstCaseSpan is what the consumer check asks the dedup TTL to
	// cover, less the margin (with --ordered, the head-of-line wait too).
	WorstCaseSpan string  `json:"worst_case_span"`
	Publisher     verdict `json:"publisher"`
	Consumer      verdict `json:"consumer"`
}

type windowJSON struct {
	Text     string `json:"text"`
	Backend  string `json:"backend"`
	Duration string `json:"duration,omitempty"`
	Kind     string `json:"kind"`
	Source   string `json:"source"`
	Scope    string `json:"scope,omitempty"`
}

type redelivery struct {
	Text          string   `json:"text"`
	MaxDeliveries int      `json:"max_deliveries"` // 0: unlimited
	AckWait       string   `json:"ack_wait"`
	Backoff       []string `json:"backoff,omitempty"`
	// Expiry bounds the deliveries where the broker's count does not
	// (Pub/Sub's message retention); ExpirySource says where it came from.
	Expiry       string `json:"expiry,omitempty"`
	ExpirySource string `json:"expiry_source,omitempty"`
	Span         string `json:"span"`
}

type retry struct {
	Text       string `json:"text"`
	Span       string `json:"span"`
	HiddenSpan string `json:"hidden_span,omitempty"`
}

// verdict is one startup check's answer.
type verdict struct {
	OK bool `json:"ok"`
	// Checked is false when there was nothing to check.
	Checked bool     `json:"checked"`
	Problem string   `json:"problem,omitempty"`
	Fixes   []string `json:"fixes,omitempty"`
}

func newReport(raw string, in *dedupq.Inspection, err error, ttl time.Duration) report {
	if err != nil {
		return report{URL: redact(raw), Error: err.Error()}
	}
	r := report{
		URL:    in.URL,
		Window: newWindow(in.Window),
		Redelivery: &redelivery{
			Text: in.Redelivery.String(), MaxDeliveries: max(in.Redelivery.MaxDeliveries, 0),
			AckWait: window.FormatDuration(in.Redelivery.AckWait), Span: window.FormatDuration(in.Redelivery.Span()),
		},
		Retry:         &retry{Text: in.Retry.String(), Span: window.FormatDuration(in.Retry.Span())},
		Publisher:     newVerdict(in.Publisher, true),
		Consumer:      newVerdict(in.Consumer, ttl > 0),
		Ordering:      "kept per group key",
		WorstCaseSpan: window.FormatDuration(in.WorstCaseSpan),
	}
	if in.Ordering != nil {
		r.Ordering = "not kept: " + strings.TrimPrefix(in.Ordering.Error(), dedupq.ErrOrderingUnsupported.Error()+": ")
	}
	if in.Redelivery.Expires() {
		r.Redelivery.Expiry = window.FormatDuration(in.Redelivery.Expiry)
		r.Redelivery.ExpirySource = in.Redelivery.ExpirySource.String()
	}
	for _, b := range in.Redelivery.Backoff {
		r.Redelivery.Backoff = append(r.Redelivery.Backoff, window.FormatDuration(b))
	}
	if in.HiddenRetrySpan > 0 {
		r.Retry.HiddenSpan = window.FormatDuration(in.HiddenRetrySpan)
	}
	if ttl > 0 {
		r.DedupTTL = window.FormatDuration(ttl)
	}
	return r
}

// redact shows a URL that did not parse far enough for Inspect to redact
// it: RedactURL when it parses, else nothing of it.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(malformed URL, not shown)"
	}
	return dedupq.RedactURL(u)
}

func newWindow(w window.Window) *windowJSON {
	j := &windowJSON{Text: w.String(), Backend: w.Backend, Kind: w.Kind.String(), Source: w.Source.String(), Scope: w.Scope}
	if w.Protects() {
		j.Duration = window.FormatDuration(w.Duration)
	}
	return j
}

func newVerdict(err error, checked bool) verdict {
	if err == nil {
		return verdict{OK: true, Checked: checked}
	}
	v := verdict{Checked: true}
	var ue *window.UnsafeRetryError
	if errors.As(err, &ue) {
		// The fixes are listed one a line rather than joined into the
		// message.
		bare := *ue
		bare.Fixes = nil
		v.Problem, v.Fixes = bare.Error(), ue.Fixes
	} else {
		v.Problem = err.Error()
	}
	v.Problem = strings.TrimPrefix(v.Problem, "dedupq: ")
	return v
}

func printText(w io.Writer, reps []report) {
	for i, r := range reps {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, r.URL)
		if r.Error != "" {
			fmt.Fprintf(w, "  could not check: %s\n", r.Error)
			continue
		}
		fmt.Fprintf(w, "  window:      %s\n", r.Window.Text)
		fmt.Fprintf(w, "  redelivery:  %s\n", r.Redelivery.Text)
		fmt.Fprintf(w, "  retry:       %s\n", r.Retry.Text)
		if r.Retry.HiddenSpan != "" {
			fmt.Fprintf(w, "               plus up to %s of the SDK's own retries\n", r.Retry.HiddenSpan)
		}
		if r.DedupTTL != "" {
			fmt.Fprintf(w, "  dedup TTL:   %s\n", r.DedupTTL)
		} else {
			fmt.Fprintf(w, "  dedup TTL:   none (no consumer-side dedup declared: --dedup-ttl)\n")
		}
		fmt.Fprintf(w, "  ordering:    %s\n", r.Ordering)
		fmt.Fprintf(w, "  worst case:  %s for the dedup TTL to cover, less the margin\n", r.WorstCaseSpan)
		printVerdict(w, "publisher", r.Publisher)
		printVerdict(w, "consumer", r.Consumer)
	}
	if len(reps) > 1 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "URL\twindow\tpublisher\tconsumer")
		for _, r := range reps {
			if r.Error != "" {
				fmt.Fprintf(tw, "%s\t-\tcould not check\tcould not check\n", r.URL)
				continue
			}
			win := "none"
			if r.Window.Duration != "" {
				win = r.Window.Duration
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.URL, win, short(r.Publisher), short(r.Consumer))
		}
		tw.Flush()
	}
}

func printVerdict(w io.Writer, side string, v verdict) {
	fmt.Fprintf(w, "  %-11s  %s\n", side+":", short(v))
	if v.Problem != "" {
		fmt.Fprintf(w, "    %s\n", v.Problem)
	}
	for _, f := range v.Fixes {
		fmt.Fprintf(w, "    fix: %s\n", f)
	}
}

func short(v verdict) string {
	switch {
	case !v.OK:
		return "UNSAFE"
	case !v.Checked:
		return "ok (nothing to check)"
	}
	return "ok"
}
