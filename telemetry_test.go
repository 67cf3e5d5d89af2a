// Tests of dedupq's OpenTelemetry metrics and trace propagation: scripted
// runs on the in-memory broker (adapters/mem) read back with the SDK's
// ManualReader and an in-memory span recorder. No services.
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/otelbench"
	"github.com/dedupq/dedupq/internal/oteloff"
	"github.com/dedupq/dedupq/internal/testutil"
	"github.com/dedupq/dedupq/window"
)

// metricsOf collects rm once and indexes every data point by instrument
// name and its attributes' "k=v,…" encoding: sums and histogram counts.
func metricsOf(t *testing.T, r *sdkmetric.ManualReader) map[string]map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	put := func(name string, set attribute.Set, v float64) {
		if out[name] == nil {
			out[name] = map[string]float64{}
		}
		out[name][set.Encoded(attribute.DefaultEncoder())] += v
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, float64(p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, float64(p.Count))
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, float64(p.Count))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, p.Value)
				}
			}
		}
	}
	return out
}

// flakyTopic fails the first sends with a retryable error.
type flakyTopic struct {
	driver.Topic
	mu    sync.Mutex
	fails int
}

var errFlaky = errors.New("flaky: try again")

func (f *flakyTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	f.mu.Lock()
	fail := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if fail {
		return nil, errFlaky
	}
	return f.Topic.SendBatch(ctx, msgs)
}

func (f *flakyTopic) IsRetryable(err error) bool { return errors.Is(err, errFlaky) }

func TestMetricsScriptedRun(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	// No dedup window: a resent ID is stored again, so the consumer-side
	// guard is what suppresses it.
	broker := mem.NewBroker(mem.Options{AckWait: 10 * time.Second, MaxDeliveries: 5})

	topic := &flakyTopic{Topic: broker.Topic("orders"), fails: 2}
	pub, err := dedupq.NewPublisher(ctx, topic, dedupq.PublisherOptions{
		Retry:            &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond},
		ConsumerDedupTTL: time.Hour, MeterProvider: mp,
	})
	if err != nil {
		t.Fatal(err)
	}
	// The first publish takes three attempts (two retryable failures).
	for _, m := range []struct{ id, body string }{{"a", "a"}, {"a", "a"}, {"b", "b"}, {"d", "d"}, {"e", "e"}} {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: m.id, Body: []byte(m.body)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "r", Attributes: map[string]string{"dedupq-traceparent": "x"}}); err == nil {
		t.Fatal("a user attribute under the reserved prefix was accepted")
	}

	store := memstore.New(nil)
	// "d" is held by another consumer: deferred. "e" was completed with
	// another payload: a fingerprint conflict.
	if _, err := store.Claim(ctx, "d", dedup.BodyFingerprint(&dedupq.Message{Body: []byte("d")}), time.Hour); err != nil {
		t.Fatal(err)
	}
	c, err := store.Claim(ctx, "e", "another payload", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, "e", c.Token, time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: 2 * time.Hour, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{
		Dedup: guard, PublisherSpan: pub.RetryPolicy().Span(), MeterProvider: mp,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			if d.Message.ID == "b" {
				return dedupq.Permanent(errors.New("bad order"))
			}
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for s := con.Stats(); s.Acked+s.Nacked+s.Terminated < 5; s = con.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("deliveries not settled: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	got := metricsOf(t, reader)
	// The consumer's driver names its queue; the publisher's (flakyTopic,
	// which hides the mem topic's methods) does not.
	const mem, orders = "messaging.system=mem", "messaging.destination.name=orders,messaging.system=mem"
	want := []struct {
		name, attrs string
		v           float64
	}{
		{"dedupq.publish.messages", "dedupq.outcome=stored," + mem, 5},
		{"dedupq.publish.messages", "dedupq.outcome=refused," + mem, 1},
		{"dedupq.publish.attempts", mem, 7},
		{"dedupq.publish.retry_delay", mem, 2},
		{"dedupq.consume.deliveries", "dedupq.outcome=ack," + orders, 2},
		{"dedupq.consume.deliveries", "dedupq.outcome=nack," + orders, 1},
		{"dedupq.consume.deliveries", "dedupq.outcome=terminate," + orders, 2},
		{"dedupq.consume.delivery_attempt", orders, 5},
		{"dedupq.handler.duration", orders, 2},
		{"dedupq.dedup.decisions", "dedupq.outcome=ran,dedupq.store=memstore", 1},
		{"dedupq.dedup.decisions", "dedupq.outcome=suppressed_duplicate,dedupq.store=memstore", 1},
		{"dedupq.dedup.decisions", "dedupq.outcome=failed,dedupq.store=memstore", 1},
		{"dedupq.dedup.decisions", "dedupq.outcome=deferred_in_progress,dedupq.store=memstore", 1},
		{"dedupq.dedup.decisions", "dedupq.outcome=fingerprint_conflict,dedupq.store=memstore", 1},
		{"dedupq.store.duration", "dedupq.store=memstore,dedupq.store.op=claim", 5},
		{"dedupq.store.duration", "dedupq.store=memstore,dedupq.store.op=complete", 1},
		{"dedupq.store.duration", "dedupq.store=memstore,dedupq.store.op=release", 1},
		{"dedupq.window", "dedupq.role=publisher," + mem, 0},
		{"dedupq.worst_case_span", "dedupq.role=publisher," + mem, pub.RetryPolicy().Span().Seconds()},
		// What the startup check asked the TTL to cover: the broker has no
		// window, so the publishers' whole span comes on top of the
		// redelivery span.
		{"dedupq.worst_case_span", "dedupq.role=consumer," + orders, (con.Redelivery().Span() + pub.RetryPolicy().Span()).Seconds()},
		{"dedupq.dedup.ttl", "dedupq.role=consumer," + orders, guard.TTL().Seconds()},
		// The TTL less the default 20% margin, less that span.
		{"dedupq.dedup.headroom", "dedupq.role=consumer," + orders, (time.Duration(float64(guard.TTL())*(1-window.DefaultMargin)) - con.Redelivery().Span() - pub.RetryPolicy().Span()).Seconds()},
	}
	for _, w := range want {
		v, ok := got[w.name][w.attrs]
		if !ok || v != w.v {
			t.Errorf("%s{%s} = %v (present %v), want %v; all points: %v", w.name, w.attrs, v, ok, w.v, got[w.name])
		}
	}
	if s := pub.Stats(); s != (dedupq.PublisherStats{Stored: 5, Refused: 1, Attempts: 7}) {
		t.Errorf("Publisher.Stats = %+v", s)
	}
	if s := con.Stats(); s.Received != 5 || s.Acked != 2 || s.Nacked != 1 || s.Terminated != 2 {
		t.Errorf("Consumer.Stats = %+v", s)
	}
	if err := con.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Closed publishers and consumers leave the gauges.
	if g := metricsOf(t, reader)["dedupq.window"]; len(g) != 0 {
		t.Errorf("dedupq.window after Close: %v", g)
	}
}

// The consumer's span is a child of the publisher's, across the broker,
// and the handler's span a child of the consumer's; the handler does not
// see the trace attributes.
func TestTracePropagatesThroughMem(t *testing.T) {
	ctx := context.Background()
	tr := newTraced(t, dedupq.PublisherOptions{})
	if _, err := tr.pub.Publish(ctx, &dedupq.Message{ID: "a", Attributes: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(ctx, tr.broker.Subscription("orders"), dedupq.ConsumerOptions{TracerProvider: tr.tp, HandlerSpan: true})
	if err != nil {
		t.Fatal(err)
	}
	assertTraceCrosses(t, ctx, con, tr.rec)
}

// assertTraceCrosses runs con until one delivery is handled and checks
// the spans rec recorded: send ← process ← dedupq.handler.
func assertTraceCrosses(t *testing.T, ctx context.Context, con *dedupq.Consumer, rec *tracetest.SpanRecorder) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	attrs := make(chan map[string]string, 1)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			select {
			case attrs <- d.Message.Attributes:
			default:
			}
			return nil
		})
	}()
	var got map[string]string
	select {
	case got = <-attrs:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = con.Close(ctx)
	if len(got) != 1 || got["k"] != "v" {
		t.Errorf("handler saw attributes %v, want only k=v", got)
	}
	var send, process, handler sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case strings.HasPrefix(s.Name(), "send "):
			send = s
		case strings.HasPrefix(s.Name(), "process "):
			process = s
		case s.Name() == "dedupq.handler":
			handler = s
		}
	}
	if send == nil || process == nil || handler == nil {
		t.Fatalf("spans: %v", rec.Ended())
	}
	if process.Parent().SpanID() != send.SpanContext().SpanID() || process.SpanContext().TraceID() != send.SpanContext().TraceID() {
		t.Errorf("process span's parent = %v, want the send span %v", process.Parent().SpanID(), send.SpanContext().SpanID())
	}
	if handler.Parent().SpanID() != process.SpanContext().SpanID() {
		t.Errorf("handler span's parent = %v, want the process span %v", handler.Parent().SpanID(), process.SpanContext().SpanID())
	}
}

// The trace context's attributes count toward the backend's limits: with
// tracing on, a message at the attribute limit no longer fits.
func TestTraceAttributesCountTowardLimits(t *testing.T) {
	ctx := context.Background()
	lim := mem.DefaultLimits()
	lim.MaxAttributes = 1
	tp := sdktrace.NewTracerProvider()
	for _, tc := range []struct {
		name    string
		opts    dedupq.PublisherOptions
		refused bool
	}{
		{"tracing off", dedupq.PublisherOptions{}, false},
		{"tracing on", dedupq.PublisherOptions{TracerProvider: tp}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broker := mem.NewBroker(mem.Options{Limits: lim, DedupWindow: 5 * time.Minute})
			pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(ctx)
			_, err = pub.Publish(ctx, &dedupq.Message{ID: "a", Attributes: map[string]string{"k": "v"}})
			var ve *dedupq.ValidationError
			if got := errors.As(err, &ve); got != tc.refused {
				t.Fatalf("refused = %v (%v), want %v", got, err, tc.refused)
			}
		})
	}
}

// Under every telemetry setting the benchmarks compare, the handler sees
// the user's attributes without the trace context's, and its context
// carries the publisher's span context unless tracing is off: with the
// API's no-op tracer too, so that a handler that publishes continues the
// trace.
func TestTraceContextUnderEachSetting(t *testing.T) {
	ctx := context.Background()
	tp := sdktrace.NewTracerProvider()
	for _, v := range otelbench.Variants() {
		t.Run(v.Name, func(t *testing.T) {
			broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
			pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(ctx)
			pctx, span := tp.Tracer("test").Start(ctx, "caller")
			defer span.End()
			for _, attrs := range []map[string]string{{"k": "v"}, nil} {
				if _, err := pub.Publish(pctx, &dedupq.Message{ID: fmt.Sprint(len(attrs)), Attributes: attrs}); err != nil {
					t.Fatal(err)
				}
			}
			con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{MeterProvider: v.MP, TracerProvider: v.TP})
			if err != nil {
				t.Fatal(err)
			}
			defer con.Close(ctx)
			type seen struct {
				id    string
				attrs map[string]string
				trace trace.TraceID
			}
			got := make(chan seen, 2)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error)
			go func() {
				done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
					got <- seen{d.Message.ID, d.Message.Attributes, trace.SpanContextFromContext(ctx).TraceID()}
					return nil
				})
			}()
			wantTrace := span.SpanContext().TraceID()
			if _, off := v.TP.(oteloff.TracerProvider); off {
				wantTrace = trace.TraceID{}
			}
			for range 2 {
				var s seen
				select {
				case s = <-got:
				case <-time.After(30 * time.Second):
					t.Fatal("no delivery")
				}
				want := map[string]string{"k": "v"}
				if s.id == "0" {
					want = nil
				}
				if !maps.Equal(s.attrs, want) || (s.attrs == nil) != (want == nil) {
					t.Errorf("message %s: the handler saw attributes %v, want %v", s.id, s.attrs, want)
				}
				if s.trace != wantTrace {
					t.Errorf("message %s: the handler's trace is %s, want %s", s.id, s.trace, wantTrace)
				}
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// dedupq.handler.duration records how long the handler ran: at least
// what the handler itself measured.
func TestHandlerDurationCoversTheHandler(t *testing.T) {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	if _, err := broker.Topic("q").SendBatch(ctx, []*driver.Message{{ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader()
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), TracerProvider: oteloff.TracerProvider{}})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	var ran time.Duration
	err = con.Run(runCtx, func(context.Context, *dedupq.Delivery) error {
		// Busy for a while, as a handler doing work is: the duration is
		// what is measured, no condition is waited for.
		start := time.Now()
		for time.Since(start) < 2*time.Millisecond {
		}
		ran = time.Since(start)
		stop()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sum, count := testutil.HistogramTotals(t, reader, "dedupq.handler.duration", nil)
	if count != 1 || sum < ran.Seconds() {
		t.Errorf("dedupq.handler.duration: %d points summing to %gs, want 1 of at least the handler's own %gs", count, sum, ran.Seconds())
	}
}
