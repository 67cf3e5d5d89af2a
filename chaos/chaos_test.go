// The CI variant of the chaos program: each entry of the matrix, small (a
// few thousand messages, one kill of each kind), against private servers
// the run starts itself (PostgreSQL, Redis, a NATS server with JetStream,
// fauxqs) and processes it kills. Without a server program it skips,
// unless CI is set, when it fails.
package main

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/dedupq/dedupq/localstack/fauxqs"
)

// TestMain makes the test binary a child of a run when the orchestrator
// starts it as one, as the command does.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runChild(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func TestChaosSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers and processes; skipped with -short")
	}
	for _, tc := range []struct {
		backend, store string
		n              int
	}{
		{"mem", "mem", 10000},
		{"jetstream", "pg", 2000},
		{"jetstream", "redis", 2000},
		{"sqs", "pg", 2000},
	} {
		t.Run(tc.backend+"-"+tc.store, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.backend, cfg.store, cfg.n = tc.backend, tc.store, tc.n
			cfg.consumers, cfg.concurrency, cfg.kills = 2, 8, 1
			cfg.settle = 90 * time.Second
			if err := cfg.check(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			res, err := run(ctx, cfg, t.Output())
			switch {
			case err != nil && res == nil && (errors.Is(err, errMissing) || errors.Is(err, fauxqs.ErrUnavailable)) && os.Getenv("CI") == "":
				t.Skipf("cannot run here: %v", err)
			case err != nil && res == nil:
				t.Fatal(err)
			case err != nil:
				t.Error(err)
			}
			t.Log(res.line())
			for _, p := range res.problems {
				t.Error(p)
			}
			if res.published != tc.n || res.distinct != tc.n {
				t.Errorf("published %d, distinct effects %d; want %d each", res.published, res.distinct, tc.n)
			}
		})
	}
}
