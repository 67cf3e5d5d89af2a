// This test starts real redis-server processes of its own on free loopback
// ports (never the shared one on 6379) and kills them. Without
// redis-server it skips, unless CI is set, when it fails.
package redisserver_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/internal/redisserver"
)

func TestStartAndKill(t *testing.T) {
	if err := redisserver.Installed(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("%v; skipping because CI is unset", err)
		}
		t.Fatalf("under CI: %v", err)
	}
	ctx := context.Background()
	s, err := redisserver.Start(ctx, t.TempDir(), "--appendonly", "yes")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	if got, err := c.ConfigGet(ctx, "appendonly").Result(); err != nil || got["appendonly"] != "yes" {
		t.Fatalf("CONFIG GET appendonly = %v, %v; want the extra argument applied", got, err)
	}
	if info, err := c.Info(ctx, "server").Result(); err != nil || !strings.Contains(info, "process_id:"+strconv.Itoa(s.PID())+"\r") {
		t.Fatalf("INFO server does not name pid %d: %v", s.PID(), err)
	}
	s.Kill()
	s.Kill() // a second kill does nothing
	select {
	case <-s.Exited():
	default:
		t.Fatal("Kill returned before the process exited")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("the killed server still answers")
	}
}
