// These tests talk to a real Redis Cluster that each test starts for
// itself: three masters (redis-server --cluster-enabled yes on free
// loopback ports, joined by redis-cli --cluster create) in a temporary
// directory, stopped by PID when the test ends. They never touch the shared
// Redis on 6379. Without redis-server and redis-cli they skip, unless CI is
// set, when they fail.
package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/dedup/storetest"
	"github.com/dedupq/dedupq/internal/redisserver"
)

// startCluster starts a private cluster for t and returns it with a
// client, both stopped when t ends. set, if any, adjust the client's
// options.
func startCluster(t *testing.T, o redisserver.ClusterOptions, set ...func(*redis.ClusterOptions)) (*redisserver.Cluster, *redis.ClusterClient) {
	t.Helper()
	if err := redisserver.Installed(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("no Redis Cluster test: %v; skipping because CI is unset", err)
		}
		t.Fatalf("no Redis Cluster test under CI: %v", err)
	}
	start := time.Now()
	c, err := redisserver.StartCluster(context.Background(), t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	t.Logf("cluster of %d nodes up in %s", len(c.Nodes), time.Since(start).Round(time.Millisecond))
	co := &redis.ClusterOptions{Addrs: c.Addrs(), PoolSize: 100}
	for _, f := range set {
		f(co)
	}
	rdb := redis.NewClusterClient(co)
	t.Cleanup(func() { _ = rdb.Close() })
	return c, rdb
}

func TestClusterConformance(t *testing.T) {
	t.Parallel()
	_, rdb := startCluster(t, redisserver.ClusterOptions{})
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{
		{"Pipelined", 0},
		{"OneCallPerRoundTrip", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) dedup.Store {
				return newStore(t, rdb, redisstore.Options{Namespace: tc.name, MaxBatch: tc.maxBatch})
			},
				storetest.WithDurations(500*time.Millisecond, 500*time.Millisecond))
		})
	}
}

// keyHook records the key of every store command sent through the client
// it is added to (one node's, for a cluster), and how many store commands
// each pipeline carried (the client's own, such as CLIENT SETINFO on a new
// connection, are left out).
type keyHook struct {
	mu        sync.Mutex
	keys      []string
	pipelines []int
}

func (h *keyHook) record(cmds []redis.Cmder) (n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		if k := commandKey(c.Args()); k != "" {
			h.keys = append(h.keys, k)
			n++
		}
	}
	return n
}

// commandKey is the key a store command names: SET's first argument, or
// the only key of a script run.
func commandKey(args []any) string {
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "set":
		k, _ := args[1].(string)
		return k
	case "eval", "evalsha":
		if fmt.Sprint(args[2]) != "1" {
			return fmt.Sprintf("<%v keys>", args[2])
		}
		k, _ := args[3].(string)
		return k
	}
	return ""
}

func (h *keyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *keyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *keyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := h.record(cmds); n > 0 {
			h.mu.Lock()
			h.pipelines = append(h.pipelines, n)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// nodeHooks adds a keyHook to every node client of rdb, by address.
func nodeHooks(rdb *redis.ClusterClient) func(addr string) *keyHook {
	var mu sync.Mutex
	hooks := map[string]*keyHook{}
	rdb.OnNewNode(func(c *redis.Client) {
		h := &keyHook{}
		c.AddHook(h)
		mu.Lock()
		hooks[c.Options().Addr] = h
		mu.Unlock()
	})
	return func(addr string) *keyHook {
		mu.Lock()
		defer mu.Unlock()
		return hooks[addr]
	}
}

// TestClusterKeySlots checks that everything the store sends for one dedup
// key names one Redis key, in the slot of the dedup key alone (the hash
// tag), whatever the prefix and namespace, and that such keys spread over
// every master.
func TestClusterKeySlots(t *testing.T) {
	t.Parallel()
	c, rdb := startCluster(t, redisserver.ClusterOptions{})
	hookOf := nodeHooks(rdb)
	ctx := context.Background()
	slot := func(key string) int64 {
		t.Helper()
		n, err := rdb.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	stores := []*redisstore.Store{
		newStore(t, rdb, redisstore.Options{}),
		newStore(t, rdb, redisstore.Options{Namespace: "tenant-b"}),
		newStore(t, rdb, redisstore.Options{Prefix: "other:", Namespace: "x"}),
	}
	for _, key := range []string{"order-1", "order-2", "msg:7f3a", "ünïcode/键", "with space", strings.Repeat("long", 200)} {
		want := slot(key) // no braces in key: its slot is its own
		for _, s := range stores {
			if got := slot(s.Key(key)); got != want {
				t.Errorf("%q: slot %d, want %d, the dedup key's own", s.Key(key), got, want)
			}
			// Every operation on the key, recorded on the node it went to.
			cl, err := s.Claim(ctx, key, "fp", time.Minute)
			if err != nil || cl.State != dedup.Acquired {
				t.Fatalf("Claim(%q) = %+v, %v", key, cl, err)
			}
			for _, op := range []error{
				s.Extend(ctx, key, cl.Token, time.Minute),
				s.Complete(ctx, key, cl.Token, time.Minute, []byte("r")),
				s.Release(ctx, key, cl.Token),
			} {
				if op != nil {
					t.Fatalf("%q: %v", key, op)
				}
			}
		}
	}
	// A dedup key with braces of its own still makes one Redis key per
	// operation; its slot is the one of the first {…} Redis finds.
	s := stores[0]
	for _, key := range []string{"a}b", "{x}", "{", "}{"} {
		cl, err := s.Claim(ctx, key, "fp", time.Minute)
		if err != nil || cl.State != dedup.Acquired {
			t.Fatalf("Claim(%q) = %+v, %v", key, cl, err)
		}
		if err := s.Complete(ctx, key, cl.Token, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever each node saw was a key of its own slots (go-redis routes
	// by the key; Redis would answer MOVED otherwise and the call would
	// have failed above), and one key per dedup key.
	byKey := map[string]map[string]bool{}
	for _, addr := range c.Addrs() {
		h := hookOf(addr)
		if h == nil {
			continue
		}
		h.mu.Lock()
		for _, k := range h.keys {
			if byKey[k] == nil {
				byKey[k] = map[string]bool{}
			}
			byKey[k][addr] = true
			if strings.HasPrefix(k, "<") {
				t.Errorf("a script ran with %s", k)
			}
		}
		h.mu.Unlock()
	}
	for k, nodes := range byKey {
		if len(nodes) != 1 {
			t.Errorf("%q went to %d nodes", k, len(nodes))
		}
	}

	// 300 keys land on every master, roughly a third each.
	perMaster := map[string]int{}
	for i := range 300 {
		m, err := rdb.MasterForKey(ctx, s.Key(fmt.Sprintf("spread-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		perMaster[m.Options().Addr]++
	}
	t.Logf("300 dedup keys per master: %v", perMaster)
	if len(perMaster) != c.Masters {
		t.Fatalf("300 dedup keys landed on %d masters, want %d", len(perMaster), c.Masters)
	}
	for addr, n := range perMaster {
		if n < 50 {
			t.Errorf("only %d of 300 keys on %s", n, addr)
		}
	}
}

// gateHook holds the first command or pipeline sent through the client
// until open is called.
type gateHook struct {
	once sync.Once
	gate chan struct{}
	sent chan struct{}
}

func newGateHook() *gateHook {
	return &gateHook{gate: make(chan struct{}), sent: make(chan struct{})}
}

func (g *gateHook) wait() {
	first := false
	g.once.Do(func() { first = true; close(g.sent) })
	if first {
		<-g.gate
	}
}

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { g.wait(); return next(ctx, cmd) }
}
func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { g.wait(); return next(ctx, cmds) }
}

// TestClusterPipelineAcrossNodes makes concurrent deliveries of keys on
// every master share one store pipeline, and checks that the cluster client
// splits it by node (each master gets one pipeline of its own keys) and
// that every call gets its own answer.
func TestClusterPipelineAcrossNodes(t *testing.T) {
	t.Parallel()
	c, rdb := startCluster(t, redisserver.ClusterOptions{})
	hookOf := nodeHooks(rdb)
	gate := newGateHook()
	rdb.AddHook(gate)
	ctx := context.Background()
	s := newStore(t, rdb, redisstore.Options{MaxInFlight: 1})
	const n = 90
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("pipe-%d", i)
	}
	// The first claim takes the only flush slot and is held there, so the
	// others queue up and go out together.
	first := storetest.ClaimAsync(ctx, s, keys[0])
	<-gate.sent
	rest := make([]<-chan storetest.Claimed, n)
	for i := 1; i < n; i++ {
		rest[i] = storetest.ClaimAsync(ctx, s, keys[i])
	}
	queued(t, s, n-1)
	close(gate.gate)
	tokens := make([]string, n)
	for i, ch := range append([]<-chan storetest.Claimed{first}, rest[1:]...) {
		a := storetest.Receive(t, keys[i], ch)
		if a.Err != nil || a.Claim.State != dedup.Acquired {
			t.Fatalf("Claim(%q) = %+v, %v", keys[i], a.Claim, a.Err)
		}
		tokens[i] = a.Claim.Token
	}
	// Each master got exactly its own keys of the batch, in one pipeline.
	total := 0
	for _, addr := range c.Addrs()[:c.Masters] {
		h := hookOf(addr)
		if h == nil {
			t.Fatalf("nothing was sent to master %s", addr)
		}
		h.mu.Lock()
		pipes, sent := slices.Clone(h.pipelines), slices.Clone(h.keys)
		h.mu.Unlock()
		for _, k := range sent {
			m, err := rdb.MasterForKey(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if m.Options().Addr != addr {
				t.Errorf("%s went to %s, but %s serves its slot", k, addr, m.Options().Addr)
			}
		}
		t.Logf("master %s: pipelines of %v commands", addr, pipes)
		if len(pipes) != 1 || pipes[0] < 2 {
			t.Errorf("master %s got pipelines %v, want one of several commands", addr, pipes)
		}
		for _, p := range pipes {
			total += p
		}
	}
	if total != n-1 {
		t.Errorf("the masters' pipelines carried %d commands, want the batch's %d", total, n-1)
	}
	// Completions pipelined the same way; every key then reads back its
	// own result.
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { errs <- s.Complete(ctx, k, tokens[i], time.Minute, []byte(k)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		cl, err := s.Claim(ctx, k, "fp", time.Minute)
		if err != nil || cl.State != dedup.Completed || string(cl.Result) != k {
			t.Fatalf("Claim(%q) after completion = %+v, %v; want completed with its own result", k, cl, err)
		}
	}
}
