// Package otelbench lists the telemetry settings dedupq's overhead
// benchmarks compare, so that the benchmarks of every consume path (a fake
// driver, the in-memory broker, embedded JetStream) run the same ones. Only
// tests import it.
package otelbench

import (
	"context"

	"go.opentelemetry.io/otel/metric"
	mnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dedupq/dedupq/internal/oteloff"
)

// Variant is one provider setting the overhead benchmarks
// compare; nil providers mean the globals.
type Variant struct {
	Name string
	MP   metric.MeterProvider
	TP   trace.TracerProvider
}

// hiddenNoop is the API's no-op meter provider under another type, so
// that dedupq does not recognise it and calls its instruments: the cost
// of a provider that records nothing but is not the API's no-op one.
type hiddenNoop struct{ mnoop.MeterProvider }

// discardSpans is a span exporter that drops what it is given: the SDK's
// export path without an exporter's own cost.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// Variants lists the settings the overhead benchmarks run, "off"
// (no telemetry at all) first, as the baseline of the others:
//
//   - noop: the API's no-op providers (dedupq skips the meter; the tracer
//     still hands the publisher's span context to the handler);
//   - noop-hidden: the same meter under a type dedupq does not recognise;
//   - default: the globals, no SDK installed;
//   - sdk: the SDK's ManualReader and an always-sampling tracer without
//     exporter;
//   - sdk-export: the same tracer with a synchronous exporter that drops
//     the spans.
func Variants() []Variant {
	mp := func() metric.MeterProvider {
		return sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	}
	return []Variant{
		{"off", oteloff.MeterProvider{}, oteloff.TracerProvider{}},
		{"noop", mnoop.NewMeterProvider(), tnoop.NewTracerProvider()},
		{"noop-hidden", hiddenNoop{}, tnoop.NewTracerProvider()},
		{"default", nil, nil},
		{"sdk", mp(), sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
		{"sdk-export", mp(), sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithSyncer(discardSpans{}))},
	}
}
