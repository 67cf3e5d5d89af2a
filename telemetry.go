package dedupq

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	mnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/oteloff"
	"github.com/dedupq/dedupq/window"
)

// instrumentationName names dedupq's meter and tracer.
const instrumentationName = "github.com/dedupq/dedupq"

// reservedAttrPrefix starts the attribute names dedupq and its drivers use
// themselves (driver.AttrTraceParent, …); user attributes may not.
const reservedAttrPrefix = "dedupq-"

// Attribute keys on dedupq's metrics and spans. messaging.* follow the
// OpenTelemetry messaging semantic conventions (v1.43.0).
const (
	attrSystem       = semconv.MessagingSystemKey
	attrDestination  = semconv.MessagingDestinationNameKey
	attrSubscription = semconv.MessagingDestinationSubscriptionNameKey
	attrOperation    = semconv.MessagingOperationTypeKey
	attrOpName       = semconv.MessagingOperationNameKey
	attrMessageID    = semconv.MessagingMessageIDKey
	attrBatchSize    = semconv.MessagingBatchMessageCountKey
	attrOutcome      = attribute.Key("dedupq.outcome")
	attrRole         = attribute.Key("dedupq.role")
	attrAttempt      = attribute.Key("messaging.delivery.attempt")
)

// messagingSystem is the messaging.system of a backend (window.Window's
// Backend): the conventions' well-known value where there is one, which
// they say must be used, else the backend's own name.
func messagingSystem(backend string) string {
	switch backend {
	case "sqs":
		return "aws_sqs"
	case "pubsub":
		return "gcp_pubsub"
	}
	return backend
}

// destinationOf is what a driver's Topic or Subscription names as its
// destination (driver.DestinationNamer); the zero Destination otherwise.
func destinationOf(x any) driver.Destination {
	if n, ok := x.(driver.DestinationNamer); ok {
		return n.Destination()
	}
	return driver.Destination{}
}

// baseAttrs are the attributes of every instrument and span of one
// publisher or consumer: the system, and the destination where the driver
// names it.
func baseAttrs(system string, dest driver.Destination) []attribute.KeyValue {
	kvs := []attribute.KeyValue{attrSystem.String(system)}
	if dest.Name != "" {
		kvs = append(kvs, attrDestination.String(dest.Name))
	}
	if dest.Subscription != "" {
		kvs = append(kvs, attrSubscription.String(dest.Subscription))
	}
	return kvs
}

// spanName is the conventions' span name: the operation, then the
// destination where it is known.
func spanName(op string, dest driver.Destination) string {
	if dest.Name == "" {
		return op
	}
	return op + " " + dest.Name
}

// failed marks span as failed by err: its status, and error.type (the
// conventions require it on a failed operation's span). Only a recording
// span is told: the type is read by reflection.
func failed(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorType(err))
}

// Publish outcomes (dedupq.outcome on dedupq.publish.messages).
const (
	outcomeStored    = "stored"
	outcomeDuplicate = "broker_duplicate"
	outcomeRefused   = "refused"
	outcomeMaybeSent = "maybe_sent"
)

// traceContext is the W3C Trace Context propagator: dedupq carries it
// itself, whatever global propagator the program set, so that a trace
// crosses every broker.
var traceContext = propagation.TraceContext{}

// attrCarrier is a TextMapCarrier over message attributes that maps the
// W3C header names to dedupq's reserved attribute names.
type attrCarrier map[string]string

// carrierName is the attribute that carries the W3C header key, "" for
// other keys: a switch, not a map lookup, as every publish asks it.
func carrierName(key string) string {
	switch key {
	case "traceparent":
		return driver.AttrTraceParent
	case "tracestate":
		return driver.AttrTraceState
	}
	return ""
}

func (c attrCarrier) Get(key string) string {
	if n := carrierName(key); n != "" {
		return c[n]
	}
	return ""
}
func (c attrCarrier) Set(key, value string) {
	if n := carrierName(key); n != "" {
		c[n] = value
	}
}
func (c attrCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// wireCarrier is the TextMapCarrier of one delivery's trace context, its
// two headers already read from the message's attributes, so that
// extracting them looks nothing up again. Read-only: Set does nothing.
type wireCarrier struct{ parent, state string }

func (c *wireCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.parent
	case "tracestate":
		return c.state
	}
	return ""
}
func (c *wireCarrier) Set(string, string) {}
func (c *wireCarrier) Keys() []string     { return []string{"traceparent", "tracestate"} }

// pubTelemetry is a Publisher's instruments.
type pubTelemetry struct {
	tracer trace.Tracer
	base   attribute.Set
	// The spans' names and attributes, made once: sendAttrs for a send
	// span, createAttrs for a message's create span.
	sendName, createName   string
	sendAttrs, createAttrs []attribute.KeyValue
	// creates is whether PublishBatch makes a create span per message
	// (not PublisherOptions.NoCreateSpans).
	creates    bool
	published  metric.Int64Counter
	attempts   metric.Int64Counter
	retryDelay metric.Float64Histogram
	reg        metric.Registration
	// outcomeOpts are base plus each publish outcome, in outcomeNames'
	// order, made once as on the consumer side: built per call, an option
	// and its variadic slice cost allocations each time.
	outcomeOpts [len(outcomeNames)][]metric.AddOption
}

// outcomeNames are the publish outcomes in the order endPublish counts
// them.
var outcomeNames = [...]string{outcomeStored, outcomeDuplicate, outcomeRefused, outcomeMaybeSent}

// conTelemetry is a Consumer's instruments. A nil tracer means tracing is
// off (oteloff.TracerProvider); metrics false means metrics are off
// (oteloff.MeterProvider, or the API's no-op provider, whose instruments
// would record nothing anyway): then the delivery path makes no call for
// that signal, not even time.Now.
type conTelemetry struct {
	tracer trace.Tracer
	// idleGlobal is the global tracer provider while no SDK is installed,
	// when tracer came from it; nil otherwise. See spans.
	idleGlobal trace.TracerProvider
	metrics    bool
	// epoch is what the handler's start and end are read against:
	// time.Since(epoch) reads the monotonic clock alone, where time.Now
	// reads the wall clock as well (170 ns instead of 50 on the 2-core
	// VM), and a duration needs only the monotonic one.
	epoch time.Time
	base  attribute.Set
	// Built once, so that a delivery allocates nothing for them: an
	// option passed alone to an instrument's variadic method would be
	// boxed in a new slice on each call, as the callee is an interface.
	recordOpts  []metric.RecordOption
	outcomeOpts map[string][]metric.AddOption
	processName string
	handlerOpts []trace.SpanStartOption
	consumed    metric.Int64Counter
	handlerDur  metric.Float64Histogram
	attempt     metric.Int64Histogram
	leaseExt    metric.Int64Counter
	reg         metric.Registration
}

// processStart is what one worker of a Run reuses to start the process
// span of each of its deliveries, so that a delivery's span gets all its
// attributes at its start, where a sampler sees them, without building an
// option, an attribute slice and the interface holding it per delivery:
// the last two of kvs are the delivery's (id, attempt), set before each
// start, and opts[1] holds kvs for good. Tracers copy the attributes of
// their options during Start (trace.NewSpanStartConfig appends them to a
// config of their own), so the value is free again once Start returns.
// carrier holds the delivery's trace context headers while they are
// extracted.
type processStart struct {
	kvs     []attribute.KeyValue
	id      int // kvs[id] is the delivery's ID, kvs[id+1] its attempt
	opts    [2]trace.SpanStartOption
	carrier wireCarrier
}

// newProcessStart is one worker's processStart; nil with tracing off.
func (t *conTelemetry) newProcessStart() *processStart {
	if t.tracer == nil {
		return nil
	}
	s := &processStart{kvs: append(t.base.ToSlice(), attrOperation.String("process"), attrOpName.String("process"))}
	s.id = len(s.kvs)
	s.kvs = append(s.kvs, attrMessageID.String(""), attrAttempt.Int(0))
	s.opts[0] = trace.WithSpanKind(trace.SpanKindConsumer)
	s.opts[1] = trace.WithAttributes(s.kvs...)
	return s
}

// metricsOff reports a meter provider under which dedupq records nothing:
// oteloff's, or the API's no-op one.
func metricsOff(mp metric.MeterProvider) bool {
	switch mp.(type) {
	case oteloff.MeterProvider, *oteloff.MeterProvider, mnoop.MeterProvider, *mnoop.MeterProvider:
		return true
	}
	return false
}

// tracingOff reports oteloff's tracer provider. The API's no-op provider
// is not off: it hands the publisher's span context, extracted from the
// message, on to the handler (a handler that publishes continues the
// trace), and costs nothing more once that context is extracted.
func tracingOff(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case oteloff.TracerProvider, *oteloff.TracerProvider:
		return true
	}
	return false
}

// idleGlobal reports the API's global tracer provider before any provider
// is installed (otel.SetTracerProvider), whose tracer tr makes spans that
// record nothing: a span object and a context holding it per start, six
// allocations a delivery for nothing. The Go auto-instrumentation makes
// that tracer's spans record: then tr's probe span records and this
// reports false.
func idleGlobal(tp trace.TracerProvider, tr trace.Tracer) bool {
	rt := reflect.TypeOf(tp)
	if rt.Kind() != reflect.Pointer || rt.Elem().PkgPath() != "go.opentelemetry.io/otel/internal/global" {
		return false
	}
	// Not ended: it records nothing, and ending one that records would
	// report a span nobody asked for.
	_, probe := tr.Start(context.Background(), "dedupq.probe")
	return !probe.IsRecording()
}

// spans reports whether a delivery gets its spans. Under the idle global
// provider it does not: the spans would record nothing, and the handler's
// context gets the publisher's span context all the same (startDelivery
// extracts it), as the idle global tracer's spans would merely carry it.
// Once a provider is installed, the global one hands over to it, and the
// next delivery gets its spans.
func (t *conTelemetry) spans() bool {
	return t.tracer != nil && (t.idleGlobal == nil || otel.GetTracerProvider() != t.idleGlobal)
}

// offSpan is the span of a delivery with tracing off: it records nothing.
var offSpan = trace.SpanFromContext(context.Background())

func meterOr(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(instrumentationName)
}

func tracerOr(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}

// windowGauges are the observable gauges of the safety margin, shared by
// publishers and consumers (dedupq.role tells them apart).
type windowGauges struct {
	window, span metric.Float64ObservableGauge
}

func newWindowGauges(m metric.Meter) windowGauges {
	var g windowGauges
	g.window, _ = m.Float64ObservableGauge("dedupq.window", metric.WithUnit("s"),
		metric.WithDescription("The broker dedup window that protects retries (0 when the backend has none)."))
	g.span, _ = m.Float64ObservableGauge("dedupq.worst_case_span", metric.WithUnit("s"),
		metric.WithDescription("The worst-case span the startup check compared against the window or dedup TTL."))
	return g
}

// register reports win and span on every collection; errors are ignored,
// as the API's no-op and SDK implementations do not fail here.
func (g windowGauges) register(m metric.Meter, attrs attribute.Set, read func() (win, span time.Duration)) metric.Registration {
	reg, _ := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		w, s := read()
		o.ObserveFloat64(g.window, w.Seconds(), metric.WithAttributeSet(attrs))
		o.ObserveFloat64(g.span, s.Seconds(), metric.WithAttributeSet(attrs))
		return nil
	}, g.window, g.span)
	return reg
}

// newPubTelemetry makes the instruments of a publisher on backend (the
// window's Backend) sending to dest; opts gives the providers and
// NoCreateSpans.
func newPubTelemetry(opts PublisherOptions, backend string, dest driver.Destination, read func() (win, span time.Duration)) *pubTelemetry {
	m := meterOr(opts.MeterProvider)
	base := baseAttrs(messagingSystem(backend), dest)
	t := &pubTelemetry{
		tracer:     tracerOr(opts.TracerProvider),
		base:       attribute.NewSet(base...),
		sendName:   spanName("send", dest),
		createName: spanName("create", dest),
		creates:    !opts.NoCreateSpans,
	}
	t.sendAttrs = append(slices.Clip(base), attrOperation.String("send"), attrOpName.String("send"))
	t.createAttrs = append(slices.Clip(base), attrOperation.String("create"), attrOpName.String("create"))
	t.published, _ = m.Int64Counter("dedupq.publish.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages whose publish ended, by dedupq.outcome: stored, broker_duplicate, refused, maybe_sent."))
	t.attempts, _ = m.Int64Counter("dedupq.publish.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Sends of one message to the broker, first tries and retries alike."))
	t.retryDelay, _ = m.Float64Histogram("dedupq.publish.retry_delay", metric.WithUnit("s"),
		metric.WithDescription("Backoff waited before a publish retry."),
		metric.WithExplicitBucketBoundaries(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	t.reg = newWindowGauges(m).register(m, attribute.NewSet(append(slices.Clip(base), attrRole.String("publisher"))...), read)
	for i, o := range outcomeNames {
		t.outcomeOpts[i] = []metric.AddOption{withOutcome(t.base, o)}
	}
	return t
}

// newConTelemetry makes the instruments of a consumer reading the broker
// window w with redelivery policy r (ordered: a subscription that keeps a
// group's order) from dest. Its gauges report what the startup check
// compares: the span opts.plan asks the dedup TTL to cover and, with a
// Deduplicator, that TTL, so that a dashboard shows the margin.
func newConTelemetry(opts ConsumerOptions, w window.Window, r window.RedeliveryPolicy, ordered bool, dest driver.Destination) *conTelemetry {
	base := baseAttrs(messagingSystem(w.Backend), dest)
	t := &conTelemetry{base: attribute.NewSet(base...)}
	if !tracingOff(opts.TracerProvider) {
		t.tracer = tracerOr(opts.TracerProvider)
		if opts.TracerProvider == nil && idleGlobal(otel.GetTracerProvider(), t.tracer) {
			t.idleGlobal = otel.GetTracerProvider()
		}
		t.processName = spanName("process", dest)
		if opts.HandlerSpan {
			t.handlerOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
		}
	}
	mp := opts.MeterProvider
	if mp == nil {
		// A global set to the no-op provider hands out no-op meters for
		// good: a later SetMeterProvider does not reach them.
		mp = otel.GetMeterProvider()
	}
	if metricsOff(mp) {
		return t
	}
	t.metrics, t.epoch = true, time.Now()
	m := meterOr(mp)
	t.consumed, _ = m.Int64Counter("dedupq.consume.deliveries", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries settled, by dedupq.outcome: ack, nack, terminate, and settle_failed for a settle the broker did not take."))
	t.handlerDur, _ = m.Float64Histogram("dedupq.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("Time the user's handler ran, without the dedup store's calls."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	t.attempt, _ = m.Int64Histogram("dedupq.consume.delivery_attempt", metric.WithUnit("{attempt}"),
		metric.WithDescription("Delivery.Attempt of each delivery received: 1 for a first delivery."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 5, 10, 20, 50))
	t.leaseExt, _ = m.Int64Counter("dedupq.consume.lease_extensions", metric.WithUnit("{extension}"),
		metric.WithDescription("Lease extensions of deliveries whose handler outlived half the lease, by dedupq.outcome: ok, error."))
	t.reg = registerConsumerGauges(m, attribute.NewSet(append(slices.Clip(base), attrRole.String("consumer"))...), opts, w, r, ordered)
	t.recordOpts = []metric.RecordOption{metric.WithAttributeSet(t.base)}
	t.outcomeOpts = map[string][]metric.AddOption{}
	for _, o := range []string{"ack", "nack", "terminate", "settle_failed", "ok", "error"} {
		t.outcomeOpts[o] = []metric.AddOption{withOutcome(t.base, o)}
	}
	return t
}

// registerConsumerGauges reports the window and the worst-case span the
// consumer's startup check compares with the dedup TTL (the redelivery
// span, plus the whole publisher span when it does not fit the window:
// window.ConsumerPlan.Span) and, when a Deduplicator is set, its TTL as
// dedupq.dedup.ttl.
func registerConsumerGauges(m metric.Meter, attrs attribute.Set, opts ConsumerOptions, w window.Window, r window.RedeliveryPolicy, ordered bool) metric.Registration {
	g := newWindowGauges(m)
	span := opts.plan(0, w, r, ordered).Span()
	if opts.Dedup == nil {
		return g.register(m, attrs, func() (time.Duration, time.Duration) { return w.Duration, span })
	}
	ttl, _ := m.Float64ObservableGauge("dedupq.dedup.ttl", metric.WithUnit("s"),
		metric.WithDescription("How long the consumer's dedup store remembers a completed key; it must cover dedupq.worst_case_span less the margin."))
	headroom, _ := m.Float64ObservableGauge("dedupq.dedup.headroom", metric.WithUnit("s"),
		metric.WithDescription("The dedup TTL less the startup check's margin, less dedupq.worst_case_span: how much longer the worst case could grow before the check refused it."))
	reg, _ := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t := opts.Dedup.TTL()
		o.ObserveFloat64(g.window, w.Duration.Seconds(), metric.WithAttributeSet(attrs))
		o.ObserveFloat64(g.span, span.Seconds(), metric.WithAttributeSet(attrs))
		o.ObserveFloat64(ttl, t.Seconds(), metric.WithAttributeSet(attrs))
		o.ObserveFloat64(headroom, (window.UsableTTL(t, opts.Margin) - span).Seconds(), metric.WithAttributeSet(attrs))
		return nil
	}, g.window, g.span, ttl, headroom)
	return reg
}

func (t *pubTelemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

func (t *conTelemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// withOutcome is base plus one dedupq.outcome.
func withOutcome(base attribute.Set, outcome string) metric.MeasurementOption {
	kvs := append(base.ToSlice(), attrOutcome.String(outcome))
	return metric.WithAttributes(kvs...)
}

// startPublish starts the send span of one Publish call, of the message
// whose ID is id: its context is the message's creation context.
func (t *pubTelemetry) startPublish(ctx context.Context, id string) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, t.sendName, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(t.sendAttrs...), trace.WithAttributes(attrMessageID.String(id)))
}

// batchSpans are the create spans of one PublishBatch call's messages, as
// the messaging conventions recommend for a batch: each message gets a
// create span of its own (kind producer, a child of the caller's context,
// which the message carries to its consumers), and the call's send span
// (kind client) links to each.
type batchSpans struct {
	parent  context.Context // the caller's
	send    trace.Span
	creates []trace.Span // by message index; nil for one refused before its span
}

// startBatch starts the send span of one PublishBatch call of msgs and
// returns its context and the call's batchSpans, whose create spans
// inject starts. They are nil when the send span records nothing (no
// SDK, or not sampled), where a message's create span would not record
// either, and with PublisherOptions.NoCreateSpans: then each message
// carries the send span's context, and the send span is the producer.
func (t *pubTelemetry) startBatch(ctx context.Context, msgs []*Message) (context.Context, trace.Span, *batchSpans) {
	kind := trace.SpanKindProducer
	if t.creates {
		kind = trace.SpanKindClient
	}
	sctx, span := t.tracer.Start(ctx, t.sendName, trace.WithSpanKind(kind),
		trace.WithAttributes(t.sendAttrs...), trace.WithAttributes(attrBatchSize.Int(len(msgs))))
	if !t.creates || !span.IsRecording() {
		return sctx, span, nil
	}
	return sctx, span, &batchSpans{parent: ctx, send: span, creates: make([]trace.Span, len(msgs))}
}

// inject puts the creation context of message i of a PublishBatch call
// (b, nil for a Publish call or without create spans) on m, so that
// consumers continue the trace: its create span's, started here, once m's
// ID is known; else the span context of ctx. Without a valid span context
// (tracing off and no caller span) it adds nothing, so that no attribute
// is spent on it.
func (t *pubTelemetry) inject(ctx context.Context, b *batchSpans, i int, m *driver.Message) {
	if b != nil {
		var span trace.Span
		ctx, span = t.tracer.Start(b.parent, t.createName, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(t.createAttrs...), trace.WithAttributes(attrMessageID.String(m.ID)))
		b.creates[i] = span
		b.send.AddLink(trace.Link{SpanContext: span.SpanContext()})
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if m.Attributes == nil {
		m.Attributes = map[string]string{}
	}
	traceContext.Inject(ctx, attrCarrier(m.Attributes))
}

// endPublish records each message's outcome on the meter and the spans,
// and ends them: the send span, and b's create spans (nil for none).
func (t *pubTelemetry) endPublish(ctx context.Context, span trace.Span, b *batchSpans, results []Result) {
	var n [len(outcomeNames)]int64
	var firstErr error
	for i, r := range results {
		if r.Err != nil && firstErr == nil {
			firstErr = r.Err
		}
		if b != nil && b.creates[i] != nil {
			if r.Err != nil {
				failed(b.creates[i], r.Err)
			}
			b.creates[i].End()
		}
		switch {
		case r.Err == nil && r.Duplicate:
			n[1]++
		case r.Err == nil:
			n[0]++
		case maybeSent(r.Err):
			n[3]++
		default:
			n[2]++
		}
	}
	for i, c := range n {
		if c > 0 {
			t.published.Add(ctx, c, t.outcomeOpts[i]...)
		}
	}
	if firstErr != nil && span.IsRecording() {
		span.SetStatus(codes.Error, "some messages were not stored")
		span.SetAttributes(semconv.ErrorType(firstErr))
	}
	span.End()
}

// traceHandler wraps the user's handler in a child span and times it.
func (t *conTelemetry) traceHandler(h Handler) Handler {
	if t.tracer == nil && !t.metrics {
		return h
	}
	return func(ctx context.Context, d *Delivery) error {
		span := offSpan
		if t.handlerOpts != nil && t.spans() {
			ctx, span = t.tracer.Start(ctx, "dedupq.handler", t.handlerOpts...)
		}
		// Enabled: the global provider's instruments record nothing until
		// an SDK is installed; until then, no clock reads either.
		timed := t.metrics && t.handlerDur.Enabled(ctx)
		var start time.Duration
		if timed {
			start = time.Since(t.epoch)
		}
		err := h(ctx, d)
		if timed {
			t.handlerDur.Record(ctx, (time.Since(t.epoch) - start).Seconds(), t.recordOpts...)
		}
		if err != nil && span.IsRecording() {
			span.RecordError(err)
			failed(span, err)
		}
		span.End()
		return err
	}
}

// startDelivery starts the span of one delivery as a child of the
// publisher's span carried in its attributes, and removes those attributes
// from what the handler sees. It removes them in place: the map is the
// delivery's own (each driver builds or clones it per delivery, and the
// handler gets it as it is), so no copy is needed. s is the calling
// worker's (newProcessStart), nil with tracing off.
func (t *conTelemetry) startDelivery(ctx context.Context, s *processStart, d *driver.Delivery) (context.Context, trace.Span) {
	if t.metrics {
		t.attempt.Record(ctx, int64(d.Attempt), t.recordOpts...)
	}
	if attrs := d.Message.Attributes; len(attrs) > 0 {
		tp, parent := attrs[driver.AttrTraceParent]
		ts, state := attrs[driver.AttrTraceState]
		if parent && s != nil {
			s.carrier = wireCarrier{tp, ts}
			ctx = traceContext.Extract(ctx, &s.carrier)
			s.carrier = wireCarrier{} // not to keep the headers alive
		}
		if parent {
			delete(attrs, driver.AttrTraceParent)
		}
		if state {
			delete(attrs, driver.AttrTraceState)
		}
		if (parent || state) && len(attrs) == 0 {
			d.Message.Attributes = nil
		}
	}
	if !t.spans() {
		return ctx, offSpan
	}
	s.kvs[s.id], s.kvs[s.id+1] = attrMessageID.String(d.Message.ID), attrAttempt.Int(d.Attempt)
	ctx, span := t.tracer.Start(ctx, t.processName, s.opts[:]...)
	s.kvs[s.id] = attrMessageID.String("") // not to keep the ID alive
	return ctx, span
}

// settled counts one settlement (what: ack, nack, terminate,
// settle_failed).
func (t *conTelemetry) settled(ctx context.Context, what string) {
	if t.metrics {
		t.consumed.Add(ctx, 1, t.outcomeOpts[what]...)
	}
}

// extended counts one lease extension (outcome: ok, error).
func (t *conTelemetry) extended(ctx context.Context, outcome string) {
	if t.metrics {
		t.leaseExt.Add(ctx, 1, t.outcomeOpts[outcome]...)
	}
}

// reservedName reports a user attribute name under dedupq's own prefix.
func reservedName(k string) bool { return strings.HasPrefix(k, reservedAttrPrefix) }
