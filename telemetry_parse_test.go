// Tests of the consumer's own reading of the W3C trace context, against
// the OpenTelemetry propagator it stands in for. No services.
package dedupq

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tnoop "go.opentelemetry.io/otel/trace/noop"
)

// withRemoteParent reads every traceparent and tracestate as
// propagation.TraceContext's Extract does, and its context hands the span
// context to tracers (the SDK's as parent, the no-op one as is) and
// nothing else to other keys.
func TestWithRemoteParentAsExtract(t *testing.T) {
	const (
		tid = "0af7651916cd43dd8448eb211c80319c"
		sid = "b7ad6b7169203331"
	)
	parents := []string{
		"00-" + tid + "-" + sid + "-01",
		"00-" + tid + "-" + sid + "-00",
		"00-" + tid + "-" + sid + "-02",
		"00-" + tid + "-" + sid + "-03",
		"00-" + tid + "-" + sid + "-04", // reserved flag in version 0
		"00-" + tid + "-" + sid + "-01-extra",
		"01-" + tid + "-" + sid + "-01-extra",
		"01-" + tid + "-" + sid + "-ff",
		"fe-" + tid + "-" + sid + "-01",
		"ff-" + tid + "-" + sid + "-01",
		"00-0AF7651916CD43DD8448EB211C80319C-" + sid + "-01", // upper case
		"00-00000000000000000000000000000000-" + sid + "-01",
		"00-" + tid + "-0000000000000000-01",
		"00-" + tid + "-" + sid,
		"00-" + tid + "-" + sid + "-1",
		"00-" + tid[1:] + "-" + sid + "-01",
		"00-" + tid + "-" + sid + "-0g",
		"0-" + tid + "-" + sid + "-01",
		"00_" + tid + "_" + sid + "_01",
		"",
		"-",
		"garbage",
	}
	states := []string{"", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", "not a tracestate=,,="}
	ctx := context.WithValue(context.Background(), struct{}{}, "other")
	for _, tp := range parents {
		for _, ts := range states {
			carrier := propagation.MapCarrier{"traceparent": tp, "tracestate": ts}
			want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(ctx, carrier))
			got := withRemoteParent(ctx, tp, ts)
			if sc := trace.SpanContextFromContext(got); !sc.Equal(want) || sc.IsRemote() != want.IsRemote() {
				t.Errorf("traceparent %q, tracestate %q: span context %+v, want %+v", tp, ts, sc, want)
			}
			if got.Value(struct{}{}) != "other" {
				t.Errorf("traceparent %q: the context lost its parent's values", tp)
			}
			if !want.IsValid() {
				continue
			}
			_, span := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())).Tracer("t").Start(got, "child")
			if p := span.(sdktrace.ReadOnlySpan).Parent(); !p.Equal(want) {
				t.Errorf("traceparent %q: the SDK's span has parent %+v, want %+v", tp, p, want)
			}
			if _, span := tnoop.NewTracerProvider().Tracer("t").Start(got, "child"); !span.SpanContext().Equal(want) {
				t.Errorf("traceparent %q: the no-op tracer's span has %+v, want %+v", tp, span.SpanContext(), want)
			}
		}
	}
}

// The context withRemoteParent makes cancels with its parent.
func TestWithRemoteParentCancels(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	ctx, stop := context.WithCancel(withRemoteParent(parent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", ""))
	defer stop()
	cancel()
	<-ctx.Done()
}
