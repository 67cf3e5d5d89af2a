package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/kvstore"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/internal/parallel"
)

// concurrencies the store rows run at.
var concurrencies = []int{1, 16, 64}

// perMessage makes a side that calls op once per message over conc
// goroutines, with a key unique to the side and round.
func perMessage(name string, conc int, op func(ctx context.Context, key string) error) side {
	tag := randomName("")
	return side{name, func(ctx context.Context, round int, n int64) (time.Duration, error) {
		prefix := fmt.Sprintf("%s-%d-", tag, round)
		return parallel.Run(ctx, conc, n, func(ctx context.Context, i int64) error {
			return op(ctx, prefix+strconv.FormatInt(i, 10))
		})
	}}
}

// claimComplete is what the Guard asks of a store per delivery.
func claimComplete(s dedup.Store) func(ctx context.Context, key string) error {
	return func(ctx context.Context, key string) error {
		cl, err := s.Claim(ctx, key, "fp", time.Minute)
		if err != nil {
			return err
		}
		if cl.State != dedup.Acquired {
			return fmt.Errorf("fresh key %s: %s", key, cl.State)
		}
		return s.Complete(ctx, key, cl.Token, time.Hour, nil)
	}
}

func memstoreRows(context.Context, config) ([]row, func(), error) {
	var rows []row
	for _, conc := range concurrencies {
		var mu sync.Mutex
		seen := map[string]struct{}{}
		raw := perMessage("map set-if-absent", conc, func(_ context.Context, key string) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := seen[key]; ok {
				return fmt.Errorf("fresh key %s seen", key)
			}
			seen[key] = struct{}{}
			return nil
		})
		rows = append(rows, row{name: "claim+complete", conc: conc, n: 200_000, raw: raw,
			dq: perMessage("memstore", conc, claimComplete(memstore.New(nil)))})
	}
	return rows, func() {}, nil
}

func redisRows(ctx context.Context, c config) ([]row, func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: 64})
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, nil, err
	}
	ns := randomName("bench")
	s, err := redisstore.New(rdb, redisstore.Options{Namespace: ns})
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	goals := map[int]float64{1: 0.5, 64: 1.2}
	var rows []row
	for _, conc := range concurrencies {
		raw := perMessage("SET NX PX", conc, func(ctx context.Context, key string) error {
			return rdb.SetNX(ctx, "dedupq:"+ns+":raw:"+key, "1", time.Minute).Err()
		})
		rows = append(rows, row{name: "claim+complete", conc: conc, n: 20_000, goal: goals[conc], raw: raw,
			dq: perMessage("redisstore", conc, claimComplete(s))})
	}
	cleanup := func() {
		// Every key the run wrote starts with the namespace's prefix.
		deleteNamespace(rdb, ns)
		rdb.Close()
	}
	return rows, cleanup, nil
}

// jskvRows runs kvstore (per-key TTL) in a JetStream key-value bucket on an
// embedded server, beside the raw KV Create plus Update by revision that a
// hand-rolled dedup on the same server would do, in a bucket of its own.
func jskvRows(ctx context.Context, c config) ([]row, func(), error) {
	url, stop, err := embedded.Run(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	cleanup := func() { nc.Close(); stop() }
	js, err := jetstream.New(nc)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	o := kvstore.Options{Bucket: randomName("bench-")}
	raw := kvstore.BucketConfig(kvstore.Options{Bucket: randomName("bench-raw-")}, 0)
	var kv jetstream.KeyValue
	err = kvstore.EnsureBucket(ctx, js, kvstore.BucketConfig(o, 0))
	if err == nil {
		kv, err = js.CreateKeyValue(ctx, raw)
	}
	var s *kvstore.Store
	if err == nil {
		s, err = kvstore.New(js, o)
	}
	if err == nil {
		err = s.Check(ctx)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	val := []byte("1")
	var rows []row
	for _, conc := range concurrencies {
		rawSide := perMessage("KV Create+Update", conc, func(ctx context.Context, key string) error {
			rev, err := kv.Create(ctx, key, val)
			if err != nil {
				return err
			}
			_, err = kv.Update(ctx, key, val, rev)
			return err
		})
		rows = append(rows, row{name: "claim+complete", conc: conc, n: 5_000, raw: rawSide,
			dq: perMessage("kvstore", conc, claimComplete(s))})
	}
	return rows, cleanup, nil
}

func pgConnect(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32 // room left on a server others share
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// pgTables creates dedup tables (same shape for raw and store) and an
// effects table; drop removes them.
func pgTables(ctx context.Context, pool *pgxpool.Pool, dedupTables int, effects bool) (names []string, drop func(), err error) {
	drop = func() {
		for _, t := range names {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+t)
		}
	}
	for range dedupTables {
		t := randomName("dedupq_bench_")
		names = append(names, t)
		if err := pgstore.EnsureSchema(ctx, pool, t); err != nil {
			drop()
			return nil, nil, err
		}
	}
	if effects {
		t := randomName("dedupq_bench_effects_")
		names = append(names, t)
		if _, err := pool.Exec(ctx, "CREATE TABLE "+t+" (msg text NOT NULL)"); err != nil {
			drop()
			return nil, nil, err
		}
	}
	return names, drop, nil
}

// pgSetup connects, creates the tables (pgTables) and a Store on the
// first; cleanup drops them and closes the pool.
func pgSetup(ctx context.Context, c config, effects bool) (pool *pgxpool.Pool, tables []string, s *pgstore.Store, cleanup func(), err error) {
	if pool, err = pgConnect(ctx, c.pgDSN); err != nil {
		return nil, nil, nil, nil, err
	}
	tables, drop, err := pgTables(ctx, pool, 2, effects)
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	cleanup = func() { drop(); pool.Close() }
	if s, err = pgstore.New(pool, pgstore.Options{Table: tables[0]}); err != nil {
		cleanup()
		return nil, nil, nil, nil, err
	}
	return pool, tables, s, cleanup, nil
}

func pgRows(ctx context.Context, c config) ([]row, func(), error) {
	pool, tables, s, cleanup, err := pgSetup(ctx, c, false)
	if err != nil {
		return nil, nil, err
	}
	rawSQL := "INSERT INTO " + tables[1] + ` (namespace, key, token, fingerprint, expires_at)
		VALUES ('default', $1, '0123456789abcdef0123456789abcdef', 'fp', now() + interval '1 hour') ON CONFLICT DO NOTHING`
	goals := map[int]float64{1: 0.5, 16: 1.5, 64: 1.5}
	var rows []row
	for _, conc := range concurrencies {
		raw := perMessage("INSERT ON CONFLICT", conc, func(ctx context.Context, key string) error {
			_, err := pool.Exec(ctx, rawSQL, key)
			return err
		})
		rows = append(rows, row{name: "claim+complete", conc: conc, n: 4_000, goal: goals[conc], raw: raw,
			dq: perMessage("pgstore", conc, claimComplete(s))})
	}
	return rows, cleanup, nil
}

func txguardRows(ctx context.Context, c config) ([]row, func(), error) {
	pool, tables, s, cleanup, err := pgSetup(ctx, c, true)
	if err != nil {
		return nil, nil, err
	}
	g, err := pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: time.Hour})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	effects := tables[2]
	effectSQL := "INSERT INTO " + effects + " (msg) VALUES ($1)"
	keySQL := "INSERT INTO " + tables[1] + ` (namespace, key, token, fingerprint, expires_at)
		VALUES ('default', $1, '', 'fp', now() + interval '1 hour') ON CONFLICT DO NOTHING`
	h := g.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, effectSQL, d.Message.ID)
		return err
	})
	body := []byte("payload")
	var rows []row
	for _, conc := range concurrencies {
		raw := perMessage("tx: INSERT + key ON CONFLICT", conc, func(ctx context.Context, key string) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, effectSQL, key); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, keySQL, key)
				return err
			})
		})
		dq := perMessage("TxGuard", conc, func(ctx context.Context, key string) error {
			return h(ctx, &dedupq.Delivery{Message: dedupq.Message{ID: key, Body: body}, BackendID: key, Attempt: 1})
		})
		rows = append(rows, row{name: "effect in tx", conc: conc, n: 3_000, goal: 0.8, raw: raw, dq: dq})
	}
	return rows, cleanup, nil
}

// deleteNamespace removes the keys a run wrote under the dedup namespace ns,
// the raw side's and the store's, a page of SCAN at a time. Left to their
// TTL, a day of runs leaves millions of keys in a shared Redis, which
// slows the next runs' Redis rows (and anything else on that server).
func deleteNamespace(rdb *redis.Client, ns string) {
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "dedupq:"+ns+":*", 1000).Result()
		if err != nil {
			return
		}
		if len(keys) > 0 {
			rdb.Unlink(ctx, keys...)
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// randomName is prefix plus random hex: tables, namespaces and streams
// unique to one run, so that runs on a shared server never collide.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
