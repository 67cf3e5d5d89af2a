// These tests talk to the real Redis server at 127.0.0.1:6379 (override with
// DEDUPQ_REDIS_ADDR), as redisstore_test.go does, through a client hook that
// can hold back the reply to a claim: the command runs on the server at
// once, and the store sees the reply only when the test lets go — a reply
// slow to come back — or, if the context it was sent with ends first, that
// context's error, as go-redis's read deadline would give it.
package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/dedup/storetest"
)

// holdHook reports the keys of every claim (SET) it sees on sent, and holds
// the reply to the first command or pipeline that claims a key in held.
type holdHook struct {
	sent chan []string
	mu   sync.Mutex
	held map[string]chan struct{}
}

func newHoldHook() *holdHook {
	return &holdHook{sent: make(chan []string, 64), held: map[string]chan struct{}{}}
}

// hold makes the next claim of key (a Redis key) wait for the returned
// release.
func (h *holdHook) hold(key string) (release func()) {
	gate := make(chan struct{})
	h.mu.Lock()
	h.held[key] = gate
	h.mu.Unlock()
	return sync.OnceFunc(func() { close(gate) })
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if herr := h.wait(ctx, []redis.Cmder{cmd}); herr != nil {
			return herr
		}
		return err
	}
}

func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if herr := h.wait(ctx, cmds); herr != nil {
			return herr
		}
		return err
	}
}

func (h *holdHook) wait(ctx context.Context, cmds []redis.Cmder) error {
	var keys []string
	var gate chan struct{}
	h.mu.Lock()
	for _, c := range cmds {
		if a := c.Args(); len(a) > 1 && a[0] == "set" {
			k, _ := a[1].(string)
			keys = append(keys, k)
			if g := h.held[k]; g != nil {
				delete(h.held, k)
				gate = g
			}
		}
	}
	h.mu.Unlock()
	if keys != nil {
		h.sent <- keys
	}
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		for _, c := range cmds {
			c.SetErr(ctx.Err())
		}
		return ctx.Err()
	}
}

func (h *holdHook) nextSent(t *testing.T) []string {
	t.Helper()
	return storetest.Receive(t, "the next claim sent", h.sent)
}

func queued(t *testing.T, s *redisstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for redisstore.Queued(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", redisstore.Queued(s), n)
		}
		tm := time.NewTimer(time.Millisecond)
		<-tm.C
	}
}

// keyFree polls until key's record is gone (the claim was undone) — its
// lease is a minute, far longer than the poll — then checks that a claim
// acquires it.
func keyFree(t *testing.T, c *redis.Client, s *redisstore.Store, key string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := c.Exists(ctx, s.Key(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still held, by a claim whose caller was told it failed", key)
		}
		tm := time.NewTimer(10 * time.Millisecond)
		<-tm.C
	}
	if cl, err := s.Claim(ctx, key, "fp", time.Minute); err != nil || cl.State != dedup.Acquired {
		t.Fatalf("Claim of the freed key = %+v, %v; want acquired", cl, err)
	}
}

// A claim without a deadline shares a pipeline with a claim whose deadline
// passes while the pipeline is in flight. Each caller's result depends on
// its own context only: the one without a deadline gets its answer, the
// other its own deadline's error, and the SET NX the latter sent, which
// Redis applied, is released rather than left held under a token nobody
// has.
func TestPipelinedClaimDependsOnItsOwnContextOnly(t *testing.T) {
	c := connect(t, 10)
	hook := newHoldHook()
	c.AddHook(hook)
	s := newStore(t, c, redisstore.Options{Namespace: namespace(t, c), MaxInFlight: 1})
	kx, kl, ks := "x", "long", "short"
	releaseX, releaseL := hook.hold(s.Key(kx)), hook.hold(s.Key(kl))
	defer releaseX()
	defer releaseL()

	x := storetest.ClaimAsync(context.Background(), s, kx) // occupies the only slot
	if got := hook.nextSent(t); !slices.Equal(got, []string{s.Key(kx)}) {
		t.Fatalf("first pipeline %v, want [%s]", got, s.Key(kx))
	}
	long := storetest.ClaimAsync(context.Background(), s, kl)
	queued(t, s, 1)
	sctx, expire := storetest.DeadlineContext(time.Now().Add(2 * time.Second))
	defer expire()
	short := storetest.ClaimAsync(sctx, s, ks)
	queued(t, s, 2)
	releaseX()
	if got := hook.nextSent(t); !slices.Contains(got, s.Key(kl)) || !slices.Contains(got, s.Key(ks)) {
		t.Fatalf("second pipeline %v, want %s and %s together", got, s.Key(kl), s.Key(ks))
	}
	expire() // the short deadline passes while the pipeline is in flight
	if a := storetest.Receive(t, "the claim whose deadline passed", short); !errors.Is(a.Err, context.DeadlineExceeded) || errors.Is(a.Err, dedup.ErrStoreUnavailable) {
		t.Fatalf("claim with the passed deadline: %+v, %v; want its own context's error", a.Claim, a.Err)
	}
	releaseL()
	if a := storetest.Receive(t, "the claim without a deadline", long); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("claim without a deadline, pipelined with one whose deadline passed = %+v, %v; want acquired", a.Claim, a.Err)
	}
	if a := storetest.Receive(t, "the first claim", x); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("first claim = %+v, %v", a.Claim, a.Err)
	}
	keyFree(t, c, s, ks)
}

// A claim whose caller gives up while it is in flight returns its
// context's error at once, and the key is free again afterwards: the SET NX
// reached Redis, so the store must undo it. Pipelined, the caller is alone
// in its pipeline, which nobody then waits for; sent on its own, the call
// runs under the caller's context itself.
func TestClaimGivenUpInFlightIsUndone(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{
		{"Pipelined", 0},
		{"OneCallPerRoundTrip", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := connect(t, 10)
			hook := newHoldHook()
			c.AddHook(hook)
			s := newStore(t, c, redisstore.Options{Namespace: namespace(t, c), MaxBatch: tc.maxBatch})
			release := hook.hold(s.Key("gone"))
			defer release()
			ctx, expire := storetest.DeadlineContext(time.Now().Add(2 * time.Second))
			defer expire()
			ch := storetest.ClaimAsync(ctx, s, "gone")
			hook.nextSent(t)
			expire()
			if a := storetest.Receive(t, "the claim whose deadline passed", ch); !errors.Is(a.Err, context.DeadlineExceeded) || errors.Is(a.Err, dedup.ErrStoreUnavailable) {
				t.Fatalf("claim = %+v, %v; want its own context's error", a.Claim, a.Err)
			}
			// Redis's answer arrives after the caller left: the store
			// learns the claim was applied, and undoes it.
			release()
			keyFree(t, c, s, "gone")
		})
	}
}
