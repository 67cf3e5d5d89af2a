package embedded_test

// Opens jetstream://embedded/… URLs, which run a real nats-server inside
// this test process. The tests are not parallel: they share that server
// and count the process's goroutines.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/window"
)

// TestMain removes the in-process server's store, whichever tests ran.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := embedded.Shutdown(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// name returns a stream name no earlier run of the test in this process
// used (-count reruns share the server's store).
func name(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "T" + hex.EncodeToString(b)
}

// url names a stream of its own on the in-process server, with a
// durable bounded for a dedup guard.
func url(stream string) string {
	return "jetstream://embedded/" + stream + "?subject=" + stream + "&durable=d&create=true&max_deliveries=3"
}

// noLeak fails t unless, within a deadline, the process runs no more
// goroutines than before (baseline) and the in-process server has stopped.
func noLeak(t *testing.T, baseline int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		_, running, _ := embedded.State()
		if n <= baseline && !running {
			return
		}
		if time.Now().After(deadline) {
			var b bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("after the last Close: %d goroutines (%d before), server running %v:\n%s", n, baseline, running, b.String())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, not waiting for time to pass
	}
}

// A publisher closed before the consumer opens: the server stops in
// between and starts again on the same store, and the consumer still gets
// what was published; the stream's dedup history survives the restart
// too. After each last Close the server's goroutines are gone.
func TestReopenAfterClose(t *testing.T) {
	ctx := ctxT(t)
	baseline := runtime.NumGoroutine()
	starts0, _, _ := embedded.State()
	stream := name(t)

	pub, err := dedupq.OpenPublisher(ctx, url(stream), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)

	// A resend after the restart is still a duplicate within the window.
	pub, err = dedupq.OpenPublisher(ctx, url(stream), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := pub.Publish(ctx, &dedupq.Message{ID: "a", Body: []byte("a")})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Duplicate || res.BackendID != "1" {
		t.Errorf("resend of a after the restart: %+v, want a duplicate of sequence 1", res)
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)

	con, err := dedupq.OpenConsumer(ctx, url(stream), dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	// Bounded, so that messages lost in the restart fail the test soon.
	runCtx, stop := context.WithTimeout(ctx, 15*time.Second)
	err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
		if got = append(got, d.Message.ID); len(got) == 2 {
			stop()
		}
		return nil
	})
	stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("consumed %q, want [a b]", got)
	}
	if err := con.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)
	if starts, _, _ := embedded.State(); starts-starts0 != 3 {
		t.Errorf("%d servers started, want 3: one per open after a last close", starts-starts0)
	}
}

// Opens racing to be first start one server, which stops once the last
// of them closes.
func TestConcurrentFirstOpens(t *testing.T) {
	ctx := ctxT(t)
	baseline := runtime.NumGoroutine()
	starts0, running, _ := embedded.State()
	if running {
		t.Fatal("the server runs before the test opened anything")
	}
	stream := name(t)
	const n = 8
	pubs := make([]*dedupq.Publisher, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// No create: the stream is made once, below, so that the
			// opens race only for the server.
			pubs[i], errs[i] = dedupq.OpenPublisher(ctx, "jetstream://embedded/"+stream+"?subject="+stream, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
		})
	}
	wg.Wait()
	if starts, _, _ := embedded.State(); starts-starts0 != 1 {
		t.Errorf("%d concurrent first opens started %d servers, want 1", n, starts-starts0)
	}
	for i, err := range errs {
		// The stream does not exist: every open reached the server and
		// was told so.
		if err == nil {
			pubs[i].Close(ctx)
			t.Errorf("open %d succeeded on a missing stream", i)
		}
	}
	noLeak(t, baseline)

	// The same race with every open succeeding, and closes racing too.
	setup, err := dedupq.OpenPublisher(ctx, url(stream), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.Close(ctx); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)
	starts0, _, _ = embedded.State()
	for i := range n {
		wg.Go(func() { pubs[i], errs[i] = dedupq.OpenPublisher(ctx, url(stream), dedupq.PublisherOptions{}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
	}
	if starts, _, _ := embedded.State(); starts-starts0 != 1 {
		t.Errorf("%d concurrent first opens started %d servers, want 1", n, starts-starts0)
	}
	for i := range n {
		wg.Go(func() { errs[i] = pubs[i].Close(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)
}

// Shutdown removes the store: the next open finds an empty server.
func TestShutdown(t *testing.T) {
	ctx := ctxT(t)
	baseline := runtime.NumGoroutine()
	stream := name(t)
	pub, err := dedupq.OpenPublisher(ctx, url(stream), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "a", Body: []byte("a")}); err != nil {
		t.Fatal(err)
	}
	_, _, dir := embedded.State()
	if dir == "" {
		t.Fatal("no store directory while the server runs")
	}
	// Shutdown under an open publisher stops the server anyway; the
	// publisher's later Close releases nothing.
	if err := embedded.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("store directory after Shutdown: %v, want it removed", err)
	}
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "b", Body: []byte("b")}); err == nil {
		t.Error("a publish on the stopped server succeeded")
	}
	if err := pub.Close(ctx); err != nil {
		t.Fatal(err)
	}
	noLeak(t, baseline)

	_, err = dedupq.OpenPublisher(ctx, "jetstream://embedded/"+stream+"?subject="+stream, dedupq.PublisherOptions{})
	if err == nil {
		t.Fatal("the stream outlived Shutdown")
	}
	noLeak(t, baseline)
	if err := embedded.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := embedded.Shutdown(ctx); err != nil {
		t.Fatalf("a second Shutdown: %v", err)
	}
}
