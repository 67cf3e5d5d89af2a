// Guard tests for empty keys, store outages and the readiness check, over
// the in-memory store and stores that fail on demand: no services.
package dedup_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// logRecorder is a slog.Handler that keeps every record's level and
// message.
type logRecorder struct {
	mu   sync.Mutex
	recs []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Level.String()+" "+rec.Message)
	return nil
}

// count is how many records contain substr.
func (r *logRecorder) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.recs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func TestGuardRefusesEmptyKey(t *testing.T) {
	tests := []struct {
		name string
		key  func(*dedupq.Delivery) string // nil: the default key
		id   string
	}{
		{"message without a dedup ID, default key", nil, ""},
		{"custom Key returning empty", func(*dedupq.Delivery) string { return "" }, "has-an-id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &logRecorder{}
			store := memstore.New(nil)
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour, Key: tt.key, Logger: slog.New(rec)})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			h := g.Wrap(func(context.Context, *dedupq.Delivery) error { runs++; return nil })
			// Different bodies: under a shared key "" the first would run,
			// the others would be terminated as conflicts.
			for i, body := range []string{"a", "b", "a"} {
				err := h(context.Background(), delivery(tt.id, body))
				if !errors.Is(err, dedup.ErrEmptyKey) || dedupq.IsPermanent(err) || errors.Is(err, dedup.ErrFingerprintMismatch) {
					t.Fatalf("delivery %d: err = %v; want a nack (not permanent) matching ErrEmptyKey", i, err)
				}
			}
			if runs != 0 {
				t.Errorf("the handler ran %d times for deliveries without a key", runs)
			}
			if s := g.Stats(); s.EmptyKey != 3 || s.Ran+s.Suppressed+s.Conflicts != 0 {
				t.Errorf("stats = %+v; want 3 empty keys and nothing else", s)
			}
			if store.Len() != 0 {
				t.Errorf("the store holds %d records; an empty key must never be claimed", store.Len())
			}
			if rec.count("empty dedup key") != 3 {
				t.Errorf("log = %q; want one line per refused delivery", rec.recs)
			}
		})
	}
}

// switchStore fails every Claim while down is set.
type switchStore struct {
	dedup.Store
	down atomic.Bool
}

func (s *switchStore) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	if s.down.Load() {
		return dedup.Claim{}, errors.Join(dedup.ErrStoreUnavailable, errDown)
	}
	return s.Store.Claim(ctx, key, fp, lease)
}

func TestGuardStoreOutageCountedAndLoggedOnce(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(map[bool]string{false: "fail-closed", true: "fail-open"}[failOpen], func(t *testing.T) {
			rec := &logRecorder{}
			store := &switchStore{Store: memstore.New(nil)}
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour, FailOpen: failOpen, Logger: slog.New(rec)})
			if err != nil {
				t.Fatal(err)
			}
			h := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })
			next := 0
			deliver := func(n int) {
				for range n {
					next++
					err := h(context.Background(), delivery("k"+string(rune('a'+next)), "body"))
					if !failOpen && store.down.Load() != errors.Is(err, dedup.ErrStoreUnavailable) {
						t.Fatalf("delivery %d (store down: %v): err = %v", next, store.down.Load(), err)
					}
				}
			}
			for outage := 1; outage <= 2; outage++ {
				store.down.Store(true)
				deliver(5)
				store.down.Store(false)
				deliver(3)
				if got := rec.count("store unavailable"); got != outage {
					t.Fatalf("after outage %d: %d outage lines in %q; want one per outage", outage, got, rec.recs)
				}
				if got := rec.count("store answering again"); got != outage {
					t.Fatalf("after outage %d: %d recovery lines in %q; want one per outage", outage, got, rec.recs)
				}
			}
			s := g.Stats()
			if failOpen {
				if s.Bypassed != 10 || s.Unavailable != 0 || s.Ran != 6 {
					t.Errorf("stats = %+v; want 10 bypassed, 6 ran", s)
				}
				return
			}
			if s.Unavailable != 10 || s.Ran != 6 {
				t.Errorf("stats = %+v; want 10 unavailable, 6 ran", s)
			}
		})
	}
}

func TestGuardClaimCancelledIsNoOutage(t *testing.T) {
	rec := &logRecorder{}
	store := &switchStore{Store: memstore.New(nil)}
	store.down.Store(true)
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour, Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })(ctx, delivery("k", "a")); err == nil {
		t.Fatal("a failed claim was acked")
	}
	if s := g.Stats(); s.Unavailable != 0 || len(rec.recs) != 0 {
		t.Errorf("stats = %+v, log = %q; a consumer shutting down is not a store outage", s, rec.recs)
	}
}

// checkStore is a store whose readiness check returns err.
type checkStore struct {
	dedup.Store
	err error
}

func (s checkStore) Check(context.Context) error { return s.err }

var errNoTable = errors.New("table missing; call EnsureSchema")

func TestGuardCheck(t *testing.T) {
	unreachable := errors.Join(dedup.ErrStoreUnavailable, errDown)
	tests := []struct {
		name     string
		store    dedup.Store
		failOpen bool
		want     error // nil: ready
	}{
		{"store without a check is ready", memstore.New(nil), false, nil},
		{"ready store", checkStore{memstore.New(nil), nil}, false, nil},
		{"unreachable store", checkStore{memstore.New(nil), unreachable}, false, errDown},
		{"store not set up", checkStore{memstore.New(nil), errNoTable}, false, errNoTable},
		{"unreachable store, fail-open runs without it", checkStore{memstore.New(nil), unreachable}, true, nil},
		{"store not set up, fail-open still fails", checkStore{memstore.New(nil), errNoTable}, true, errNoTable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: tt.store, TTL: time.Hour, FailOpen: tt.failOpen, Logger: slog.New(&logRecorder{})})
			if err != nil {
				t.Fatal(err)
			}
			var c dedupq.Checker = g
			err = c.Check(context.Background())
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, dedup.ErrNotReady) || !errors.Is(err, tt.want) {
				t.Fatalf("Check = %v, want ErrNotReady wrapping %v", err, tt.want)
			}
		})
	}
}
