package adaptertest

import (
	"maps"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// testTraceContext: the W3C trace context crosses the broker in the
// message's attributes, so the consumer's span for a delivery has the
// publisher's span as its parent and the handler's span is the consumer
// span's child; the handler sees only the user's attributes.
func testTraceContext(t *testing.T, s *suite) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := s.newTracedEnv(t, DefaultConfig(), 1, tp)
	m := e.msg("trace")
	m.Attributes = map[string]string{"color": "blue"}
	e.publish(m)
	ds := e.consume("the traced message", ack, has(m.ID))
	if got := deliveredOf(ds, m.ID)[0].Message.Attributes; !maps.Equal(got, m.Attributes) {
		t.Errorf("handler saw attributes %v, want %v: the trace context must not reach it", got, m.Attributes)
	}
	// The consumer is stopped, so every span of the delivery has ended.
	var send, process, handler sdktrace.ReadOnlySpan
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
	for _, sp := range rec.Ended() {
		if sp.Name() == "dedupq.handler" && sp.Parent().SpanID() == process.SpanContext().SpanID() {
			handler = sp
		}
	}
	if process.Parent().TraceID() != send.SpanContext().TraceID() || process.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span's parent = %s/%s, want the send span %s/%s", process.Parent().TraceID(), process.Parent().SpanID(),
			send.SpanContext().TraceID(), send.SpanContext().SpanID())
	}
	if handler == nil {
		t.Error("no dedupq.handler span is a child of the process span")
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
