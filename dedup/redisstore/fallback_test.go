// This test talks to the real Redis server at 127.0.0.1:6379 (override with
// DEDUPQ_REDIS_ADDR), as the external tests do, but runs the claim script
// that servers older than 7.0 get instead of SET NX GET.
package redisstore

import (
	"cmp"
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
	"github.com/dedupq/dedupq/dedup/storetest"
)

func TestConformanceClaimScript(t *testing.T) {
	addr := cmp.Or(os.Getenv("DEDUPQ_REDIS_ADDR"), "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 100})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("Redis at %s is unreachable (%v); skipping because CI is unset", addr, err)
		}
		t.Fatalf("Redis at %s is unreachable under CI: %v", addr, err)
	}
	ns := "test-script-" + claimtoken.New("")[:12]
	t.Cleanup(func() {
		keys, _ := c.Keys(context.Background(), "dedupq:"+ns+":*").Result()
		if len(keys) > 0 {
			c.Del(context.Background(), keys...)
		}
	})
	storetest.Run(t, func(t *testing.T) dedup.Store {
		s, err := New(c, Options{Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		s.noSetGet.Store(true)
		return s
	}, storetest.WithDurations(500*time.Millisecond, 500*time.Millisecond))
}
