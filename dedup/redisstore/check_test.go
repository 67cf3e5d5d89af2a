// Readiness check tests. They talk to the real Redis server at
// 127.0.0.1:6379 (see connect: skipped without it unless CI is set), to a
// closed port on loopback that nothing listens on, and to the in-process
// mem broker for the consumer's startup.
package redisstore_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

func TestCheckReady(t *testing.T) {
	c := connect(t, 4)
	ns := namespace(t, c)
	s := newStore(t, c, redisstore.Options{Namespace: ns})
	ctx := context.Background()
	// A record already under the probe's key must survive the check.
	keys, err := c.Keys(ctx, "dedupq:"+ns+":*").Result()
	if err != nil || len(keys) != 0 {
		t.Fatalf("fresh namespace holds %v (%v)", keys, err)
	}
	probe := s.Key(redisstore.CheckKey)
	start := time.Now()
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check on a live Redis = %v", err)
	}
	keys, _ = c.Keys(ctx, "dedupq:"+ns+":*").Result()
	if len(keys) > 1 || len(keys) == 1 && keys[0] != probe {
		t.Fatalf("after Check the namespace holds %q; want only the probe %q", keys, probe)
	}
	// The probe lives a second: on a slow machine it may be gone already,
	// which only a second or more since the check began explains.
	switch ttl := c.PTTL(ctx, probe).Val(); {
	case ttl == -2*time.Nanosecond: // no such key (go-redis keeps Redis's -2 as is)
		if since := time.Since(start); since < time.Second {
			t.Errorf("probe key gone %s after the check began; want it to live a second", since)
		}
	case ttl <= 0 || ttl > time.Second:
		t.Errorf("probe key %q expires in %s; want at most a second", probe, ttl)
	}
	keys = []string{probe}
	if err := c.Set(ctx, keys[0], "keep", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("second Check = %v", err)
	}
	if v := c.Get(ctx, keys[0]).Val(); v != "keep" {
		t.Errorf("Check overwrote an existing key: %q", v)
	}
	// Claims still work after the check.
	if cl, err := s.Claim(ctx, "k", "fp", time.Second); err != nil || cl.State != dedup.Acquired {
		t.Errorf("Claim after Check = %+v, %v", cl, err)
	}
}

func TestCheckUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1})
	defer c.Close()
	s := newStore(t, c, redisstore.Options{})
	err := s.Check(context.Background())
	if !errors.Is(err, dedup.ErrStoreUnavailable) || !strings.Contains(err.Error(), "cannot reach Redis") {
		t.Fatalf("Check on a closed port = %v; want ErrStoreUnavailable saying Redis cannot be reached", err)
	}
}

// TestConsumerStartupFailsOnDeadRedis: a consumer whose dedup store is a
// Redis that is not there fails at OpenConsumer (and NewConsumer), with an
// error that says so, instead of starting and nacking every delivery.
func TestConsumerStartupFailsOnDeadRedis(t *testing.T) {
	addr := closedAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: newStore(t, c, redisstore.Options{}), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b := mem.NewBroker(mem.Options{MaxDeliveries: 5})
	tests := []struct {
		name string
		open func(context.Context) (*dedupq.Consumer, error)
	}{
		{"NewConsumer", func(ctx context.Context) (*dedupq.Consumer, error) {
			sub := b.Subscription("orders")
			defer sub.Close()
			return dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Dedup: g})
		}},
		{"OpenConsumer", func(ctx context.Context) (*dedupq.Consumer, error) {
			return dedupq.OpenConsumer(ctx, "mem://"+strings.ReplaceAll(t.Name(), "/", "-")+"?max_deliveries=5", dedupq.ConsumerOptions{Dedup: g})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			con, err := tt.open(ctx)
			if err == nil {
				con.Close(context.Background())
				t.Fatal("the consumer started with a dedup store on a closed port")
			}
			if !errors.Is(err, dedup.ErrNotReady) || !errors.Is(err, dedup.ErrStoreUnavailable) || !strings.Contains(err.Error(), addr) {
				t.Fatalf("err = %v; want ErrNotReady and ErrStoreUnavailable naming %s", err, addr)
			}
			t.Log(err)
		})
	}
}
