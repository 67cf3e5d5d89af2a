// Tests of the publisher's spans as the OpenTelemetry messaging semantic
// conventions (v1.43.0) lay them out: a send span per Publish, and for
// PublishBatch a create span per message that the send span links to and
// the message's consumer continues. A run on the in-memory broker
// (adapters/mem) read back with an in-memory span recorder. No services.
package dedupq_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
)

// spanAttrs is a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// traced is a mem broker with a publisher to its queue "orders", traced
// by tp, whose spans rec records.
type traced struct {
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	broker *mem.Broker
	pub    *dedupq.Publisher
}

// newTraced makes a traced publisher with opts (its TracerProvider set
// here), closed when t ends.
func newTraced(t *testing.T, opts dedupq.PublisherOptions) traced {
	t.Helper()
	tr := traced{rec: tracetest.NewSpanRecorder(), broker: mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})}
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tr.rec))
	opts.TracerProvider = tr.tp
	var err error
	if tr.pub, err = dedupq.NewPublisher(context.Background(), tr.broker.Topic("orders"), opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.pub.Close(context.Background()) })
	return tr
}

// consumeAll runs a consumer of the mem queue "orders" until n deliveries
// were handled by h, then closes it.
func consumeAll(t *testing.T, broker *mem.Broker, tp trace.TracerProvider, n int, h dedupq.Handler) {
	t.Helper()
	ctx := context.Background()
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- con.Run(runCtx, h) }()
	deadline := time.Now().Add(30 * time.Second)
	for s := con.Stats(); s.Acked+s.Nacked+s.Terminated < uint64(n); s = con.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("deliveries not settled: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPublishBatchSpans(t *testing.T) {
	for _, noCreate := range []bool{false, true} {
		t.Run("NoCreateSpans="+strconv.FormatBool(noCreate), func(t *testing.T) {
			ctx := context.Background()
			tr := newTraced(t, dedupq.PublisherOptions{NoCreateSpans: noCreate})
			rec, tp, broker, pub := tr.rec, tr.tp, tr.broker, tr.pub
			callerCtx, caller := tp.Tracer("test").Start(ctx, "caller")
			ids := []string{"a", "b", "c"}
			var msgs []*dedupq.Message
			for _, id := range ids {
				msgs = append(msgs, &dedupq.Message{ID: id})
			}
			if _, err := pub.PublishBatch(callerCtx, msgs); err != nil {
				t.Fatal(err)
			}
			caller.End()
			consumeAll(t, broker, tp, len(ids), func(context.Context, *dedupq.Delivery) error { return nil })

			var send sdktrace.ReadOnlySpan
			creates, process := map[string]sdktrace.ReadOnlySpan{}, map[string]sdktrace.ReadOnlySpan{}
			for _, s := range rec.Ended() {
				a := spanAttrs(s)
				switch s.Name() {
				case "send orders":
					send = s
				case "create orders":
					creates[a["messaging.message.id"].AsString()] = s
				case "process orders":
					process[a["messaging.message.id"].AsString()] = s
				}
			}
			if send == nil || len(process) != len(ids) {
				t.Fatalf("a send span and %d process spans wanted; recorded %v", len(ids), rec.Ended())
			}
			a := spanAttrs(send)
			if a["messaging.operation.type"].AsString() != "send" || a["messaging.operation.name"].AsString() != "send" ||
				a["messaging.destination.name"].AsString() != "orders" || a["messaging.system"].AsString() != "mem" ||
				a["messaging.batch.message_count"].AsInt64() != int64(len(ids)) {
				t.Errorf("send span attributes %v", send.Attributes())
			}
			if send.Parent().SpanID() != caller.SpanContext().SpanID() {
				t.Errorf("send span's parent %v, want the caller's span", send.Parent().SpanID())
			}
			if noCreate {
				if len(creates) != 0 || send.SpanKind() != trace.SpanKindProducer || len(send.Links()) != 0 {
					t.Errorf("NoCreateSpans: %d create spans, send span of kind %v with %d links; want none, producer, none",
						len(creates), send.SpanKind(), len(send.Links()))
				}
				for id, p := range process {
					if p.Parent().SpanID() != send.SpanContext().SpanID() {
						t.Errorf("process span of %s: parent %v, want the send span", id, p.Parent().SpanID())
					}
				}
				return
			}
			if send.SpanKind() != trace.SpanKindClient {
				t.Errorf("send span of kind %v, want client: the create spans are the producers", send.SpanKind())
			}
			links := map[trace.SpanID]bool{}
			for _, l := range send.Links() {
				links[l.SpanContext.SpanID()] = true
			}
			for _, id := range ids {
				c := creates[id]
				if c == nil {
					t.Errorf("no create span of %s", id)
					continue
				}
				a := spanAttrs(c)
				if c.SpanKind() != trace.SpanKindProducer || a["messaging.operation.type"].AsString() != "create" ||
					a["messaging.operation.name"].AsString() != "create" || a["messaging.destination.name"].AsString() != "orders" {
					t.Errorf("create span of %s: kind %v, attributes %v", id, c.SpanKind(), c.Attributes())
				}
				if c.Parent().SpanID() != caller.SpanContext().SpanID() {
					t.Errorf("create span of %s: parent %v, want the caller's span", id, c.Parent().SpanID())
				}
				if !links[c.SpanContext().SpanID()] {
					t.Errorf("the send span does not link to the create span of %s", id)
				}
				if p := process[id]; p.Parent().SpanID() != c.SpanContext().SpanID() {
					t.Errorf("process span of %s: parent %v, want its create span %v", id, p.Parent().SpanID(), c.SpanContext().SpanID())
				}
			}
		})
	}
}

// A batch refused before anything is sent: the messages that got a create
// span end it failed, with error.type, as does the send span.
func TestPublishBatchSpansOfARefusedBatch(t *testing.T) {
	ctx := context.Background()
	tr := newTraced(t, dedupq.PublisherOptions{})
	rec, pub := tr.rec, tr.pub
	_, err := pub.PublishBatch(ctx, []*dedupq.Message{{ID: "a"}, {ID: "b", Attributes: map[string]string{"dedupq-x": "reserved"}}})
	if err == nil {
		t.Fatal("a batch with a reserved attribute name was published")
	}
	var creates, sends int
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "create orders":
			creates++
			if id := spanAttrs(s)["messaging.message.id"].AsString(); id != "a" {
				t.Errorf("a create span of %s, which was refused before its span", id)
			}
		case "send orders":
			sends++
		default:
			continue
		}
		if s.Status().Code != codes.Error || spanAttrs(s)["error.type"].AsString() == "" {
			t.Errorf("%s: status %v, attributes %v; want an error with error.type", s.Name(), s.Status(), s.Attributes())
		}
	}
	if creates != 1 || sends != 1 {
		t.Errorf("%d create and %d send spans, want 1 and 1", creates, sends)
	}
}

// Publish sends one message: its send span is the producer and the
// message's creation context, with the message's ID and no batch size
// (the conventions keep messaging.batch.message_count for batch calls).
// A handler's failure marks its process span with error.type.
func TestPublishSpanAndFailedProcessSpan(t *testing.T) {
	ctx := context.Background()
	tr := newTraced(t, dedupq.PublisherOptions{})
	rec, tp, broker, pub := tr.rec, tr.tp, tr.broker, tr.pub
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	consumeAll(t, broker, tp, 1, func(context.Context, *dedupq.Delivery) error {
		return dedupq.Permanent(errors.New("bad order"))
	})
	var send, process sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "send orders":
			send = s
		case "process orders":
			process = s
		}
	}
	if send == nil || process == nil {
		t.Fatalf("spans: %v", rec.Ended())
	}
	a := spanAttrs(send)
	if _, batch := a["messaging.batch.message_count"]; batch || send.SpanKind() != trace.SpanKindProducer ||
		a["messaging.message.id"].AsString() != "a" || a["messaging.destination.name"].AsString() != "orders" {
		t.Errorf("send span: kind %v, attributes %v", send.SpanKind(), send.Attributes())
	}
	if process.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span's parent %v, want the send span", process.Parent().SpanID())
	}
	if process.Status().Code != codes.Error || spanAttrs(process)["error.type"].AsString() == "" {
		t.Errorf("failed process span: status %v, attributes %v; want an error with error.type", process.Status(), process.Attributes())
	}
}
