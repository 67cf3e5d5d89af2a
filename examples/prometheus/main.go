// Command prometheus runs dedupq on the embedded JetStream server (no
// services) with the OpenTelemetry SDK exporting through the Prometheus
// exporter, for a Prometheus server to scrape and to evaluate
// deploy/prometheus/dedupq.rules.yml on. It publishes a few orders (one of
// them twice, and one that the handler refuses for good, so that its
// delivery is terminated and the alert DedupqDeliveriesTerminated fires),
// consumes them through a dedup guard, prints a summary line, and serves
// the metrics at http://ADDR/metrics until interrupted:
//
//	go run ./examples/prometheus -listen 127.0.0.1:9464
//
// OBSERVABILITY.md has a Prometheus configuration that scrapes it. The
// summary line is machine-readable:
//
//	stored=N broker_duplicates=D acked=A terminated=T
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

const brokerURL = "jetstream://embedded/ORDERS?subject=orders&durable=worker&create=true&max_deliveries=5"

func main() {
	log.SetFlags(0)
	listen := flag.String("listen", "127.0.0.1:9464", "address to serve /metrics on")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = serve(ctx, ln, os.Stdout)
	if serr := embedded.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serve starts the example, does its work, and serves the metrics until
// ctx ends.
func serve(ctx context.Context, ln net.Listener, out io.Writer) error {
	a, err := start(ctx, ln)
	if err != nil {
		return err
	}
	defer a.close()
	if err := a.work(ctx, out); err != nil {
		return err
	}
	fmt.Fprintf(out, "serving http://%s/metrics until interrupted\n", ln.Addr())
	<-ctx.Done()
	return nil
}

// app is the example's publisher, consumer and metrics endpoint.
type app struct {
	srv   *http.Server
	mp    *sdkmetric.MeterProvider
	guard *dedup.Guard
	pub   *dedupq.Publisher
	con   *dedupq.Consumer
}

// start opens the publisher and the consumer with a meter provider that
// the Prometheus exporter reads, and serves it on ln.
func start(ctx context.Context, ln net.Listener) (a *app, err error) {
	// A registry of its own rather than prometheus.DefaultRegisterer, so
	// that /metrics shows dedupq's metrics and the exporter's target_info
	// and nothing of the Go runtime's.
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	a = &app{mp: mp, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() { _ = a.srv.Serve(ln) }()
	defer func() {
		if err != nil {
			a.close()
		}
	}()

	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour, MeterProvider: mp})
	if err != nil {
		return nil, err
	}
	a.guard = guard
	if a.con, err = dedupq.OpenConsumer(ctx, brokerURL, dedupq.ConsumerOptions{Dedup: guard, MeterProvider: mp}); err != nil {
		return nil, err
	}
	if a.pub, err = dedupq.OpenPublisher(ctx, brokerURL, dedupq.PublisherOptions{MeterProvider: mp}); err != nil {
		return nil, err
	}
	return a, nil
}

// errUnknownProduct is the handler's refusal of order-bad: no redelivery
// can make it right, so its delivery is terminated.
var errUnknownProduct = errors.New("unknown product")

// work publishes the orders, consumes them until each is acked or
// terminated, and prints the summary line.
func (a *app) work(ctx context.Context, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, id := range []string{"order-1", "order-2", "order-3", "order-2", "order-bad"} {
		if _, err := a.pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte("payload of " + id)}); err != nil {
			return err
		}
	}
	stored := a.pub.Stats().Stored
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- a.con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			if d.Message.ID == "order-bad" {
				return dedupq.Permanent(fmt.Errorf("order %s: %w", d.Message.ID, errUnknownProduct))
			}
			return nil
		})
	}()
	for s := a.con.Stats(); s.Acked+s.Terminated < stored; s = a.con.Stats() {
		select {
		case <-ctx.Done():
			stop()
			return fmt.Errorf("deliveries not settled: %+v", s)
		case <-time.After(10 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	ps, cs := a.pub.Stats(), a.con.Stats()
	fmt.Fprintf(out, "stored=%d broker_duplicates=%d acked=%d terminated=%d\n", ps.Stored, ps.Duplicates, cs.Acked, cs.Terminated)
	return nil
}

// close stops serving and closes what start opened. The consumer's and
// publisher's gauges leave /metrics with them.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a.pub != nil {
		_ = a.pub.Close(ctx)
	}
	if a.con != nil {
		_ = a.con.Close(ctx)
	}
	_ = a.srv.Shutdown(ctx)
	_ = a.mp.Shutdown(ctx)
}
