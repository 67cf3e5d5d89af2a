package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	_ "github.com/dedupq/dedupq/adapters/sqs"       // registers sqs://
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/window"
)

// roleEnv names the environment variable that makes the binary a child
// of a run: "publish" or "consume".
const roleEnv = "DEDUPQ_CHAOS_ROLE"

// The consumers' settings, which the orchestrator holds them to.
const (
	// dedupTTL covers an ordered run's worst case where the publishers'
	// retry span overruns the broker's window (mem's 1s, JetStream's
	// 10s): a resent copy waits behind up to groupBacklog (400) messages
	// of its group, each holding it for a redelivery span (20 × 10s on
	// JetStream), about a day.
	dedupTTL        = 7 * 24 * time.Hour
	shutdownTimeout = 5 * time.Second
	settleTimeout   = 5 * time.Second
)

// publisherRetry is the publishers' retry policy: the default, which
// rides out a broker restart of a few seconds.
func publisherRetry() window.RetryPolicy { return window.DefaultRetryPolicy() }

// runChild runs one child role and returns its exit code: 0 done, 1
// failed (the orchestrator starts it again), 3 a leak found at shutdown.
func runChild(role string, args []string) int {
	var err error
	switch role {
	case "publish":
		err = publishChild(args)
	case "consume":
		err = consumeChild(args)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		if errors.Is(err, errLeak) {
			return 3
		}
		return 1
	}
	return 0
}

// publishChild sends publisher -index's sequence (sendOrder) from the
// beginning, printing "progress K" after each batch and "done" at the
// end. A failed publish ends it with an error: the orchestrator starts it
// again from the beginning, as an application re-sending its outbox would.
func publishChild(args []string) error {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	url := fs.String("url", "", "queue URL")
	n := fs.Int("n", 0, "messages in the run")
	seed := fs.Uint64("seed", 1, "seed")
	dup := fs.Float64("dup", 0.2, "share of IDs sent twice")
	count := fs.Int("publishers", 1, "publishers in the run")
	index := fs.Int("index", 0, "this publisher")
	groups := fs.Int("groups", 0, "ordering groups: message i in group i % groups (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	retry := publisherRetry()
	pub, err := dedupq.OpenPublisher(ctx, *url, dedupq.PublisherOptions{Retry: &retry, ConsumerDedupTTL: dedupTTL})
	if err != nil {
		return err
	}
	defer pub.Close(context.WithoutCancel(ctx))
	order := sendOrder(*n, *index, *count, *dup, *seed)
	var group func(int) string
	if *groups > 0 {
		group = groupOf(*groups)
	}
	err = publishOrder(ctx, pub, order, group, nil, func(k int) { fmt.Printf("progress %d\n", k) })
	if err != nil {
		return err
	}
	fmt.Println("done")
	return nil
}

// consumerStats is what a consumer reports when it stops cleanly.
type consumerStats struct {
	Instance   string      `json:"instance"`
	Deliveries int64       `json:"deliveries"`
	Guard      dedup.Stats `json:"guard"`
	// ShutdownMillis is how long Run took to return once told to stop.
	ShutdownMillis int64 `json:"shutdown_ms"`
}

var errLeak = errors.New("leak")

// consumeChild consumes -url until SIGTERM, writing one effects row per
// handler run, then stops, closes everything and checks that nothing it
// opened is left: no goroutine beyond those it started with, no socket.
// It prints "ready" once Run started, "tick N" (deliveries so far) four
// times a second, and "stats {json}" at the end.
func consumeChild(args []string) error {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	url := fs.String("url", "", "queue URL")
	store := fs.String("store", "pg", "pg, redis or redis-volatile")
	pgDSN := fs.String("pg", "", "PostgreSQL URL (effects, and the pg store)")
	redisAddr := fs.String("redis", "", "Redis address (redis stores)")
	instance := fs.String("instance", "", "this process's name in the effects table")
	concurrency := fs.Int("concurrency", 8, "handlers")
	ordered := fs.Bool("ordered", false, "ConsumerOptions.Ordered")
	groupBacklog := fs.Int("group-backlog", 0, "ConsumerOptions.GroupBacklog")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Counted after the signal handling started, whose goroutines stay.
	baseline := runtime.NumGoroutine()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	pcfg, err := pgxpool.ParseConfig(*pgDSN)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(*concurrency + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	var rdb *redis.Client
	var guard *dedup.Guard
	var dd dedupq.Deduplicator
	var effect dedupq.Handler
	switch *store {
	case "pg":
		s, err := pgstore.New(pool, pgstore.Options{})
		if err != nil {
			pool.Close()
			return err
		}
		if dd, err = pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: dedupTTL}); err != nil {
			pool.Close()
			return err
		}
		effect = func(ctx context.Context, d *dedupq.Delivery) error {
			id, ok := parseID(d.Message.ID)
			if !ok {
				return dedupq.Permanent(fmt.Errorf("unknown message %q", d.Message.ID))
			}
			tx, err := pgstore.Tx(ctx)
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO effects (id, instance, attempt, recorded) VALUES ($1, $2, $3, true)`, id, *instance, d.Attempt)
			return err
		}
	case "redis", "redis-volatile":
		rdb = redis.NewClient(&redis.Options{Addr: *redisAddr})
		rs, err := redisstore.New(rdb, redisstore.Options{Namespace: "chaos"})
		if err != nil {
			pool.Close()
			rdb.Close()
			return err
		}
		mark := func(ctx context.Context, key string) {
			id, ok := parseID(key)
			if !ok {
				return
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			// Only the latest row: an earlier one of this process (its
			// insert committed, but the answer was lost and the handler
			// ran again) stays unrecorded, as it was.
			if _, err := pool.Exec(ctx, `UPDATE effects SET recorded = true WHERE ctid = (
	SELECT ctid FROM effects WHERE id = $1 AND instance = $2 AND NOT recorded ORDER BY at DESC LIMIT 1)`, id, *instance); err != nil {
				logger.Warn("chaos: marking an effect recorded failed; it counts as unrecorded", "id", key, "err", err)
			}
		}
		guard, err = dedup.NewGuard(dedup.GuardOptions{
			Store: markingStore{Store: rs, mark: mark}, TTL: dedupTTL,
			SettleTimeout: settleTimeout, Logger: logger,
		})
		if err != nil {
			pool.Close()
			rdb.Close()
			return err
		}
		dd = guard
		effect = func(ctx context.Context, d *dedupq.Delivery) error {
			id, ok := parseID(d.Message.ID)
			if !ok {
				return dedupq.Permanent(fmt.Errorf("unknown message %q", d.Message.ID))
			}
			_, err := pool.Exec(ctx, `INSERT INTO effects (id, instance, attempt, recorded) VALUES ($1, $2, $3, false)`, id, *instance, d.Attempt)
			if err != nil && ctx.Err() == nil {
				// This insert fails only when PostgreSQL is away: say so,
				// and the consumer holds the delivery until it is back.
				return fmt.Errorf("%w: writing the effect: %w", dedupq.ErrUnavailable, err)
			}
			return err
		}
	default:
		pool.Close()
		return fmt.Errorf("unknown store %q", *store)
	}
	closeStores := func() {
		pool.Close()
		if rdb != nil {
			rdb.Close()
		}
	}

	var deliveries atomic.Int64
	con, err := dedupq.OpenConsumer(ctx, *url, dedupq.ConsumerOptions{
		Concurrency: *concurrency, Dedup: countingDedup{Deduplicator: dd, deliveries: &deliveries},
		PublisherSpan:   publisherRetry().Span(),
		ShutdownTimeout: shutdownTimeout, SettleTimeout: settleTimeout, Logger: logger,
		Ordered: *ordered, GroupBacklog: *groupBacklog,
	})
	if err != nil {
		closeStores()
		return err
	}
	fmt.Println("ready")
	tickDone := make(chan struct{})
	tickStopped := make(chan struct{})
	go func() {
		defer close(tickStopped)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Printf("tick %d\n", deliveries.Load())
			case <-tickDone:
				return
			}
		}
	}()
	runErr := make(chan error, 1)
	go func() { runErr <- con.Run(ctx, effect) }()
	var stopping time.Time
	select {
	case err = <-runErr:
	case <-ctx.Done():
		stopping = time.Now()
		err = <-runErr
	}
	shutdown := time.Since(stopping)
	close(tickDone)
	<-tickStopped
	err = errors.Join(err, con.Close(context.Background()))
	closeStores()
	if err != nil {
		return err
	}
	st := consumerStats{Instance: *instance, Deliveries: deliveries.Load(), ShutdownMillis: shutdown.Milliseconds()}
	if guard != nil {
		st.Guard = guard.Stats()
	}
	b, _ := json.Marshal(st)
	fmt.Printf("stats %s\n", b)
	return leftOver(baseline, 5*time.Second)
}

// leftOver waits until this process runs no more goroutines than it
// started with and holds no socket, and reports what is left otherwise.
func leftOver(baseline int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		g, socks := runtime.NumGoroutine(), openSockets()
		if g <= baseline && socks == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("%w after shutdown: %d goroutines (started with %d), %d open sockets; goroutines:\n%s", errLeak, g, baseline, socks, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openSockets counts this process's open sockets.
func openSockets() int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}
