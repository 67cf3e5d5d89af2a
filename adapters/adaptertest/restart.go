package adaptertest

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// Restarter stops and starts the backend an Entity lives on, for the
// Restart check: a broker that goes away and comes back is the normal case,
// and a Publisher and a Consumer must ride through it.
type Restarter struct {
	// Stop takes the backend down as a restart does: its connections drop
	// and its address refuses new ones until Start.
	Stop func(ctx context.Context) error
	// Start brings the backend back at the same address, with the entity
	// usable again (re-created with the same settings when the backend
	// forgot it).
	Start func(ctx context.Context) error
	// Forgets says the backend keeps nothing across a restart (an
	// in-memory emulator): stored messages and dedup history are lost.
	// The check then stops it only once every message published so far
	// was handled, so what it proves there is the outage itself: a
	// publisher retrying through it, a consumer waiting it out and going
	// on with what is published afterwards.
	Forgets bool
}

// restartMessages is how many messages the Restart check publishes; the
// backend is stopped after a third and after two thirds of them.
const restartMessages = 300

// restartDowntime is how long the backend stays down each time: long
// enough that publishes and receives fail and are retried, short enough
// for the publisher's retry policy below.
const restartDowntime = time.Second

// restartConfig asks for a lease long enough for a handler on a loaded
// machine, and bounded deliveries so that the dedup TTL can cover them.
var restartConfig = Config{DedupWindow: time.Minute, AckWait: 2 * time.Second, MaxDeliveries: 20, Restartable: true}

// testRestart publishes restartMessages through a Publisher while the
// backend is stopped and started twice, and consumes them with a Consumer
// and a dedup Guard. The first stop comes once the consumer has handled
// everything published so far, so that its receive is waiting at the
// broker; the second comes mid-flight (unless Restarter.Forgets). In both,
// the publisher goes on publishing into the outage. Every message's effect
// must happen exactly once, every publish must succeed within the
// publisher's retry policy, Run must keep running through both outages,
// and it must stop cleanly afterwards.
func testRestart(t *testing.T, s *suite) {
	ent := s.open(t, restartConfig)
	if ent.Restart == nil {
		ent.Topic.Close()
		ent.Subscription.Close()
		t.Skip("the harness cannot restart this backend")
	}
	if _, ok := ent.Clock.(*clock.Fake); ok {
		ent.Topic.Close()
		ent.Subscription.Close()
		t.Fatal("the Restart check runs in real time; the harness gave a fake clock")
	}
	rs := ent.Restart
	ctx := t.Context()

	// The consumer's Guard remembers keys for an hour, which lets the
	// publisher retry far longer than an outage lasts, whatever the
	// broker's own window.
	const ttl = time.Hour
	retry := window.RetryPolicy{
		MaxAttempts: 30, InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second,
		Multiplier: 2, Jitter: 0.2, AttemptTimeout: 5 * time.Second,
	}
	pub, err := dedupq.NewPublisher(ctx, ent.Topic, dedupq.PublisherOptions{Retry: &retry, ConsumerDedupTTL: ttl})
	if err != nil {
		ent.Topic.Close()
		ent.Subscription.Close()
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: ttl})
	if err != nil {
		ent.Subscription.Close()
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(ctx, ent.Subscription, dedupq.ConsumerOptions{
		Concurrency: 8, Dedup: guard, PublisherSpan: retry.Span(),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		ent.Subscription.Close()
		t.Fatalf("NewConsumer: %v", err)
	}
	t.Cleanup(func() { con.Close(context.Background()) })

	eff := &effects{n: map[string]int{}, changed: make(chan struct{})}
	runCtx, cancelRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() {
		runDone <- con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
			eff.add(d.Message.ID)
			return nil
		})
	}()
	var stopOnce sync.Once
	stopRun := func() {
		stopOnce.Do(func() {
			cancelRun()
			wait := time.NewTimer(s.caps.WaitTimeout + 30*time.Second)
			defer wait.Stop()
			select {
			case err := <-runDone:
				if err != nil {
					t.Errorf("Consumer.Run returned %v after its context was cancelled, want nil", err)
				}
			case <-wait.C:
				t.Errorf("Consumer.Run did not return within %s of its context being cancelled", s.caps.WaitTimeout+30*time.Second)
			}
		})
	}
	t.Cleanup(stopRun)

	prefix := nonce()
	ids := make([]string, restartMessages)
	for i := range ids {
		ids[i] = fmt.Sprintf("restart%03d-%s", i, prefix)
	}
	// The publisher pauses at each restart point until the backend is
	// down, so that some of its publishes certainly meet the outage.
	restartAt := []int{restartMessages / 3, 2 * restartMessages / 3}
	reached := make([]chan struct{}, len(restartAt))
	down := make([]chan struct{}, len(restartAt))
	for k := range restartAt {
		reached[k], down[k] = make(chan struct{}), make(chan struct{})
	}
	var (
		pubMu   sync.Mutex
		pubErrs []error
		pubbed  atomic.Int64
	)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i, id := range ids {
			for k, at := range restartAt {
				if i == at {
					close(reached[k])
					select {
					case <-down[k]:
					case <-ctx.Done():
						return
					}
				}
			}
			m := &dedupq.Message{ID: id, Body: []byte("body of " + id), GroupKey: group}
			if _, err := pub.Publish(ctx, m); err != nil {
				pubMu.Lock()
				pubErrs = append(pubErrs, err)
				pubMu.Unlock()
			}
			pubbed.Add(1)
		}
	}()

	// wait waits for cond on the effects so far, failing at once if Run
	// returns: that is the failure this check exists for.
	wait := func(what string, within time.Duration, cond func(map[string]int) bool) {
		t.Helper()
		deadline := time.NewTimer(within)
		defer deadline.Stop()
		for {
			n, changed := eff.snapshot()
			if cond(n) {
				return
			}
			select {
			case <-changed:
			case err := <-runDone:
				runDone <- err // for stopRun
				t.Fatalf("Consumer.Run returned while waiting for %s: %v; it must ride through a backend restart", what, err)
			case <-deadline.C:
				t.Fatalf("timed out after %s waiting for %s; %d of %d messages handled, %d published",
					within, what, len(n), restartMessages, pubbed.Load())
			case <-ctx.Done():
				t.Fatalf("test context done waiting for %s", what)
			}
		}
	}
	handledAll := func(ids []string) func(map[string]int) bool {
		return func(n map[string]int) bool {
			for _, id := range ids {
				if n[id] == 0 {
					return false
				}
			}
			return true
		}
	}
	within := s.caps.WaitTimeout + 2*restartConfig.AckWait + 30*time.Second
	// waitPublished waits for the publisher to reach restart point k: it
	// must, within its retry policy, after the previous restart.
	waitPublished := func(k, at int) {
		t.Helper()
		deadline := time.NewTimer(within)
		defer deadline.Stop()
		select {
		case <-reached[k]:
		case <-pubDone:
			t.Fatalf("the publisher stopped before message %d", at)
		case err := <-runDone:
			runDone <- err
			t.Fatalf("Consumer.Run returned before restart %d: %v; it must ride through a backend restart", k+1, err)
		case <-deadline.C:
			t.Fatalf("the publisher did not reach message %d within %s (%d published): publishes after the restart do not get through",
				at, within, pubbed.Load())
		}
	}

	for k, at := range restartAt {
		waitPublished(k, at)
		// The first stop meets an idle consumer, whose receive is waiting
		// at the broker (a pending pull, a long poll); the second meets
		// messages not yet consumed and settles in flight, unless the
		// backend would lose them.
		switch {
		case k == 0 || rs.Forgets:
			wait(fmt.Sprintf("the %d messages published before restart %d", at, k+1), within, handledAll(ids[:at]))
		default:
			// Stop again only once the consumer is back at work.
			prev := restartAt[k-1]
			wait(fmt.Sprintf("a message published after restart %d", k), within, func(n map[string]int) bool {
				for _, id := range ids[prev:at] {
					if n[id] > 0 {
						return true
					}
				}
				return false
			})
		}
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		t.Logf("restart %d: stopping the backend after %d messages published, %d handled", k+1, at, eff.len())
		if err := rs.Stop(sctx); err != nil {
			cancel()
			t.Fatalf("restart %d: stopping the backend: %v", k+1, err)
		}
		close(down[k])
		pause := time.NewTimer(restartDowntime)
		select {
		case <-pause.C:
		case <-ctx.Done():
		}
		pause.Stop()
		err := rs.Start(sctx)
		cancel()
		if err != nil {
			t.Fatalf("restart %d: starting the backend again: %v", k+1, err)
		}
		t.Logf("restart %d: the backend is back", k+1)
	}

	select {
	case <-pubDone:
	case <-time.After(within):
		t.Fatalf("the publisher did not finish within %s of the last restart", within)
	}
	pubMu.Lock()
	for i, err := range pubErrs {
		if i == 5 {
			t.Errorf("… and %d more failed publishes", len(pubErrs)-5)
			break
		}
		t.Errorf("a publish failed despite the retry policy (%d attempts, span %s): %v", retry.MaxAttempts, retry.Span(), err)
	}
	pubMu.Unlock()
	wait("every message to be handled", within, handledAll(ids))

	select {
	case err := <-runDone:
		runDone <- err
		t.Fatalf("Consumer.Run returned %v after the restarts; it must keep running", err)
	default:
	}
	stopRun()
	n, _ := eff.snapshot()
	known := make(map[string]bool, len(ids))
	for _, id := range ids {
		known[id] = true
		if n[id] != 1 {
			t.Errorf("message %s took effect %d times, want exactly once", id, n[id])
		}
	}
	for id, c := range n {
		if !known[id] {
			t.Errorf("unexpected message %s took effect %d times", id, c)
		}
	}
}

// effects counts how often each message's handler ran past the Guard, and
// wakes waiters on each run.
type effects struct {
	mu      sync.Mutex
	n       map[string]int
	changed chan struct{}
}

func (e *effects) add(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[id]++
	close(e.changed)
	e.changed = make(chan struct{})
}

func (e *effects) snapshot() (map[string]int, <-chan struct{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := make(map[string]int, len(e.n))
	for k, v := range e.n {
		n[k] = v
	}
	return n, e.changed
}

func (e *effects) len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.n)
}
