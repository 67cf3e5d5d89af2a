// Tests of the attributes of the consumer's process spans: a run on the
// in-memory broker (adapters/mem) read back with an in-memory span
// recorder. No services.
package dedupq_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tnoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
)

// Each process span carries, from its start (where a sampler sees them),
// the messaging attributes of its own delivery, also when deliveries run
// concurrently (the consumer reuses the start options of its spans).
func TestProcessSpanAttributes(t *testing.T) {
	ctx := context.Background()
	const n = 64
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	for i := range n {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	rec := tracetest.NewSpanRecorder()
	sampled := make(chan map[attribute.Key]attribute.Value, 2*n) // process and handler spans
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
		sdktrace.WithSampler(recordingSampler{sampled}))
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{Concurrency: 8, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	var handled atomic.Int64
	err = con.Run(runCtx, func(context.Context, *dedupq.Delivery) error {
		if handled.Add(1) == n {
			stop()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.Name() != "process q" {
			continue
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		id := attrs["messaging.message.id"].AsString()
		if seen[id] {
			t.Errorf("two process spans of message %q", id)
		}
		seen[id] = true
		if s.SpanKind() != trace.SpanKindConsumer || len(attrs) != 6 || attrs["messaging.system"].AsString() != "mem" ||
			attrs["messaging.destination.name"].AsString() != "q" || attrs["messaging.operation.name"].AsString() != "process" ||
			attrs["messaging.operation.type"].AsString() != "process" || attrs["messaging.delivery.attempt"].AsInt64() != 1 {
			t.Errorf("process span of %q: kind %v, attributes %v", id, s.SpanKind(), s.Attributes())
		}
	}
	if len(seen) != n {
		t.Errorf("process spans of %d messages, want %d", len(seen), n)
	}
	close(sampled)
	starts := 0
	for attrs := range sampled {
		if _, ok := attrs["messaging.operation.type"]; !ok {
			continue // the handler's span
		}
		starts++
		if _, ok := attrs["messaging.message.id"]; !ok || len(attrs) != 6 {
			t.Errorf("the sampler saw %v at a process span's start, want its 6 attributes", attrs)
		}
	}
	if starts != n {
		t.Errorf("the sampler saw %d process spans, want %d", starts, n)
	}
}

// recordingSampler samples every span and sends the attributes each one
// started with.
type recordingSampler struct {
	starts chan map[attribute.Key]attribute.Value
}

func (s recordingSampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range p.Attributes {
		attrs[kv.Key] = kv.Value
	}
	s.starts <- attrs
	return sdktrace.SamplingResult{Decision: sdktrace.RecordAndSample,
		Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
}

func (recordingSampler) Description() string { return "recordingSampler" }

// The publisher's tracestate reaches the handler's context with its
// traceparent, under the SDK and under the API's no-op tracer, and
// neither reaches the handler's attributes; a tracestate without a
// traceparent is removed and not extracted.
func TestTraceStateReachesTheHandler(t *testing.T) {
	ctx := context.Background()
	state, err := trace.ParseTraceState("vendor=v1")
	if err != nil {
		t.Fatal(err)
	}
	caller := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1},
		TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true})
	pctx := trace.ContextWithRemoteSpanContext(ctx, caller)
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"sdk", sdktrace.NewTracerProvider()},
		{"noop", tnoop.NewTracerProvider()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
			pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{TracerProvider: sdktrace.NewTracerProvider()})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(ctx)
			if _, err := pub.Publish(pctx, &dedupq.Message{ID: "traced", Attributes: map[string]string{"k": "v"}}); err != nil {
				t.Fatal(err)
			}
			// A tracestate alone, as a broker may hand back a message whose
			// traceparent was lost.
			if _, err := broker.Topic("q").SendBatch(ctx, []*driver.Message{{ID: "state-only",
				Attributes: map[string]string{driver.AttrTraceState: "vendor=v2"}}}); err != nil {
				t.Fatal(err)
			}
			con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{TracerProvider: tc.tp})
			if err != nil {
				t.Fatal(err)
			}
			defer con.Close(ctx)
			type seen struct {
				attrs map[string]string
				sc    trace.SpanContext
			}
			got := map[string]seen{}
			runCtx, stop := context.WithCancel(ctx)
			err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
				got[d.Message.ID] = seen{d.Message.Attributes, trace.SpanContextFromContext(ctx)}
				if len(got) == 2 {
					stop()
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			traced := got["traced"]
			if traced.sc.TraceID() != caller.TraceID() || traced.sc.TraceState().Get("vendor") != "v1" {
				t.Errorf("the handler's span context is %v (tracestate %q), want trace %v with tracestate vendor=v1",
					traced.sc, traced.sc.TraceState(), caller.TraceID())
			}
			if len(traced.attrs) != 1 || traced.attrs["k"] != "v" {
				t.Errorf("the handler saw attributes %v, want only k=v", traced.attrs)
			}
			alone := got["state-only"]
			if alone.attrs != nil {
				t.Errorf("the handler saw attributes %v for a tracestate alone, want none", alone.attrs)
			}
			if alone.sc.TraceID() == caller.TraceID() || alone.sc.TraceState().Len() != 0 {
				t.Errorf("a tracestate alone gave the handler the span context %v (tracestate %q)", alone.sc, alone.sc.TraceState())
			}
		})
	}
}

// By default a delivery has one span: the process span, which is the
// handler's parent context, so that the handler's own spans and logs join
// the message's trace; HandlerSpan adds a span of the handler alone.
func TestOneSpanPerDeliveryByDefault(t *testing.T) {
	for _, handlerSpan := range []bool{false, true} {
		t.Run("HandlerSpan="+strconv.FormatBool(handlerSpan), func(t *testing.T) {
			ctx := context.Background()
			tr := newTraced(t, dedupq.PublisherOptions{})
			if _, err := tr.pub.Publish(ctx, &dedupq.Message{ID: "a"}); err != nil {
				t.Fatal(err)
			}
			con, err := dedupq.NewConsumer(ctx, tr.broker.Subscription("orders"), dedupq.ConsumerOptions{TracerProvider: tr.tp, HandlerSpan: handlerSpan})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			seen := make(chan trace.SpanContext, 1)
			done := make(chan error, 1)
			go func() {
				done <- con.Run(runCtx, func(ctx context.Context, _ *dedupq.Delivery) error {
					seen <- trace.SpanContextFromContext(ctx)
					return nil
				})
			}()
			var inHandler trace.SpanContext
			select {
			case inHandler = <-seen:
			case <-time.After(30 * time.Second):
				t.Fatal("no delivery")
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			_ = con.Close(ctx)
			var process, handler sdktrace.ReadOnlySpan
			for _, s := range tr.rec.Ended() {
				switch s.Name() {
				case "process orders":
					process = s
				case "dedupq.handler":
					handler = s
				}
			}
			if process == nil {
				t.Fatalf("no process span in %v", tr.rec.Ended())
			}
			want := process.SpanContext().SpanID()
			if handlerSpan {
				if handler == nil || handler.Parent().SpanID() != want {
					t.Fatalf("HandlerSpan: handler span %v, want a child of the process span", handler)
				}
				want = handler.SpanContext().SpanID()
			} else if handler != nil {
				t.Fatalf("a handler span by default: %v", handler.Name())
			}
			if inHandler.SpanID() != want {
				t.Errorf("the handler's context carries span %s, want %s", inHandler.SpanID(), want)
			}
		})
	}
}
