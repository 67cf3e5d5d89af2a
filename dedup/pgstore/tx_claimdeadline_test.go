// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test (override with DEDUPQ_PG_DSN), in tables with random names, like
// pgstore_test.go; without it they skip, unless CI is set, when they fail.
package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

// A TxGuard claims only before the delivery's claim deadline: a claim the
// database answers only after it (here: the key's row lock held by another
// transaction, as a database slow to answer would hold it) is abandoned,
// the handler does not run, and the error matches dedupq.ErrUnavailable,
// so that the Consumer, past the deadline, nacks the delivery. A delivery
// already past its deadline asks the database nothing.
func TestTxGuardClaimBoundedByTheClaimDeadline(t *testing.T) {
	pool := connect(t, 8)
	s := newStore(t, pool, pgstore.Options{Table: newTable(t, pool)})
	g, err := pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Another Do holds the key's row lock until release is closed.
	release, holding := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := s.Do(ctx, "k", "fp", time.Hour, func(context.Context, pgx.Tx) ([]byte, error) {
			close(holding)
			<-release
			return nil, errors.New("rolled back")
		})
		held <- err
	}()
	<-holding
	defer func() { close(release); <-held }()

	for _, tt := range []struct {
		name     string
		deadline time.Duration // from now
	}{
		{"the lock outlasts the deadline", 200 * time.Millisecond},
		{"already past the deadline", -time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ran := false
			d := &dedupq.Delivery{Message: dedupq.Message{ID: "k", Body: []byte("b")}, Attempt: 1, Lease: time.Minute,
				ClaimDeadline: time.Now().Add(tt.deadline)}
			start := time.Now()
			err := g.Wrap(func(context.Context, *dedupq.Delivery) error { ran = true; return nil })(ctx, d)
			if ran || !errors.Is(err, dedupq.ErrUnavailable) {
				t.Fatalf("handler ran %v, err %v; want no run and an error matching ErrUnavailable", ran, err)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("the claim took %s, past its deadline by far", took)
			}
		})
	}
}
