// These tests talk to nothing outside the process: the store runs on a fake
// clock.
package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/dedup/storetest"
)

var _ dedup.Store = (*memstore.Store)(nil)

func TestConformance(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	storetest.Run(t, func(t *testing.T) dedup.Store { return memstore.New(clk) }, storetest.WithClock(clk))
}

// TestConformanceRealClock runs the suite on the wall clock, which checks
// the suite's real-time mode as much as the store.
func TestConformanceRealClock(t *testing.T) {
	if testing.Short() && os.Getenv("CI") == "" {
		// Not a service skip, and never taken under CI.
		t.Skip("waits out real leases; skipped with -short")
	}
	storetest.Run(t, func(t *testing.T) dedup.Store { return memstore.New(nil) },
		storetest.WithDurations(300*time.Millisecond, 300*time.Millisecond))
}

func TestSweepForgetsExpiredAndRebuildsFromToken(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	s := memstore.New(clk)
	held, err := s.Claim(ctx, "held", "fp-held", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		c, err := s.Claim(ctx, fmt.Sprint("k", i), "fp", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, fmt.Sprint("k", i), c.Token, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(2 * time.Minute)
	// The claims that follow cross the sweep point.
	for i := range 100 {
		if _, err := s.Claim(ctx, fmt.Sprint("new", i), "fp", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n != 100 {
		t.Fatalf("Len after sweep = %d, want the 100 live claims", n)
	}
	// The swept holder was never taken over, so it still owns its key and
	// its fingerprint survives in the token.
	if err := s.Complete(ctx, "held", held.Token, time.Minute, []byte("r")); err != nil {
		t.Fatalf("Complete after sweep: %v", err)
	}
	c, err := s.Claim(ctx, "held", "other", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != dedup.Completed || c.Fingerprint != "fp-held" || string(c.Result) != "r" {
		t.Fatalf("Claim = %+v, want completed with fp-held and result r", c)
	}
}

func TestInvalidArguments(t *testing.T) {
	ctx := context.Background()
	s := memstore.New(clock.NewFake(time.Unix(0, 0)))
	c, err := s.Claim(ctx, "k", "fp", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"Claim zero lease", func() error { _, err := s.Claim(ctx, "x", "fp", 0); return err }()},
		{"Extend negative lease", s.Extend(ctx, "k", c.Token, -time.Second)},
		{"Complete zero ttl", s.Complete(ctx, "k", c.Token, 0, nil)},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := s.Complete(ctx, "unknown", "short", time.Second, nil); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Errorf("Complete with a malformed token: err = %v, want ErrLeaseLost", err)
	}
}
