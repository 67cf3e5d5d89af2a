// These tests talk to the real PostgreSQL server at 127.0.0.1:5432 (override
// with DEDUPQ_PG_DSN), as pgstore_test.go does, through a wrapper that can
// hold back the results of a batch of claims: the statement runs and
// commits on the server at once, and the store reads its answer only when
// the test lets go — a reply slow to come back.
package pgstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/dedup/storetest"
)

// heldDB is a pool whose batches of claims report their keys on sent and,
// when they are the first to name a key in held, hand their results over
// only once that key's gate is closed, or fail with the store's context's error if it ends
// first.
type heldDB struct {
	*pgxpool.Pool
	sent chan []string
	mu   sync.Mutex
	held map[string]chan struct{}
	// completed lists, for each batch sent, the keys it completes.
	completed [][]string
}

func newHeldDB(pool *pgxpool.Pool) *heldDB {
	return &heldDB{Pool: pool, sent: make(chan []string, 64), held: map[string]chan struct{}{}}
}

// hold makes the next batch that claims key wait for the returned release.
func (d *heldDB) hold(key string) (release func()) {
	gate := make(chan struct{})
	d.mu.Lock()
	d.held[key] = gate
	d.mu.Unlock()
	return sync.OnceFunc(func() { close(gate) })
}

func (d *heldDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	var keys, completes []string
	for _, q := range b.QueuedQueries {
		if len(q.Arguments) > 1 {
			k, ok := q.Arguments[1].([]string)
			if one, isOne := q.Arguments[1].(string); isOne { // a batch of one, in scalars
				k, ok = []string{one}, true
			}
			if ok && len(q.Arguments) == 5 { // the claim statement
				keys = k
			}
			if ok && len(q.Arguments) == 6 { // the completion statement
				completes = k
			}
		}
	}
	d.mu.Lock()
	d.completed = append(d.completed, slices.Clone(completes))
	d.mu.Unlock()
	br := d.Pool.SendBatch(ctx, b)
	if keys == nil {
		return br
	}
	d.sent <- slices.Clone(keys)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range keys {
		if gate := d.held[k]; gate != nil {
			delete(d.held, k) // the first batch only
			return &heldResults{BatchResults: br, ctx: ctx, gate: gate}
		}
	}
	return br
}

type heldResults struct {
	pgx.BatchResults
	ctx  context.Context
	gate chan struct{}
	once sync.Once
	err  error
}

func (h *heldResults) wait() error {
	h.once.Do(func() {
		select {
		case <-h.gate:
		case <-h.ctx.Done():
			h.err = h.ctx.Err()
		}
	})
	return h.err
}

func (h *heldResults) Exec() (pgconn.CommandTag, error) {
	if err := h.wait(); err != nil {
		return pgconn.CommandTag{}, err
	}
	return h.BatchResults.Exec()
}

func (h *heldResults) Query() (pgx.Rows, error) {
	if err := h.wait(); err != nil {
		return nil, err
	}
	return h.BatchResults.Query()
}

// nextSent returns the keys of the next batch of claims sent.
func (d *heldDB) nextSent(t *testing.T) []string {
	t.Helper()
	return storetest.Receive(t, "the next batch of claims", d.sent)
}

func queuedClaims(t *testing.T, s *pgstore.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for pgstore.QueuedClaims(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims queued, want %d", pgstore.QueuedClaims(s), n)
		}
		tm := time.NewTimer(time.Millisecond)
		<-tm.C
	}
}

// keyFree polls until no live row holds key (the claim was undone), and
// then checks that a claim acquires it.
func keyFree(t *testing.T, pool *pgxpool.Pool, s *pgstore.Store, table, key string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live int
		err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE namespace = 'default' AND key = $1 AND expires_at > now()", key).Scan(&live)
		if err != nil {
			t.Fatal(err)
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still held, by a claim whose caller was told it failed", key)
		}
		tm := time.NewTimer(10 * time.Millisecond)
		<-tm.C
	}
	if c, err := s.Claim(ctx, key, "fp", time.Minute); err != nil || c.State != dedup.Acquired {
		t.Fatalf("Claim of the freed key = %+v, %v; want acquired", c, err)
	}
}

// A claim without a deadline shares a batch with a claim whose deadline
// passes while the batch is in flight. Each caller's result depends on its
// own context only: the one without a deadline gets its answer, the other
// its own deadline's error, and the claim the latter made, acquired after
// it gave up, is released rather than left held under a token nobody has.
func TestBatchedClaimDependsOnItsOwnContextOnly(t *testing.T) {
	pool := connect(t, 8)
	table := newTable(t, pool)
	db := newHeldDB(pool)
	s := newStore(t, db, pgstore.Options{Table: table, MaxInFlight: 1})
	kx, kl, ks := randomName("x-"), randomName("long-"), randomName("short-")
	releaseX, releaseL := db.hold(kx), db.hold(kl)
	defer releaseX()
	defer releaseL()

	x := storetest.ClaimAsync(context.Background(), s, kx) // occupies the only slot
	if got := db.nextSent(t); !slices.Equal(got, []string{kx}) {
		t.Fatalf("first batch %v, want [%s]", got, kx)
	}
	long := storetest.ClaimAsync(context.Background(), s, kl)
	queuedClaims(t, s, 1)
	sctx, expire := storetest.DeadlineContext(time.Now().Add(2 * time.Second))
	defer expire()
	short := storetest.ClaimAsync(sctx, s, ks)
	queuedClaims(t, s, 2)
	releaseX()
	if got := db.nextSent(t); !slices.Contains(got, kl) || !slices.Contains(got, ks) {
		t.Fatalf("second batch %v, want %s and %s together", got, kl, ks)
	}
	expire() // the short deadline passes while the batch is in flight
	if a := storetest.Receive(t, "the claim whose deadline passed", short); !errors.Is(a.Err, context.DeadlineExceeded) || errors.Is(a.Err, dedup.ErrStoreUnavailable) {
		t.Fatalf("claim with the passed deadline: %+v, %v; want its own context's error", a.Claim, a.Err)
	}
	releaseL()
	if a := storetest.Receive(t, "the claim without a deadline", long); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("claim without a deadline, batched with one whose deadline passed = %+v, %v; want acquired", a.Claim, a.Err)
	}
	if a := storetest.Receive(t, "the first claim", x); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("first claim = %+v, %v", a.Claim, a.Err)
	}
	keyFree(t, pool, s, table, ks)
}

// A claim whose caller gives up while it is in flight — alone in its
// batch, so that nobody waits for the batch any more — returns its
// context's error at once, and the key is free again afterwards: the
// statement committed, so the store must undo it, after the commit (the
// batch reads its outcome, which arrives here after the caller left).
func TestClaimGivenUpInFlightIsUndone(t *testing.T) {
	pool := connect(t, 8)
	table := newTable(t, pool)
	db := newHeldDB(pool)
	s := newStore(t, db, pgstore.Options{Table: table})
	key := randomName("gone-")
	release := db.hold(key)
	defer release()
	ctx, expire := storetest.DeadlineContext(time.Now().Add(2 * time.Second))
	defer expire()
	ch := storetest.ClaimAsync(ctx, s, key)
	db.nextSent(t)
	expire()
	if a := storetest.Receive(t, "the claim whose deadline passed", ch); !errors.Is(a.Err, context.DeadlineExceeded) || errors.Is(a.Err, dedup.ErrStoreUnavailable) {
		t.Fatalf("claim = %+v, %v; want its own context's error", a.Claim, a.Err)
	}
	// The statement commits on its own time, which under load can come
	// after keyFree's first look: "no live row" must mean undone, not
	// not yet written.
	keyHeld(t, pool, table, key)
	release()
	keyFree(t, pool, s, table, key)
}

// keyHeld polls until a live row holds key.
func keyHeld(t *testing.T, pool *pgxpool.Pool, table, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var live int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE namespace = 'default' AND key = $1 AND expires_at > now()", key).Scan(&live)
		if err != nil {
			t.Fatal(err)
		}
		if live == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claim of %q never committed", key)
		}
		tm := time.NewTimer(10 * time.Millisecond)
		<-tm.C
	}
}

// The claim of TestClaimRacingTakeoverAnswersFromLatestRow, sharing its
// statement with a claim of a free key and one of a live key: the batch
// answers the other two at once, and the racing one from the takeover.
func TestBatchedClaimRacingTakeover(t *testing.T) {
	pool := connect(t, 8)
	ctx := context.Background()
	table := newTable(t, pool)
	db := newHeldDB(pool)
	s := newStore(t, db, pgstore.Options{Table: table, MaxInFlight: 1})
	kb, kr, kf, kv := randomName("blocker-"), randomName("race-"), randomName("free-"), randomName("live-")
	if c, err := s.Claim(ctx, kv, "fp-live", time.Hour); err != nil || c.State != dedup.Acquired {
		t.Fatalf("claim of the live key = %+v, %v", c, err)
	}
	db.nextSent(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (namespace, key, token, fingerprint, completed, expires_at, result)
		VALUES ('default', $1, 't-old', 'fp-old', true, now() - interval '1 minute', 'old')`, kr)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `UPDATE `+table+` SET token = 't-new', fingerprint = 'fp-new', completed = false,
		locked_until = now() + interval '1 hour', expires_at = now() + interval '1 hour', result = NULL
		WHERE namespace = 'default' AND key = $1`, kr)
	if err != nil {
		t.Fatal(err)
	}

	release := db.hold(kb)
	defer release()
	blocker := storetest.ClaimAsync(ctx, s, kb) // occupies the only slot
	db.nextSent(t)
	race, free, live := storetest.ClaimAsync(ctx, s, kr), storetest.ClaimAsync(ctx, s, kf), storetest.ClaimAsync(ctx, s, kv)
	queuedClaims(t, s, 3)
	release()
	if got := db.nextSent(t); len(got) != 3 {
		t.Fatalf("second batch %v, want the three claims together", got)
	}
	waitForLockWait(t, pool, table)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ch    <-chan storetest.Claimed
		state dedup.State
		fp    string
	}{
		{"racing claim", race, dedup.InProgress, "fp-new"},
		{"claim of the free key", free, dedup.Acquired, ""},
		{"claim of the live key", live, dedup.InProgress, "fp-live"},
		{"blocker", blocker, dedup.Acquired, ""},
	} {
		a := storetest.Receive(t, tc.name, tc.ch)
		if a.Err != nil || a.Claim.State != tc.state || a.Claim.Fingerprint != tc.fp {
			t.Errorf("%s = %s with fingerprint %q, %v; want %s with %q", tc.name, a.Claim.State, a.Claim.Fingerprint, a.Err, tc.state, tc.fp)
		}
	}
}

// A claim and a completion made while a batch is in flight go out together
// in the next one: one round trip and one commit, where batches of claims
// and of completions apart would take a commit each.
func TestClaimAndCompletionShareABatch(t *testing.T) {
	pool := connect(t, 4)
	db := newHeldDB(pool)
	s := newStore(t, db, pgstore.Options{Table: newTable(t, pool)})
	ctx := context.Background()

	held, err := s.Claim(ctx, "done", "fp", time.Minute)
	if err != nil || held.State != dedup.Acquired {
		t.Fatalf("Claim = %+v, %v; want acquired", held, err)
	}
	db.nextSent(t)
	release := db.hold("blocker")
	defer release()
	blocker := storetest.ClaimAsync(ctx, s, "blocker")
	db.nextSent(t) // in flight, its answer held back

	completed := make(chan error, 1)
	go func() { completed <- s.Complete(ctx, "done", held.Token, time.Hour, nil) }()
	next := storetest.ClaimAsync(ctx, s, "next")
	queuedClaims(t, s, 2) // the completion and the claim wait together
	release()
	if a := storetest.Receive(t, "the held claim", blocker); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("held claim = %+v, %v; want acquired", a.Claim, a.Err)
	}
	if keys := db.nextSent(t); !slices.Equal(keys, []string{"next"}) {
		t.Fatalf("next batch claims %q, want [next]", keys)
	}
	if a := storetest.Receive(t, "the claim", next); a.Err != nil || a.Claim.State != dedup.Acquired {
		t.Fatalf("claim = %+v, %v; want acquired", a.Claim, a.Err)
	}
	select {
	case err := <-completed:
		if err != nil {
			t.Fatalf("Complete: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Complete did not return")
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if got := db.completed[len(db.completed)-1]; !slices.Equal(got, []string{"done"}) {
		t.Errorf("the batch that claimed next completed %q, want [done]: the completion went apart", got)
	}
	if len(db.completed) != 3 {
		t.Errorf("%d batches sent, want 3 (claim, held claim, claim with completion)", len(db.completed))
	}
}
