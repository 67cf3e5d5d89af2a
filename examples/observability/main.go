// Command observability runs dedupq on the embedded JetStream server (no
// services) with the OpenTelemetry SDK installed, publishes a few orders
// (one of them twice), consumes them through a dedup guard, and prints the
// metrics dedupq recorded, read with the SDK's ManualReader, and the spans
// of one order's trace across the broker. OBSERVABILITY.md lists every
// instrument.
//
// The last line is machine-readable:
//
//	stored=N broker_duplicates=D acked=A ran=R
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

const url = "jetstream://embedded/OBS?subject=obs&durable=worker&create=true&max_deliveries=5"

func main() {
	log.SetFlags(0)
	err := run(context.Background(), os.Stdout)
	if serr := embedded.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// A program would install an exporter (OTLP, Prometheus); the manual
	// reader and the span recorder keep this one self-contained.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour, MeterProvider: mp})
	if err != nil {
		return err
	}
	con, err := dedupq.OpenConsumer(ctx, url, dedupq.ConsumerOptions{Dedup: guard, MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		return err
	}
	defer con.Close(ctx)
	pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		return err
	}
	defer pub.Close(ctx)

	ids := []string{"order-1", "order-2", "order-3", "order-2"}
	for _, id := range ids {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("payload of " + id)}); err != nil {
			return err
		}
	}
	stored := pub.Stats().Stored
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error { return nil })
	}()
	for con.Stats().Acked < stored {
		select {
		case <-ctx.Done():
			stop()
			return fmt.Errorf("deliveries not settled: %+v", con.Stats())
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Fprintln(out, "metrics:")
	for _, line := range describe(rm) {
		fmt.Fprintln(out, " ", line)
	}
	fmt.Fprintln(out, "spans:")
	for _, s := range spans.Ended() {
		fmt.Fprintf(out, "  %-16s trace %s span %s parent %s\n", s.Name(), s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID())
	}
	ps, cs, gs := pub.Stats(), con.Stats(), guard.Stats()
	fmt.Fprintf(out, "stored=%d broker_duplicates=%d acked=%d ran=%d\n", ps.Stored, ps.Duplicates, cs.Acked, gs.Ran)
	return nil
}

// describe renders each data point as "name{attrs} value", sorted.
func describe(rm metricdata.ResourceMetrics) []string {
	var lines []string
	add := func(name string, set attribute.Set, v string) {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		lines = append(lines, fmt.Sprintf("%s{%s} %s", name, strings.Join(kv, ","), v))
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes, fmt.Sprint(p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					add(m.Name+" ("+m.Unit+")", p.Attributes, fmt.Sprint(p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					add(m.Name+" ("+m.Unit+")", p.Attributes, fmt.Sprintf("count=%d sum=%.4f", p.Count, p.Sum))
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					add(m.Name, p.Attributes, fmt.Sprintf("count=%d sum=%d", p.Count, p.Sum))
				}
			}
		}
	}
	slices.Sort(lines)
	return lines
}
