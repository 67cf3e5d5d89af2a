// These tests talk to the real Redis server at 127.0.0.1:6379 (override with
// DEDUPQ_REDIS_ADDR). Without it they skip, unless CI is set, when they
// fail. Each run writes under its own random namespace and deletes its keys
// afterwards, so parallel runs on one server do not collide.
package redisstore_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/dedup/storetest"
)

var _ dedup.Store = (*redisstore.Store)(nil)

func redisAddr() string { return cmp.Or(os.Getenv("DEDUPQ_REDIS_ADDR"), "127.0.0.1:6379") }

// connect returns a client of the real server, closed when tb ends.
func connect(tb testing.TB, poolSize int) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(), PoolSize: poolSize})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		if os.Getenv("CI") == "" {
			tb.Skipf("Redis at %s is unreachable (%v); skipping because CI is unset", redisAddr(), err)
		}
		tb.Fatalf("Redis at %s is unreachable under CI: %v", redisAddr(), err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// namespace returns a namespace no other run uses, whose keys are deleted
// when tb ends.
func namespace(tb testing.TB, c *redis.Client) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	ns := "test-" + hex.EncodeToString(b[:])
	tb.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, "dedupq:"+ns+":*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		for len(keys) > 0 {
			n := min(len(keys), 500)
			c.Del(ctx, keys[:n]...)
			keys = keys[n:]
		}
	})
	return ns
}

func newStore(tb testing.TB, c redis.UniversalClient, o redisstore.Options) *redisstore.Store {
	tb.Helper()
	s, err := redisstore.New(c, o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	c := connect(t, 100)
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{
		{"Pipelined", 0},
		{"OneCallPerRoundTrip", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t, c)
			storetest.Run(t, func(t *testing.T) dedup.Store {
				return newStore(t, c, redisstore.Options{Namespace: ns, MaxBatch: tc.maxBatch})
			},
				storetest.WithDurations(500*time.Millisecond, 500*time.Millisecond))
		})
	}
}

func TestNamespacesAndKeyLayout(t *testing.T) {
	c := connect(t, 10)
	ctx := context.Background()
	nsA, nsB := namespace(t, c), namespace(t, c)
	a := newStore(t, c, redisstore.Options{Namespace: nsA})
	b := newStore(t, c, redisstore.Options{Namespace: nsB})
	for _, s := range []*redisstore.Store{a, b} {
		cl, err := s.Claim(ctx, "order-1", "fp", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if cl.State != dedup.Acquired {
			t.Fatalf("the same key in another namespace was %s, want acquired", cl.State)
		}
	}
	if got, want := a.Key("order-1"), "dedupq:"+nsA+":{order-1}"; got != want {
		t.Errorf("Key = %q, want %q (the dedup key as hash tag)", got, want)
	}
	if n := c.Exists(ctx, a.Key("order-1"), b.Key("order-1")).Val(); n != 2 {
		t.Errorf("%d records exist, want 2", n)
	}
	for _, o := range []redisstore.Options{{Namespace: "a{b"}, {Prefix: "x}"}} {
		if _, err := redisstore.New(c, o); err == nil {
			t.Errorf("New(%+v) accepted a brace", o)
		}
	}
}

func TestUnreachableIsStoreUnavailable(t *testing.T) {
	ctx := context.Background()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	closed := redis.NewClient(&redis.Options{Addr: redisAddr()})
	_ = closed.Close()
	t.Cleanup(func() { _ = dead.Close() })
	for _, tc := range []struct {
		name     string
		c        redis.UniversalClient
		maxBatch int
	}{
		{"RefusedPipelined", dead, 0},
		{"RefusedUnbatched", dead, 1},
		{"ClosedClient", closed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.c, redisstore.Options{MaxBatch: tc.maxBatch})
			_, err := s.Claim(ctx, "k", "fp", time.Second)
			if !errors.Is(err, dedup.ErrStoreUnavailable) {
				t.Errorf("Claim: err = %v, want ErrStoreUnavailable", err)
			}
			err = s.Complete(ctx, "k", strings.Repeat("0", 32)+"fp", time.Second, nil)
			if !errors.Is(err, dedup.ErrStoreUnavailable) {
				t.Errorf("Complete: err = %v, want ErrStoreUnavailable", err)
			}
		})
	}
}

// TestRestart restarts the consumer in the middle of processing: the first
// store instance claims and dies without completing; a new instance on a
// new connection finds the message in progress until the lease runs out,
// then processes it once, and the dead instance's token, should it come
// back, can no longer complete it.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	c := connect(t, 10)
	ns := namespace(t, c)
	const lease = 700 * time.Millisecond

	first := connect(t, 2)
	before := newStore(t, first, redisstore.Options{Namespace: ns})
	held, err := before.Claim(ctx, "msg", "fp", lease)
	if err != nil || held.State != dedup.Acquired {
		t.Fatalf("first claim = %+v, %v", held, err)
	}
	_ = first.Close() // the crash: no Complete, no Release

	after := newStore(t, connect(t, 2), redisstore.Options{Namespace: ns})
	var completions int
	var leaseUntil time.Time
	deadline := time.Now().Add(10 * time.Second)
	for {
		cl, err := after.Claim(ctx, "msg", "fp", lease)
		if err != nil {
			t.Fatal(err)
		}
		if cl.State == dedup.InProgress {
			leaseUntil = cl.LeaseUntil
		}
		if cl.State == dedup.Acquired {
			if leaseUntil.IsZero() {
				t.Fatalf("the restarted consumer acquired the message at once; the crashed one's lease should hold it")
			}
			if early := leaseUntil.Sub(time.Now()); early > 50*time.Millisecond {
				t.Fatalf("reprocessed %s before the crashed consumer's lease ended", early)
			}
			if err := after.Complete(ctx, "msg", cl.Token, time.Minute, nil); err != nil {
				t.Fatal(err)
			}
			completions++
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("message still %s long after the lease", cl.State)
		}
		tm := time.NewTimer(20 * time.Millisecond)
		<-tm.C
	}
	if err := after.Complete(ctx, "msg", held.Token, time.Minute, nil); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("the crashed consumer's Complete: err = %v, want ErrLeaseLost", err)
	}
	cl, err := after.Claim(ctx, "msg", "fp", lease)
	if err != nil || cl.State != dedup.Completed {
		t.Fatalf("after processing: %+v, %v; want completed", cl, err)
	}
	if completions != 1 {
		t.Fatalf("processed to completion %d times, want 1", completions)
	}
}
