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

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
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
		if s.Name() != "process mem" {
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
		if s.SpanKind() != trace.SpanKindConsumer || len(attrs) != 4 || attrs["messaging.system"].AsString() != "mem" ||
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
		if _, ok := attrs["messaging.message.id"]; !ok || len(attrs) != 4 {
			t.Errorf("the sampler saw %v at a process span's start, want its 4 attributes", attrs)
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
