// Tests of the consumer's tracing under the API's global tracer provider,
// which the consumer skips while no provider is installed: on the
// in-memory broker (adapters/mem), read back with an in-memory span
// recorder. No services. The test installs a global provider, for good,
// so it runs in a child process of the test binary.
package dedupq_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/internal/oteloff"
)

const lateGlobalEnv = "DEDUPQ_TEST_LATE_GLOBAL"

// inChild reports whether t runs in a child process of the test binary,
// started with env set; when it does not, it runs t there and fails t if
// the child's run of it did not pass. A test that installs a global
// provider, for good, runs its body only in the child.
func inChild(t *testing.T, env string) bool {
	t.Helper()
	if os.Getenv(env) != "" {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	return false
}

// A consumer made before any global tracer provider is installed, with
// none of its own, hands the publisher's span context to the handler, and
// once a provider is installed, the next deliveries get their spans from
// it: process, child of the publisher's send span, and dedupq.handler.
func TestGlobalTracerProviderInstalledLate(t *testing.T) {
	if !inChild(t, lateGlobalEnv) {
		return
	}
	ctx := context.Background()
	pubRec := tracetest.NewSpanRecorder()
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(pubRec))})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{MeterProvider: oteloff.MeterProvider{}, HandlerSpan: true})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)

	type seen struct {
		id        string
		trace     trace.TraceID
		recording bool
	}
	got := make(chan seen, 1)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			span := trace.SpanFromContext(ctx)
			got <- seen{d.Message.ID, span.SpanContext().TraceID(), span.IsRecording()}
			return nil
		})
	}()
	next := func(id string) seen {
		t.Helper()
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: id}); err != nil {
			t.Fatal(err)
		}
		select {
		case s := <-got:
			if s.id != id {
				t.Fatalf("delivered %s, want %s", s.id, id)
			}
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("%s was not delivered", id)
		}
		return seen{}
	}
	sendOf := func(n int) sdktrace.ReadOnlySpan {
		t.Helper()
		if ended := pubRec.Ended(); len(ended) == n {
			return ended[n-1]
		}
		t.Fatalf("publisher spans: %v, want %d", pubRec.Ended(), n)
		return nil
	}

	before := next("before")
	if want := sendOf(1).SpanContext().TraceID(); before.trace != want || before.recording {
		t.Errorf("before a provider is installed, the handler's span: trace %s, recording %v; want trace %s, not recording",
			before.trace, before.recording, want)
	}

	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	after := next("after")
	send := sendOf(2)
	if after.trace != send.SpanContext().TraceID() || !after.recording {
		t.Errorf("after a provider is installed, the handler's span: trace %s, recording %v; want trace %s, recording",
			after.trace, after.recording, send.SpanContext().TraceID())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var process, handler sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case s.Name() == "process q" && process == nil:
			process = s
		case s.Name() == "dedupq.handler" && handler == nil:
			handler = s
		default:
			t.Errorf("unexpected span %s", s.Name())
		}
	}
	if process == nil || handler == nil {
		t.Fatalf("spans after the provider was installed: %v", rec.Ended())
	}
	if process.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("process span's parent = %v, want the send span %v", process.Parent().SpanID(), send.SpanContext().SpanID())
	}
	if handler.Parent().SpanID() != process.SpanContext().SpanID() {
		t.Errorf("handler span's parent = %v, want the process span %v", handler.Parent().SpanID(), process.SpanContext().SpanID())
	}
}
