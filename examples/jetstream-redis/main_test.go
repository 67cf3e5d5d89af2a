package main

// Runs the program against the local NATS server (127.0.0.1:4222) and the
// local Redis (127.0.0.1:6379), on the program's own URL with the stream,
// subject and durable renamed so that parallel runs do not meet. Skipped
// outside CI when either is unreachable; failed under CI.

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/examples/internal/need"
)

func TestRun(t *testing.T) {
	need.Service(t, "NATS", "127.0.0.1:4222")
	need.Service(t, "Redis", "127.0.0.1:6379")
	id := need.Suffix()
	stream := "EXJR" + id
	url := strings.NewReplacer("/ORDERS?", "/"+stream+"?", "subject=orders", "subject=exjr"+id, "durable=billing", "durable=billing"+id).Replace(queueURL)
	if url == queueURL || !strings.Contains(url, "durable=billing"+id) {
		t.Fatalf("the test could not rename the stream in %s", queueURL)
	}
	t.Cleanup(func() { deleteStream(t, stream) })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	orderID := "order-" + id
	store, err := redisstore.New(rdb, redisstore.Options{Namespace: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Del(context.Background(), store.Key(orderID)) })

	// run fails unless the handler saw the order.
	if err := run(ctx, url, rdb, orderID); err != nil {
		t.Fatalf("run: %v", err)
	}
	// The guard recorded it in Redis, for the TTL the program gave.
	ttl, err := rdb.PTTL(ctx, store.Key(orderID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 23*time.Hour || ttl > 24*time.Hour {
		t.Errorf("the order's key %s expires in %s, want a day", store.Key(orderID), ttl)
	}
}

// deleteStream removes the test's stream from the shared server.
func deleteStream(t *testing.T, name string) {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Logf("deleting stream %s: %v", name, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, name); err != nil {
		t.Logf("deleting stream %s: %v", name, err)
	}
}
