// This test talks to no server: it feeds the fault runs' checker
// (cluster_fault_test.go) stores that answer wrongly, in memory, to show
// that it sees each kind of wrong answer, and a correct store to show that
// it does not cry wolf.
package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// liar is a correct in-memory store with one of its answers bent.
type liar struct {
	dedup.Store
	claim    func(c dedup.Claim, err error) (dedup.Claim, error)
	complete func(err error) error
}

func (l liar) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	c, err := l.Store.Claim(ctx, key, fp, lease)
	if l.claim != nil {
		return l.claim(c, err)
	}
	return c, err
}

func (l liar) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	err := l.Store.Complete(ctx, key, token, ttl, result)
	if l.complete != nil {
		return l.complete(err)
	}
	return err
}

func TestFaultCheckerSeesWrongAnswers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bend  func(l *liar)
		wrong string // part of the first complaint; "" for none
	}{
		{"Correct", func(*liar) {}, ""},
		{"GrantsTwice", func(l *liar) {
			l.claim = func(c dedup.Claim, err error) (dedup.Claim, error) {
				if c.State == dedup.InProgress {
					c = dedup.Claim{State: dedup.Acquired, Token: strings.Repeat("0", 32) + "x"}
				}
				return c, err
			}
		}, "which never released it"},
		{"ForgetsCompletions", func(l *liar) {
			l.claim = func(c dedup.Claim, err error) (dedup.Claim, error) {
				if c.State == dedup.Completed {
					c = dedup.Claim{State: dedup.InProgress, Fingerprint: c.Fingerprint}
				}
				return c, err
			}
		}, "completed before the claim was made"},
		{"WrongResult", func(l *liar) {
			l.claim = func(c dedup.Claim, err error) (dedup.Claim, error) {
				if c.State == dedup.Completed {
					c.Result = []byte("someone else's")
				}
				return c, err
			}
		}, "completed with result"},
		{"InventsAHolder", func(l *liar) {
			l.claim = func(c dedup.Claim, err error) (dedup.Claim, error) {
				if c.State == dedup.InProgress {
					c.Fingerprint = "nobody"
				}
				return c, err
			}
		}, "which never claimed it"},
		{"LosesLeases", func(l *liar) {
			l.complete = func(err error) error { return fmt.Errorf("x: %w", dedup.ErrLeaseLost) }
		}, "lease lost"},
		{"UnwrappedError", func(l *liar) {
			l.claim = func(c dedup.Claim, err error) (dedup.Claim, error) {
				return dedup.Claim{}, errors.New("boom")
			}
		}, "without ErrStoreUnavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := liar{Store: memstore.New(clock.Real())}
			tc.bend(&l)
			o := &oracle{keys: map[string]*keyModel{}}
			r := &faultRun{errs: map[string]int{}}
			ctx := context.Background()
			// Half the keys are held by a delivery still running, so that
			// the others find them in progress.
			for i := range 25 {
				k := fmt.Sprintf("k%d", i)
				done := o.beforeClaim(k, "holder")
				c, err := l.Store.Claim(ctx, k, "holder", time.Minute)
				if w, g, _ := o.checkClaim(k, "holder", done, c); err != nil || g == nil || w != "" {
					t.Fatalf("holder's claim: %+v, %v, %q", c, err, w)
				}
			}
			// Three deliveries of each of 50 keys, one after another.
			for i := range 150 {
				r.deliver(ctx, l, o, fmt.Sprintf("k%d", i%50), fmt.Sprintf("fp%d", i), false)
			}
			switch {
			case tc.wrong == "" && len(r.wrong) > 0:
				t.Fatalf("a correct store was found wrong: %s", r.wrong[0])
			case tc.wrong != "" && len(r.wrong) == 0:
				t.Fatalf("no wrong answer found")
			case tc.wrong != "" && !strings.Contains(r.wrong[0], tc.wrong):
				t.Fatalf("first complaint %q, want one about %q", r.wrong[0], tc.wrong)
			}
		})
	}
}
