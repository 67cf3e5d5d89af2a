// Package otelbench lists the telemetry settings dedupq's overhead
// benchmarks compare, so that the benchmarks of every consume path (a fake
// driver, the in-memory broker, embedded JetStream) run the same ones. Only
// tests import it.
package otelbench

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

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
//   - sdk-metrics, sdk-tracing: one signal of sdk, the other off;
//   - sdk: the SDK's ManualReader and an always-sampling tracer without
//     exporter;
//   - sdk-export: the same tracer with a synchronous exporter that drops
//     the spans.
//
// The environment variable OTELBENCH_ONLY narrows the list (see only).
func Variants() []Variant {
	mp := func() metric.MeterProvider {
		return sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	}
	vs := []Variant{
		{"off", oteloff.MeterProvider{}, oteloff.TracerProvider{}},
		{"noop", mnoop.NewMeterProvider(), tnoop.NewTracerProvider()},
		{"noop-hidden", hiddenNoop{}, tnoop.NewTracerProvider()},
		{"default", nil, nil},
		{"sdk-metrics", mp(), oteloff.TracerProvider{}},
		{"sdk-tracing", oteloff.MeterProvider{}, sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
		{"sdk", mp(), sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
		{"sdk-export", mp(), sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithSyncer(discardSpans{}))},
	}
	return only(vs, os.Getenv("OTELBENCH_ONLY"))
}

// only keeps the variants named in list (comma-separated), and "off", the
// baseline, always: OTELBENCH_ONLY=sdk runs off and sdk alone, so that a
// CPU profile of a benchmark shows those two and nothing else. An empty
// list keeps them all.
func only(vs []Variant, list string) []Variant {
	if list == "" {
		return vs
	}
	names := strings.Split(list, ",")
	return slices.DeleteFunc(vs, func(v Variant) bool {
		return v.Name != "off" && !slices.Contains(names, v.Name)
	})
}

// Runner drives one consumer under one Variant: run consumes k more
// deliveries and returns how long that took, leaving out its own setup
// (publishing them, say); stop ends the consumer.
type Runner struct {
	Run  func(k int) time.Duration
	Stop func()
}

// Compare measures each variant against "off" on a noisy machine: in each
// of b.N rounds every variant consumes k deliveries, the order rotating
// from round to round, and the round's ratio of each variant's time to
// off's time is noted, so that load that comes and goes weighs on both
// sides of each ratio. It reports, per variant, the median ratio
// (name/off), the median ns and the mean allocations per delivery
// (counted process-wide, so approximate).
func Compare(b *testing.B, k int, start func(b *testing.B, v Variant) Runner) {
	vs := Variants()
	runners := make([]Runner, len(vs))
	// Each variant's goroutines carry the pprof label variant=name, so
	// that a CPU profile of the benchmark splits by variant
	// (go tool pprof -tagfocus=variant=sdk).
	labels := make([]context.Context, len(vs))
	for i, v := range vs {
		labels[i] = pprof.WithLabels(context.Background(), pprof.Labels("variant", v.Name))
		pprof.SetGoroutineLabels(labels[i])
		runners[i] = start(b, v)
		defer runners[i].Stop()
	}
	pprof.SetGoroutineLabels(context.Background())
	for i, r := range runners {
		pprof.SetGoroutineLabels(labels[i])
		r.Run(k) // warm up
	}
	pprof.SetGoroutineLabels(context.Background())
	ns := make([][]float64, len(vs))
	ratios := make([][]float64, len(vs))
	allocs := make([]uint64, len(vs))
	b.ResetTimer()
	for round := range b.N {
		times := make([]time.Duration, len(vs))
		for j := range vs {
			i := (round + j) % len(vs)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			pprof.SetGoroutineLabels(labels[i])
			times[i] = runners[i].Run(k)
			pprof.SetGoroutineLabels(context.Background())
			runtime.ReadMemStats(&after)
			allocs[i] += after.Mallocs - before.Mallocs
		}
		for i := range vs {
			ns[i] = append(ns[i], float64(times[i].Nanoseconds())/float64(k))
			ratios[i] = append(ratios[i], float64(times[i])/float64(times[0]))
		}
	}
	b.StopTimer()
	for i, v := range vs {
		b.ReportMetric(median(ns[i]), v.Name+"-ns/delivery")
		b.ReportMetric(float64(allocs[i])/float64(b.N*k), v.Name+"-allocs/delivery")
		if i > 0 {
			b.ReportMetric(median(ratios[i]), v.Name+"/off")
		}
	}
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs) == 0 {
		return 0
	}
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
