package adaptertest

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupq/dedupq"
)

// testTraceContext: the W3C trace context crosses the broker in the
// message's attributes, so the consumer's span for a delivery has the
// publisher's span as its parent and is the handler's context (no span of
// the handler alone, by default); the handler sees only the user's
// attributes.
func testTraceContext(t *testing.T, s *suite) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := s.newTracedEnv(t, DefaultConfig(), 1, tp)
	m := e.msg("trace")
	m.Attributes = map[string]string{"color": "blue"}
	e.publish(m)
	var mu sync.Mutex
	var inHandler trace.SpanContext
	ds := e.consume("the traced message", func(ctx context.Context, d *dedupq.Delivery) error {
		if d.Message.ID == m.ID {
			mu.Lock()
			inHandler = trace.SpanContextFromContext(ctx)
			mu.Unlock()
		}
		return nil
	}, has(m.ID))
	if got := deliveredOf(ds, m.ID)[0].Message.Attributes; !maps.Equal(got, m.Attributes) {
		t.Errorf("handler saw attributes %v, want %v: the trace context must not reach it", got, m.Attributes)
	}
	// The consumer is stopped, so every span of the delivery has ended.
	var send, process sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		switch {
		case strings.HasPrefix(sp.Name(), "send "):
			send = sp
		case strings.HasPrefix(sp.Name(), "process ") && hasAttr(sp.Attributes(), "messaging.message.id", m.ID):
			process = sp
		}
	}
	if send == nil || process == nil {
		t.Fatalf("want a send span and a process span for %s; recorded %d spans", m.ID, len(rec.Ended()))
	}
	// The driver names its destination (driver.DestinationNamer), the same
	// on both ends, for the spans' messaging.destination.name.
	if d := attrOf(send.Attributes(), "messaging.destination.name"); d == "" || d != attrOf(process.Attributes(), "messaging.destination.name") {
		t.Errorf("messaging.destination.name: send span %q, process span %q; want the same destination on both",
			d, attrOf(process.Attributes(), "messaging.destination.name"))
	}
	for _, sp := range rec.Ended() {
		if sp.Name() == "dedupq.handler" {
			t.Errorf("a dedupq.handler span by default (ConsumerOptions.HandlerSpan is off)")
		}
	}
	if process.Parent().TraceID() != send.SpanContext().TraceID() || process.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span's parent = %s/%s, want the send span %s/%s", process.Parent().TraceID(), process.Parent().SpanID(),
			send.SpanContext().TraceID(), send.SpanContext().SpanID())
	}
	mu.Lock()
	defer mu.Unlock()
	if inHandler.SpanID() != process.SpanContext().SpanID() {
		t.Errorf("the handler's context carries span %s, want the process span %s", inHandler.SpanID(), process.SpanContext().SpanID())
	}
}

func hasAttr(kvs []attribute.KeyValue, key, value string) bool {
	for _, kv := range kvs {
		if string(kv.Key) == key && kv.Value.AsString() == value {
			return true
		}
	}
	return false
}

func attrOf(kvs []attribute.KeyValue, key string) string {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value.AsString()
		}
	}
	return ""
}
