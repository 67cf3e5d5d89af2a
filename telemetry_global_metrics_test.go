// Tests of the timed metrics (handler and store durations) under the API's
// global meter provider, which records nothing, and so times nothing, until
// an SDK is installed: on the in-memory broker (adapters/mem) with a Guard
// on memstore, read back with a manual reader. No services. The test
// installs a global provider, for good, so it runs in a child process of
// the test binary.
package dedupq_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/internal/oteloff"
)

const lateMeterEnv = "DEDUPQ_TEST_LATE_METER"

// A Consumer and a Guard made before any global meter provider is
// installed, with none of their own, time their handler and store calls
// once one is: the deliveries after it count in dedupq.handler.duration
// and dedupq.store.duration, those before it nowhere.
func TestGlobalMeterProviderInstalledLate(t *testing.T) {
	if !inChild(t, lateMeterEnv) {
		return
	}
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute, MaxDeliveries: 5})
	off := dedupq.PublisherOptions{MeterProvider: oteloff.MeterProvider{}, TracerProvider: oteloff.TracerProvider{}}
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), off)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), dedupq.ConsumerOptions{Dedup: g, TracerProvider: oteloff.TracerProvider{}})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)
	handled := make(chan string, 1)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
			handled <- d.Message.ID
			return nil
		})
	}()
	next := func(id string) {
		t.Helper()
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: id}); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-handled:
			if got != id {
				t.Fatalf("handled %s, want %s", got, id)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s was not handled", id)
		}
	}

	next("before")
	r := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)))
	next("after")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	m := metricsOf(t, r)
	count := func(name, attr string) (n float64) {
		for set, v := range m[name] {
			if strings.Contains(set, attr) {
				n += v
			}
		}
		return n
	}
	for _, tt := range []struct {
		name, attr string
	}{
		{"dedupq.handler.duration", ""},
		{"dedupq.store.duration", "dedupq.store.op=claim"},
		{"dedupq.store.duration", "dedupq.store.op=complete"},
	} {
		if got := count(tt.name, tt.attr); got != 1 {
			t.Errorf("%s %s: %v recorded, want 1 (the delivery after the provider was installed): %v", tt.name, tt.attr, got, m[tt.name])
		}
	}
}
