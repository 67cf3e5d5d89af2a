package dedupq

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dedupq/dedupq/window"
)

// InspectOptions are the publisher and consumer that Inspect checks a
// backend for, as a deployment would run them.
type InspectOptions struct {
	// Publisher is the publishers' configuration; its Retry, its
	// ConsumerDedupTTL and its Margin are what the publisher check reads.
	Publisher PublisherOptions
	// Consumer is the consumers' configuration; its PublisherSpan and its
	// Margin are what the consumer check reads.
	Consumer ConsumerOptions
	// DedupTTL is how long the consumers' dedup store remembers a key (the
	// TTL of ConsumerOptions.Dedup). Zero means no consumer-side dedup:
	// the consumer check has nothing to check.
	DedupTTL time.Duration
}

// Inspection is what Inspect read from a backend and what the two startup
// checks said about it.
type Inspection struct {
	// URL is the URL as RedactURL shows it.
	URL string
	// Window is the publish-side window as the topic reports it.
	Window window.Window
	// Retry is the retry policy the publisher would run (defaults filled).
	Retry window.RetryPolicy
	// HiddenRetrySpan is what the backend's SDK may add to the retry span.
	HiddenRetrySpan time.Duration
	// Publisher is NewPublisher's startup check's verdict: nil when it
	// passes, else usually a *window.UnsafeRetryError.
	Publisher error
	// ConsumerWindow is the window as the subscription reports it.
	ConsumerWindow window.Window
	// Redelivery is the broker's redelivery policy for the subscription.
	Redelivery window.RedeliveryPolicy
	// Ordering is nil when the subscription keeps the order of a group
	// key (an Ordered consumer may run on it, and for one the consumer
	// check counts the head-of-line wait of package window's "Ordered
	// groups"), else why not: what NewConsumer with ConsumerOptions.Ordered would
	// refuse with (matching ErrOrderingUnsupported).
	Ordering error
	// Consumer is NewConsumer's window check's verdict (the dedup store
	// itself is not contacted): nil when it passes.
	Consumer error
	// WorstCaseSpan is the span the consumer check asks the dedup TTL to
	// cover, less the margin (window.ConsumerPlan.Span).
	WorstCaseSpan time.Duration
}

// Inspect opens the backend named by rawURL as a topic and as a
// subscription, reads the window and the redelivery policy, and runs the
// checks NewPublisher and NewConsumer run at startup, without creating
// anything on the broker: it never calls driver.Provisioner.Provision, so
// a URL that asks for a stream or queue to be created is checked against
// what would be created. The error is non-nil only when the backend could
// not be opened or read; a failing check is reported in the Inspection.
// Neither the error nor the Inspection shows anything of the URL that
// RedactURL hides, even where the driver's own text quoted it.
func (m *URLMux) Inspect(ctx context.Context, rawURL string, opts InspectOptions) (_ *Inspection, err error) {
	o, u, err := m.opener(rawURL)
	if err != nil {
		return nil, err
	}
	// The driver's texts may quote what the URL hides: its errors, and the
	// scope of a window, which names what the URL named.
	s := newScrubber(u)
	defer func() { err = s.err(err) }()
	in := &Inspection{URL: RedactURL(u), Retry: opts.Publisher.retryPolicy()}
	topic, err := o.OpenTopic(ctx, u)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, topic.Close()) }()
	if in.Window, err = topic.Window(ctx); err != nil {
		return nil, fmt.Errorf("dedupq: reading the dedup window: %w", err)
	}
	in.Window.Scope = s.text(in.Window.Scope)
	in.HiddenRetrySpan = topic.HiddenRetrySpan()
	in.Publisher = window.CheckPublisher(opts.Publisher.plan(in.Retry, topic, in.Window))

	sub, err := o.OpenSubscription(ctx, u)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, sub.Close()) }()
	if in.ConsumerWindow, err = sub.Window(ctx); err != nil {
		return nil, fmt.Errorf("dedupq: reading the dedup window: %w", err)
	}
	in.ConsumerWindow.Scope = s.text(in.ConsumerWindow.Scope)
	if in.Redelivery, err = sub.Redelivery(ctx); err != nil {
		return nil, fmt.Errorf("dedupq: reading the redelivery policy: %w", err)
	}
	orders, oerr := ordersGroups(ctx, sub)
	in.Ordering = s.err(oerr)
	plan := opts.Consumer.plan(opts.DedupTTL, in.ConsumerWindow, in.Redelivery, orders && opts.Consumer.Ordered)
	in.Consumer = window.CheckConsumer(plan)
	in.WorstCaseSpan = plan.Span()
	return in, nil
}

// Inspect is URLMux.Inspect on the default mux.
func Inspect(ctx context.Context, rawURL string, opts InspectOptions) (*Inspection, error) {
	return defaultMux.Inspect(ctx, rawURL, opts)
}
