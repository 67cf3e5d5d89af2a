// Package storetest is the conformance suite every dedup.Store must pass.
//
// A store's own test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		clk := clock.NewFake(time.Unix(1_700_000_000, 0))
//		storetest.Run(t, func(t *testing.T) dedup.Store { return memstore.New(clk) },
//			storetest.WithClock(clk))
//	}
//
// Leases and TTLs expire by time, and a store on a real server expires them
// by the server's clock, which a test cannot move. So the suite runs in one
// of two modes. With WithClock or WithFakeTime it moves a fake clock and
// never waits. Without them it uses short real durations (see WithDurations)
// and, where it can observe the condition it waits for, polls for it with a
// deadline; it only waits out the clock where a claim would disturb the
// state under test (a lapsed lease that nobody took over). Real-time cases
// run in parallel so that their waits overlap.
//
// Every case uses its own random keys, so stores may share state between
// cases and between runs (a Redis database, a PostgreSQL table).
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
)

// Option configures Run.
type Option func(*config)

type config struct {
	now     func() time.Time
	advance func(time.Duration)
	lease   time.Duration
	hold    time.Duration
	ttl     time.Duration
	racers  int
	skew    time.Duration
}

// WithClock runs the suite on a fake clock that the stores made by
// newStore read; the suite advances it instead of waiting.
func WithClock(c *clock.Fake) Option { return WithFakeTime(c.Now, c.Advance) }

// WithFakeTime is WithClock for a store whose time is moved some other way
// (miniredis's FastForward, say): now reads the store's time, advance moves
// it forward.
func WithFakeTime(now func() time.Time, advance func(time.Duration)) Option {
	return func(c *config) { c.now, c.advance = now, advance }
}

// WithDurations sets the lease and completion TTL used in real-time mode.
// Both should be long enough for a few round trips to the store under
// -race on a loaded machine and short enough to wait out; the defaults are
// 1s and 1s.
func WithDurations(lease, ttl time.Duration) Option {
	return func(c *config) { c.lease, c.ttl = lease, ttl }
}

// WithRacers sets how many goroutines race on one key (default 64).
func WithRacers(n int) Option { return func(c *config) { c.racers = n } }

// WithClockSkew bounds the difference between the test's clock and the
// store's in real-time mode, for checks of LeaseUntil (default 250ms).
func WithClockSkew(d time.Duration) Option { return func(c *config) { c.skew = d } }

// Run runs the conformance suite as subtests of t. newStore is called once
// per subtest; the stores it returns may share their backing state.
func Run(t *testing.T, newStore func(t *testing.T) dedup.Store, opts ...Option) {
	cfg := config{lease: time.Second, ttl: time.Second, racers: 64, skew: 250 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	fake := cfg.advance != nil
	if fake {
		// On a fake clock durations cost nothing, so make them long enough
		// that no real delay could ever lapse them by accident.
		cfg.lease, cfg.ttl, cfg.skew = time.Minute, time.Hour, 0
	}
	// Cases that do not test expiry claim and complete for much longer
	// than the lease and TTL, so that a slow machine cannot lapse a claim
	// or a completion under them (a completion that lapsed while 64
	// deliveries still looked at it let one run the handler again).
	cfg.hold = max(20*cfg.lease, 30*time.Second)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !fake {
				t.Parallel()
			}
			h := &harness{T: t, cfg: cfg, fake: fake, s: newStore(t), ctx: context.Background()}
			tc.run(h)
		})
	}
}

// harness is what one case works with.
type harness struct {
	*testing.T
	cfg  config
	fake bool
	s    dedup.Store
	ctx  context.Context
}

func (h *harness) now() time.Time {
	if h.cfg.now != nil {
		return h.cfg.now()
	}
	return time.Now()
}

// key returns a key no other case or run uses.
func (h *harness) key() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "storetest/" + h.Name() + "/" + hex.EncodeToString(b[:])
}

func (h *harness) claim(key, fp string, lease time.Duration) dedup.Claim {
	h.Helper()
	c, err := h.s.Claim(h.ctx, key, fp, lease)
	if err != nil {
		h.Fatalf("Claim(%q, %q, %s): %v", key, fp, lease, err)
	}
	return c
}

// acquire claims a free key for longer than any case runs and checks that
// it was Acquired.
func (h *harness) acquire(key, fp string) dedup.Claim {
	h.Helper()
	return h.acquireFor(key, fp, h.cfg.hold)
}

// acquireFor is acquire with a lease of the case's choosing.
func (h *harness) acquireFor(key, fp string, lease time.Duration) dedup.Claim {
	h.Helper()
	c := h.claim(key, fp, lease)
	if c.State != dedup.Acquired || c.Token == "" {
		h.Fatalf("Claim on a free key = %s with token %q, want acquired with a token", c.State, c.Token)
	}
	return c
}

func (h *harness) want(key, fp string, want dedup.State, wantFP string) dedup.Claim {
	h.Helper()
	c := h.claim(key, fp, h.cfg.hold)
	if c.State != want {
		h.Fatalf("Claim = %s, want %s", c.State, want)
	}
	if want != dedup.Acquired && c.Fingerprint != wantFP {
		h.Fatalf("Claim = %s with fingerprint %q, want %q", c.State, c.Fingerprint, wantFP)
	}
	if want != dedup.Acquired && c.Token != "" {
		h.Fatalf("Claim = %s handed out token %q; only Acquired may", c.State, c.Token)
	}
	return c
}

// pass moves time forward by d: the fake clock in fake mode, the wall clock
// otherwise. Real-time callers use it only where no condition can be
// polled without changing the state under test.
func (h *harness) pass(d time.Duration) {
	if h.fake {
		h.cfg.advance(d)
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// expire makes key's current lease or completion lapse. In real-time mode
// it polls until a claim succeeds, which also takes the key over, so it
// returns that claim; in fake mode it advances past d and claims.
func (h *harness) expire(key, fp string, d time.Duration) dedup.Claim {
	h.Helper()
	if h.fake {
		h.cfg.advance(d + time.Millisecond)
		return h.acquire(key, fp)
	}
	deadline := time.Now().Add(10*d + 10*time.Second)
	for {
		c := h.claim(key, fp, h.cfg.hold)
		if c.State == dedup.Acquired {
			return c
		}
		if time.Now().After(deadline) {
			h.Fatalf("key still %s long after its %s ran out", c.State, d)
		}
		h.pass(min(d/20, 50*time.Millisecond))
	}
}

func (h *harness) wantErr(op string, err, want error) {
	h.Helper()
	if !errors.Is(err, want) {
		h.Fatalf("%s: err = %v, want %v", op, err, want)
	}
}

func (h *harness) noErr(op string, err error) {
	h.Helper()
	if err != nil {
		h.Fatalf("%s: %v", op, err)
	}
}

type testCase struct {
	name string
	run  func(h *harness)
}

// ops are the token-checked calls, for the cases that must hold for each.
var ops = []struct {
	name string
	call func(h *harness, key, token string) error
}{
	{"Extend", func(h *harness, key, token string) error { return h.s.Extend(h.ctx, key, token, h.cfg.lease) }},
	{"Complete", func(h *harness, key, token string) error {
		return h.s.Complete(h.ctx, key, token, h.cfg.hold, []byte("zombie"))
	}},
	{"Release", func(h *harness, key, token string) error { return h.s.Release(h.ctx, key, token) }},
}

var cases = []testCase{
	{"ClaimFreeKeyAcquires", func(h *harness) {
		k := h.key()
		a := h.acquire(k, "fp-a")
		b := h.acquire(h.key(), "fp-a")
		if a.Token == b.Token {
			h.Fatalf("two claims got the same token %q", a.Token)
		}
	}},
	{"SecondClaimIsInProgress", func(h *harness) {
		k := h.key()
		before := h.now()
		h.acquire(k, "fp-first")
		after := h.now()
		// A different fingerprint must not matter to the answer, and the
		// stored one must be reported so that the Guard can see the
		// mismatch.
		for _, fp := range []string{"fp-first", "fp-other"} {
			c := h.want(k, fp, dedup.InProgress, "fp-first")
			lo, hi := before.Add(h.cfg.hold-h.cfg.skew), after.Add(h.cfg.hold+h.cfg.skew)
			if c.LeaseUntil.Before(lo) || c.LeaseUntil.After(hi) {
				h.Fatalf("LeaseUntil = %s, want within [%s, %s]", c.LeaseUntil, lo, hi)
			}
		}
	}},
	{"CompleteThenClaimIsCompleted", func(h *harness) {
		for _, tc := range []struct {
			name   string
			result []byte
		}{
			{"NoResult", nil},
			{"Result", []byte("order 42 charged")},
			{"BinaryResult", []byte{0, 1, 2, 0xff, 0}},
		} {
			k := h.key()
			a := h.acquire(k, "fp-x")
			h.noErr(tc.name+": Complete", h.s.Complete(h.ctx, k, a.Token, h.cfg.hold, tc.result))
			for _, fp := range []string{"fp-x", "fp-y"} {
				c := h.want(k, fp, dedup.Completed, "fp-x")
				if !bytes.Equal(c.Result, tc.result) {
					h.Fatalf("%s: Result = %q, want %q", tc.name, c.Result, tc.result)
				}
			}
		}
	}},
	{"ReleaseFreesKey", func(h *harness) {
		k := h.key()
		a := h.acquire(k, "fp-1")
		h.noErr("Release", h.s.Release(h.ctx, k, a.Token))
		b := h.acquire(k, "fp-2")
		if b.Token == a.Token {
			h.Fatalf("reclaim after Release reused token %q", a.Token)
		}
		h.want(k, "fp-3", dedup.InProgress, "fp-2")
		// The old token no longer owns anything.
		h.wantErr("Complete with the released token", h.s.Complete(h.ctx, k, a.Token, h.cfg.hold, nil), dedup.ErrLeaseLost)
		h.want(k, "fp-3", dedup.InProgress, "fp-2")
	}},
	{"WrongTokenChangesNothing", func(h *harness) {
		for _, op := range ops {
			k := h.key()
			a := h.acquire(k, "fp-holder")
			other := h.acquire(h.key(), "fp-holder") // a real token, for another key
			h.wantErr(op.name+" with another key's token", op.call(h, k, other.Token), dedup.ErrLeaseLost)
			h.want(k, "fp-new", dedup.InProgress, "fp-holder")
			h.noErr("Complete by the holder", h.s.Complete(h.ctx, k, a.Token, h.cfg.hold, nil))
			h.want(k, "fp-new", dedup.Completed, "fp-holder")
		}
	}},
	{"ExtendKeepsLease", func(h *harness) {
		// Renewed at 60% of the lease, the claim outlives its first lease:
		// a holder that extends is never taken over. On the wall clock the
		// look at 120% proves that only if it was answered before the
		// renewed lease could end (a lease after the Extend was sent); a
		// run the scheduler stalled past that proves nothing either way, so
		// it is repeated on a fresh key, a bounded number of times. A
		// wrong answer inside the lease fails at once.
		for try := 1; ; try++ {
			k := h.key()
			a := h.acquireFor(k, "fp", h.cfg.lease)
			h.pass(h.cfg.lease * 6 / 10)
			extendSent := h.now()
			h.noErr("Extend", h.s.Extend(h.ctx, k, a.Token, h.cfg.lease))
			h.pass(h.cfg.lease * 6 / 10)
			c := h.claim(k, "fp-2", h.cfg.hold)
			if !h.fake && h.now().Sub(extendSent) >= h.cfg.lease {
				if try == 5 {
					h.Fatalf("5 tries, each stalled past the %s lease between Extend and the look: the machine is too slow to observe a renewed lease", h.cfg.lease)
				}
				h.Logf("try %d: the look came %s after Extend, past the lease: inconclusive, trying again", try, h.now().Sub(extendSent))
				continue
			}
			if c.State != dedup.InProgress || c.Fingerprint != "fp" {
				h.Fatalf("Claim %s after an Extend = %s with fingerprint %q, want in progress with %q",
					h.cfg.lease*6/10, c.State, c.Fingerprint, "fp")
			}
			h.noErr("Complete", h.s.Complete(h.ctx, k, a.Token, h.cfg.hold, nil))
			h.want(k, "fp-2", dedup.Completed, "fp")
			return
		}
	}},
	{"LeaseExpiryLetsAnotherAcquire", func(h *harness) {
		for _, op := range ops {
			k := h.key()
			a := h.acquireFor(k, "fp-a", h.cfg.lease)
			b := h.expire(k, "fp-b", h.cfg.lease)
			if b.Token == a.Token {
				h.Fatalf("takeover reused token %q", a.Token)
			}
			// The first holder, back from a pause, must not touch the
			// new holder's record.
			h.wantErr("first holder's "+op.name+" after takeover", op.call(h, k, a.Token), dedup.ErrLeaseLost)
			h.want(k, "fp-c", dedup.InProgress, "fp-b")
			h.noErr("Complete by the new holder", h.s.Complete(h.ctx, k, b.Token, h.cfg.hold, []byte("b")))
			c := h.want(k, "fp-c", dedup.Completed, "fp-b")
			if string(c.Result) != "b" {
				h.Fatalf("Result = %q, want the new holder's %q", c.Result, "b")
			}
		}
	}},
	{"LapsedLeaseWithoutTakeoverIsStillOwned", func(h *harness) {
		for _, tc := range []struct {
			name string
			op   func(h *harness, key, token string) error
			then dedup.State
		}{
			{"Extend", func(h *harness, key, token string) error { return h.s.Extend(h.ctx, key, token, h.cfg.hold) }, dedup.InProgress},
			{"Complete", func(h *harness, key, token string) error {
				return h.s.Complete(h.ctx, key, token, h.cfg.hold, []byte("late"))
			}, dedup.Completed},
		} {
			k := h.key()
			a := h.acquireFor(k, "fp-late", h.cfg.lease)
			// Nothing can observe the lapse without claiming the key,
			// which would be the takeover this case excludes: wait it out.
			h.pass(h.cfg.lease + h.cfg.lease/2)
			h.noErr(tc.name+" after the lease lapsed, without takeover", tc.op(h, k, a.Token))
			c := h.want(k, "fp-other", tc.then, "fp-late")
			if tc.then == dedup.Completed && string(c.Result) != "late" {
				h.Fatalf("Result = %q, want %q", c.Result, "late")
			}
		}
	}},
	{"CompletionExpiresAfterTTL", func(h *harness) {
		k := h.key()
		a := h.acquire(k, "fp-old")
		h.noErr("Complete", h.s.Complete(h.ctx, k, a.Token, h.cfg.ttl, []byte("old")))
		h.want(k, "fp-old", dedup.Completed, "fp-old")
		if h.fake {
			// Just before the TTL ends the key is still remembered.
			h.pass(h.cfg.ttl - time.Second)
			h.want(k, "fp-old", dedup.Completed, "fp-old")
			h.expire(k, "fp-new", time.Second)
		} else {
			h.expire(k, "fp-new", h.cfg.ttl)
		}
		h.want(k, "fp-x", dedup.InProgress, "fp-new")
		// The completion's old token is as dead as its record.
		h.wantErr("Release with the expired completion's token", h.s.Release(h.ctx, k, a.Token), dedup.ErrLeaseLost)
	}},
	{"ConcurrentClaimsOneWinner", func(h *harness) {
		k := h.key()
		n := h.cfg.racers
		var acquired, inProgress atomic.Int32
		start := make(chan struct{})
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				c, err := h.s.Claim(h.ctx, k, "fp", h.cfg.hold)
				switch {
				case err != nil:
					errs <- err
				case c.State == dedup.Acquired:
					acquired.Add(1)
				case c.State == dedup.InProgress:
					inProgress.Add(1)
				default:
					errs <- fmt.Errorf("racer %d got %s", i, c.State)
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			h.Errorf("racing Claim: %v", err)
		}
		if acquired.Load() != 1 || int(inProgress.Load()) != n-1 {
			h.Fatalf("%d racing claims: %d acquired, %d in progress; want 1 and %d", n, acquired.Load(), inProgress.Load(), n-1)
		}
	}},
	{"ConcurrentDeliveriesRunOnce", func(h *harness) {
		// Each goroutine is a delivery of the same message going through
		// the Guard's order: claim, run, complete; a delivery that finds the
		// key in progress is nacked and comes back, until it finds the key
		// completed.
		k := h.key()
		n := h.cfg.racers
		var runs, skipped atomic.Int32
		// How long each run's Claim and Complete took, for the failure
		// message: a winner slow to complete (a store that keeps it busy
		// answering the other deliveries, say) shows here.
		var mu sync.Mutex
		var timings []string
		start := make(chan struct{})
		began := time.Now()
		errs := make(chan error, n)
		var wg sync.WaitGroup
		deadline := time.Now().Add(30 * time.Second)
		for range n {
			wg.Go(func() {
				<-start
				for time.Now().Before(deadline) {
					t0 := time.Now()
					c, err := h.s.Claim(h.ctx, k, "fp", h.cfg.hold)
					if err != nil {
						errs <- err
						return
					}
					switch c.State {
					case dedup.Acquired:
						runs.Add(1)
						t1 := time.Now()
						err := h.s.Complete(h.ctx, k, c.Token, h.cfg.hold, nil)
						if err != nil {
							errs <- err
						}
						mu.Lock()
						timings = append(timings, fmt.Sprintf("claimed at %s in %s, completed in %s",
							t0.Sub(began).Round(time.Millisecond), t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond)))
						mu.Unlock()
						return
					case dedup.Completed:
						skipped.Add(1)
						return
					}
					// Redelivery after a nack: the store gives no signal to
					// wait on, so back off briefly as a broker would.
					t := time.NewTimer(5 * time.Millisecond)
					<-t.C
				}
				errs <- errors.New("delivery never saw the key completed")
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			h.Errorf("delivery: %v", err)
		}
		if runs.Load() != 1 || int(skipped.Load()) != n-1 {
			h.Fatalf("%d concurrent deliveries: handler ran %d times, %d skipped; want 1 and %d (runs: %v)", n, runs.Load(), skipped.Load(), n-1, timings)
		}
	}},
	{"CancelledContext", func(h *harness) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := h.s.Claim(ctx, h.key(), "fp", h.cfg.lease); err == nil {
			h.Fatalf("Claim with a cancelled context succeeded")
		}
	}},
}
