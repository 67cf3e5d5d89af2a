// The CI variant of the chaos program: each entry of the matrix, small (a
// few thousand messages, one kill of each kind), against private servers
// the run starts itself and processes it kills: PostgreSQL and Redis from
// the machine's packages, fauxqs (cut off from the children for a
// second), and a NATS server with JetStream of the
// release go.mod requires (v2.15.2 when this was written; built once per
// machine by internal/natsbin), SIGKILLed mid-stream. Without a server
// program it skips, unless CI is set, when it fails; a failed build of
// nats-server fails it.
package main

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/dedupq/dedupq/internal/natsbin"
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
	// The first build of nats-server on a machine takes a minute or two:
	// outside the runs' own deadlines (go run ./internal/testall has
	// built it before the tests start).
	buildCtx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	_, err := natsbin.Path(buildCtx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		backend, store string
		n              int
		// groups, when set, makes an ordered run (-ordered) of that
		// many groups.
		groups int
	}{
		{"mem", "mem", 10000, 0},
		{"mem", "mem", 5000, 100},
		{"jetstream", "pg", 2000, 0},
		{"jetstream", "redis", 2000, 0},
		// SQS FIFO keeps its groups' order either way: the run checks
		// it too.
		{"sqs", "pg", 2000, 20},
	} {
		name := tc.backend + "-" + tc.store
		if tc.groups > 0 {
			name += "-ordered"
		}
		t.Run(name, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.backend, cfg.store, cfg.n = tc.backend, tc.store, tc.n
			cfg.ordered, cfg.groups = tc.groups > 0, tc.groups
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
			if res.orderChecked != cfg.ordered {
				t.Errorf("order checked: %v, want %v", res.orderChecked, cfg.ordered)
			}
		})
	}
}
