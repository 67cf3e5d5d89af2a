// Guard tests over the in-memory store and a fake clock: no services.
package dedup_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// flakyStore fails the operations named in fail.
type flakyStore struct {
	dedup.Store
	fail map[string]bool
}

var errDown = errors.New("store down")

func (f *flakyStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	if f.fail["claim"] {
		return dedup.Claim{}, errDown
	}
	return f.Store.Claim(ctx, key, fp, lease)
}

func (f *flakyStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if f.fail["extend"] {
		return dedup.ErrLeaseLost // as if another claimant had taken over
	}
	return f.Store.Extend(ctx, key, token, lease)
}

func (f *flakyStore) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if f.fail["complete"] {
		return errDown
	}
	return f.Store.Complete(ctx, key, token, ttl, result)
}

func delivery(id, body string) *dedupq.Delivery {
	return &dedupq.Delivery{Message: dedupq.Message{ID: id, Body: []byte(body)}, Attempt: 1, Lease: 30 * time.Second}
}

func newGuard(t *testing.T, s dedup.Store, c clock.Clock, failOpen bool) *dedup.Guard {
	t.Helper()
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: s, TTL: time.Hour, Clock: c, FailOpen: failOpen, SettleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGuardOutcomes(t *testing.T) {
	ok := func(context.Context, *dedupq.Delivery) error { return nil }
	fail := func(context.Context, *dedupq.Delivery) error { return errors.New("handler failed") }
	tests := []struct {
		name    string
		first   dedupq.Handler // run on delivery 1 (body "a")
		body2   string         // delivery 2's body
		wantErr func(error) bool
		ran2    bool
	}{
		{"completed key is acked without running", ok, "a", func(err error) bool { return err == nil }, false},
		{"failed key is released and runs again", fail, "a", func(err error) bool { return err == nil }, true},
		{"same key, other payload is a permanent conflict", ok, "b", func(err error) bool {
			var ce *dedup.ConflictError
			return dedupq.IsPermanent(err) && errors.As(err, &ce) && errors.Is(err, dedup.ErrFingerprintMismatch)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newGuard(t, memstore.New(nil), nil, false)
			_ = g.Wrap(tt.first)(context.Background(), delivery("k", "a"))
			ran := false
			err := g.Wrap(func(context.Context, *dedupq.Delivery) error { ran = true; return nil })(context.Background(), delivery("k", tt.body2))
			if !tt.wantErr(err) || ran != tt.ran2 {
				t.Fatalf("second delivery: err = %v, ran = %v; want ran = %v", err, ran, tt.ran2)
			}
		})
	}
}

func TestGuardNacksWhileAnotherHolds(t *testing.T) {
	fake := clock.NewFake(time.Unix(1000, 0))
	g := newGuard(t, memstore.New(fake), fake, false)
	inside, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- g.Wrap(func(context.Context, *dedupq.Delivery) error { close(inside); <-release; return nil })(context.Background(), delivery("k", "a"))
	}()
	<-inside
	ran := false
	err := g.Wrap(func(context.Context, *dedupq.Delivery) error { ran = true; return nil })(context.Background(), delivery("k", "a"))
	var ra *dedupq.RetryAfterError
	if ran || !errors.Is(err, dedup.ErrInProgress) || !errors.As(err, &ra) || ra.Delay != 30*time.Second {
		t.Fatalf("concurrent delivery: err = %v, ran = %v; want a nack after the holder's 30s lease", err, ran)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := g.Stats(); s.Ran != 1 || s.Deferred != 1 {
		t.Errorf("stats = %+v", s)
	}
}

func TestGuardExtendsLeaseWhileRunning(t *testing.T) {
	fake := clock.NewFake(time.Unix(1000, 0))
	store := memstore.New(fake)
	g := newGuard(t, store, fake, false)
	release := make(chan struct{})
	done := make(chan error)
	go func() {
		done <- g.Wrap(func(context.Context, *dedupq.Delivery) error { <-release; return nil })(context.Background(), delivery("k", "a"))
	}()
	// Run for three leases: the extender fires every 10s.
	for range 9 {
		testutil.WaitFor(t, func() bool { return fake.Waiters() >= 1 })
		fake.Advance(10 * time.Second)
	}
	c, err := store.Claim(context.Background(), "k", "x", time.Second)
	if err != nil || c.State != dedup.InProgress {
		t.Fatalf("claim after 90s of a running handler: %+v, %v; want InProgress", c, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestGuardLostLeaseCancelsHandler(t *testing.T) {
	fake := clock.NewFake(time.Unix(1000, 0))
	store := &flakyStore{Store: memstore.New(fake), fail: map[string]bool{"extend": true}}
	g := newGuard(t, store, fake, false)
	done := make(chan error)
	go func() {
		done <- g.Wrap(func(ctx context.Context, _ *dedupq.Delivery) error {
			<-ctx.Done()
			return context.Cause(ctx)
		})(context.Background(), delivery("k", "a"))
	}()
	testutil.WaitFor(t, func() bool { return fake.Waiters() >= 1 })
	fake.Advance(10 * time.Second)
	if err := <-done; !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("handler ended with %v, want its context cancelled with ErrLeaseLost", err)
	}
}

func TestGuardStoreFailure(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		g := newGuard(t, &flakyStore{Store: memstore.New(nil), fail: map[string]bool{"claim": true}}, nil, failOpen)
		ran := false
		err := g.Wrap(func(context.Context, *dedupq.Delivery) error { ran = true; return nil })(context.Background(), delivery("k", "a"))
		if failOpen {
			if err != nil || !ran || g.Stats().Bypassed != 1 {
				t.Errorf("fail-open: err = %v, ran = %v, stats = %+v", err, ran, g.Stats())
			}
			continue
		}
		if !errors.Is(err, dedup.ErrStoreUnavailable) || !errors.Is(err, errDown) || ran {
			t.Errorf("fail-closed: err = %v, ran = %v; want a nack without running", err, ran)
		}
	}
}

func TestGuardCompletionFailureAcksAndCounts(t *testing.T) {
	g := newGuard(t, &flakyStore{Store: memstore.New(nil), fail: map[string]bool{"complete": true}}, nil, false)
	err := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })(context.Background(), delivery("k", "a"))
	if err != nil || g.Stats().Unrecorded != 1 {
		t.Fatalf("err = %v, stats = %+v; want an ack counted as unrecorded", err, g.Stats())
	}
}

func TestGuardReleasesOnPanic(t *testing.T) {
	store := memstore.New(nil)
	g := newGuard(t, store, nil, false)
	func() {
		defer func() { _ = recover() }()
		_ = g.Wrap(func(context.Context, *dedupq.Delivery) error { panic("boom") })(context.Background(), delivery("k", "a"))
	}()
	c, err := store.Claim(context.Background(), "k", "fp", time.Second)
	if err != nil || c.State != dedup.Acquired {
		t.Fatalf("claim after a panicking handler = %+v, %v; want the key free", c, err)
	}
}

func TestGuardConcurrentDeliveriesRunOnce(t *testing.T) {
	g := newGuard(t, memstore.New(nil), nil, false)
	var runs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { runs.Add(1); return nil })
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_ = h(context.Background(), delivery("k", "a"))
		}()
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	if s := g.Stats(); s.Ran+s.Suppressed+s.Deferred != 64 {
		t.Errorf("stats %+v do not add up to 64 deliveries", s)
	}
}

// TestGuardSettleTimeoutStartsAfterHandler: SettleTimeout bounds the
// completion or release made once the handler returned, so a handler that
// runs longer than it still has its success recorded, or its key freed.
func TestGuardSettleTimeoutStartsAfterHandler(t *testing.T) {
	tests := []struct {
		name      string
		handlerOK bool
		want      dedup.State // of the key, claimed again after
	}{
		{"success is recorded", true, dedup.Completed},
		{"failure frees the key", false, dedup.Acquired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := memstore.New(nil)
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour, SettleTimeout: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			_ = g.Wrap(func(context.Context, *dedupq.Delivery) error {
				// Outlasts SettleTimeout: what is tested is how long the
				// handler ran, nothing is waited for.
				time.Sleep(20 * time.Millisecond)
				if tt.handlerOK {
					return nil
				}
				return errors.New("handler failed")
			})(context.Background(), delivery("k", "a"))
			if s := g.Stats(); s.Unrecorded != 0 {
				t.Fatalf("stats %+v: the settle timed out with the handler's run", s)
			}
			c, err := store.Claim(context.Background(), "k", dedup.BodyFingerprint(&delivery("k", "a").Message), time.Minute)
			if err != nil || c.State != tt.want {
				t.Fatalf("claim after the handler: %+v, %v; want state %v", c, err, tt.want)
			}
		})
	}
}
