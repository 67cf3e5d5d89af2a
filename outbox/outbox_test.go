// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test, trust auth (override with DEDUPQ_PG_DSN), and publish to the
// in-memory broker (adapters/mem); TestCrashAtEveryStep also publishes to
// the local NATS JetStream server at 127.0.0.1:4222 (override with
// DEDUPQ_NATS_URL) and starts copies of the test binary that it kills with
// SIGKILL. Without PostgreSQL they skip, unless CI is set, when they fail.
// Each test creates its own table with a random name and drops it.
package outbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/outbox"
	"github.com/dedupq/dedupq/window"
)

func dsn() string {
	return cmp.Or(os.Getenv("DEDUPQ_PG_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

func TestMain(m *testing.M) {
	if step := os.Getenv(crashStepEnv); step != "" {
		os.Exit(crashChild(step))
	}
	os.Exit(m.Run())
}

func newPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("PostgreSQL: %v", err)
		}
		tb.Skipf("no PostgreSQL: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func randName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// newTable creates a fresh outbox table and drops it after the test.
func newTable(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	table := randName("outbox_test_")
	if err := outbox.EnsureSchema(context.Background(), pool, table); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return table
}

func enqueue(tb testing.TB, pool *pgxpool.Pool, r *outbox.Relay, msgs ...*dedupq.Message) {
	tb.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return r.Enqueue(ctx, tx, msgs...) }); err != nil {
		tb.Fatal(err)
	}
}

// recordingTopic checks what reaches the broker: the order of each group's
// messages and that no group ever has two sends in flight.
type recordingTopic struct {
	driver.Topic
	mu       sync.Mutex
	inflight map[string]int
	order    map[string][]string
	overlap  int
}

func (t *recordingTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	t.mu.Lock()
	for _, m := range msgs {
		if m.GroupKey != "" {
			t.inflight[m.GroupKey]++
			if t.inflight[m.GroupKey] > 1 {
				t.overlap++
			}
		}
	}
	t.mu.Unlock()
	res, err := t.Topic.SendBatch(ctx, msgs)
	t.mu.Lock()
	for i, m := range msgs {
		if m.GroupKey != "" {
			t.inflight[m.GroupKey]--
			if err == nil && i < len(res) && res[i].Err == nil && !res[i].Duplicate {
				t.order[m.GroupKey] = append(t.order[m.GroupKey], m.ID)
			}
		}
	}
	t.mu.Unlock()
	return res, err
}

func newPublisher(tb testing.TB, topic driver.Topic) *dedupq.Publisher {
	tb.Helper()
	pub, err := dedupq.NewPublisher(context.Background(), topic, dedupq.PublisherOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pub.Close(context.Background()) })
	return pub
}

func newRelay(tb testing.TB, pool *pgxpool.Pool, pub *dedupq.Publisher, o outbox.Options) *outbox.Relay {
	tb.Helper()
	r, err := outbox.NewRelay(pool, pub, o)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// drain runs RunOnce until a pass claims nothing.
func drain(tb testing.TB, r *outbox.Relay) {
	tb.Helper()
	for {
		n, err := r.RunOnce(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

func status(tb testing.TB, pool *pgxpool.Pool, table string) (pending, parked int) {
	tb.Helper()
	pending, parked, _, err := outbox.TableStatus(context.Background(), pool, table)
	if err != nil {
		tb.Fatal(err)
	}
	return pending, parked
}

func TestEnqueueCommitsWithTheTransaction(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	table := newTable(t, pool)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	r := newRelay(t, pool, newPublisher(t, broker.Topic("q")), outbox.Options{Table: table})
	tests := []struct {
		name        string
		msgs        []*dedupq.Message
		rollback    bool
		wantErr     error
		wantPending int
	}{
		{name: "rolled back", msgs: []*dedupq.Message{{ID: "a"}}, rollback: true},
		{name: "empty ID", msgs: []*dedupq.Message{{ID: "ok"}, {ID: ""}}, wantErr: outbox.ErrInvalid},
		{name: "too big for the backend", msgs: []*dedupq.Message{{ID: "big", Body: make([]byte, 1<<21)}}, wantErr: outbox.ErrInvalid},
		{name: "committed", msgs: []*dedupq.Message{{ID: "b", Attributes: map[string]string{"k": "v"}}, {ID: "c"}}, wantPending: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			err = r.Enqueue(ctx, tx, tt.msgs...)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Enqueue: %v, want %v", err, tt.wantErr)
			}
			if !tt.rollback && err == nil {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if p, _ := status(t, pool, table); p != tt.wantPending {
				t.Fatalf("pending %d, want %d", p, tt.wantPending)
			}
		})
	}
	drain(t, r)
	if s := broker.Stats("q"); s.Published != 2 {
		t.Fatalf("broker stored %d, want 2", s.Published)
	}
	if p, _ := status(t, pool, table); p != 0 {
		t.Fatalf("pending %d after drain", p)
	}
}

// The package-level Enqueue checks what every backend requires.
func TestEnqueueWithoutRelay(t *testing.T) {
	pool := newPool(t)
	ctx := context.Background()
	if err := outbox.EnsureSchema(ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) // leaves the shared default table as it was
	if err := outbox.Enqueue(ctx, tx, &dedupq.Message{}); !errors.Is(err, outbox.ErrInvalid) {
		t.Fatalf("empty ID: %v", err)
	}
	before, _, _, err := outbox.Status(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Enqueue(ctx, tx, &dedupq.Message{ID: "x"}, &dedupq.Message{ID: "y"}); err != nil {
		t.Fatal(err)
	}
	after, _, _, err := outbox.Status(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	if after-before != 2 {
		t.Fatalf("pending went from %d to %d, want +2", before, after)
	}
}

// Three relays race over one table of grouped messages: every message is
// stored once, each group in order, and no group has two sends in flight.
func TestRelaysKeepGroupOrder(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	rec := &recordingTopic{Topic: broker.Topic("q"), inflight: map[string]int{}, order: map[string][]string{}}
	pub := newPublisher(t, rec)
	const groups, perGroup = 8, 25
	var want = map[string][]string{}
	r := newRelay(t, pool, pub, outbox.Options{Table: table, BatchSize: 5})
	// Groups are enqueued interleaved, in several transactions.
	for i := 0; i < perGroup; i++ {
		var batch []*dedupq.Message
		for g := 0; g < groups; g++ {
			gk := fmt.Sprintf("g%d", g)
			id := fmt.Sprintf("%s-%03d", gk, i)
			want[gk] = append(want[gk], id)
			batch = append(batch, &dedupq.Message{ID: id, GroupKey: gk})
		}
		enqueue(t, pool, r, batch...)
	}
	var wg sync.WaitGroup
	for range 3 {
		relay := newRelay(t, pool, pub, outbox.Options{Table: table, BatchSize: 5})
		wg.Go(func() {
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				if _, err := relay.RunOnce(context.Background()); err != nil {
					t.Error(err)
					return
				}
				if p, _, _, err := outbox.TableStatus(context.Background(), pool, table); err != nil || p == 0 {
					return
				}
			}
			t.Error("relays did not drain the outbox in 30s")
		})
	}
	wg.Wait()
	s := broker.Stats("q")
	if s.Published != groups*perGroup || s.Duplicates != 0 {
		t.Fatalf("broker: %d stored, %d duplicates; want %d and 0", s.Published, s.Duplicates, groups*perGroup)
	}
	if rec.overlap != 0 {
		t.Fatalf("%d sends overlapped another of their group", rec.overlap)
	}
	for g, ids := range want {
		if got := strings.Join(rec.order[g], ","); got != strings.Join(ids, ",") {
			t.Fatalf("group %s order:\n got %s\nwant %s", g, got, strings.Join(ids, ","))
		}
	}
}

// Two relays race on ungrouped rows: SKIP LOCKED hands each row to one.
func TestTwoRelaysRacing(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub := newPublisher(t, broker.Topic("q"))
	a := newRelay(t, pool, pub, outbox.Options{Table: table, BatchSize: 10})
	b := newRelay(t, pool, pub, outbox.Options{Table: table, BatchSize: 10})
	const n = 400
	for i := 0; i < n; i += 50 {
		var batch []*dedupq.Message
		for j := i; j < i+50; j++ {
			batch = append(batch, &dedupq.Message{ID: fmt.Sprintf("m%d", j)})
		}
		enqueue(t, pool, a, batch...)
	}
	var wg sync.WaitGroup
	for _, r := range []*outbox.Relay{a, b} {
		wg.Go(func() { drain(t, r) })
	}
	wg.Wait()
	sa, sb := a.Stats(), b.Stats()
	if s := broker.Stats("q"); s.Published != n || s.Duplicates != 0 || sa.Sent+sb.Sent != n {
		t.Fatalf("stored %d, duplicates %d, relays sent %d+%d; want %d, 0, %d", s.Published, s.Duplicates, sa.Sent, sb.Sent, n, n)
	}
	t.Logf("relay a sent %d, relay b %d", sa.Sent, sb.Sent)
}

// A relay dies after publishing, before marking; the next relay resends
// the row only while the window (2m less 20% margin, less the retry span)
// still covers it, and parks it after that.
func TestResendOrPark(t *testing.T) {
	pool := newPool(t)
	tests := []struct {
		name       string
		after      time.Duration
		wantParked bool
	}{
		{name: "inside the window", after: 30 * time.Second},
		{name: "beyond the window", after: 3 * time.Minute, wantParked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			table := newTable(t, pool)
			clk := clock.NewFake(time.Now())
			broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute, Clock: clk})
			pub := newPublisher(t, broker.Topic("q"))
			first := newRelay(t, pool, pub, outbox.Options{Table: table, Clock: clk, Lease: 10 * time.Second})
			enqueue(t, pool, first, &dedupq.Message{ID: "order-1", GroupKey: "g"}, &dedupq.Message{ID: "order-2", GroupKey: "g"})
			// The crash: the goroutine ends at "published", as a killed
			// process would, with the claim committed and no mark.
			outbox.SetHook(first, func(step string) {
				if step == "published" {
					runtimeGoexit()
				}
			})
			done := make(chan struct{})
			go func() { defer close(done); first.RunOnce(context.Background()) }()
			<-done
			clk.Advance(tt.after)
			var parked []*outbox.ParkedError
			second := newRelay(t, pool, pub, outbox.Options{Table: table, Clock: clk,
				OnParked: func(p *outbox.ParkedError) { parked = append(parked, p) }})
			drain(t, second)
			s := broker.Stats("q")
			pending, nParked := status(t, pool, table)
			if tt.wantParked {
				if len(parked) != 1 || second.Stats().Parked != 1 || nParked != 1 || pending != 1 || s.Published != 1 {
					t.Fatalf("parked %v (stats %d, table %d), pending %d, stored %d; want 1 parked, order-2 held back, 1 stored",
						parked, second.Stats().Parked, nParked, pending, s.Published)
				}
				msg := parked[0].Error()
				for _, want := range []string{"order-1", "was 3m ago", "up to 44.5s after it", "mark it sent", "send it again"} {
					if !strings.Contains(msg, want) {
						t.Errorf("report %q lacks %q", msg, want)
					}
				}
				return
			}
			if len(parked) != 0 || pending != 0 || s.Published != 2 || s.Duplicates != 1 || second.Stats().Resent != 1 {
				t.Fatalf("parked %d, pending %d, stored %d, duplicates %d, resent %d; want 0, 0, 2, 1, 1",
					len(parked), pending, s.Published, s.Duplicates, second.Stats().Resent)
			}
		})
	}
}

func TestNewRelayRefusesUncoveredSpan(t *testing.T) {
	pool := newPool(t)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub := newPublisher(t, broker.Topic("q"))
	tests := []struct {
		name     string
		opts     outbox.Options
		wantErr  bool
		wantSpan time.Duration
	}{
		{name: "default fits the window", wantSpan: 96 * time.Second},
		{name: "resend for 10m", opts: outbox.Options{ResendFor: 10 * time.Minute}, wantErr: true},
		{name: "resend for 10m with a 15m consumer TTL", opts: outbox.Options{ResendFor: 10 * time.Minute, ConsumerDedupTTL: 15 * time.Minute},
			wantSpan: 10*time.Minute + pub.RetryPolicy().Span()},
		{name: "never resend", opts: outbox.Options{ResendFor: -1}, wantSpan: pub.RetryPolicy().Span()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := outbox.NewRelay(pool, pub, tt.opts)
			if tt.wantErr {
				if !errors.Is(err, window.ErrUnsafeRetry) || !strings.Contains(err.Error(), "lower Options.ResendFor to ≤ 44.5s") {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Span() != tt.wantSpan {
				t.Fatalf("Span %s, want %s", r.Span(), tt.wantSpan)
			}
		})
	}
}

// A relay whose Span is zero (one attempt without AttemptTimeout, never
// resend) still sends fresh rows: the span bounds a row's resends, and a
// fresh row's first chunk is its first send, whenever it comes.
func TestZeroSpanRelaySendsFreshRows(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub, err := dedupq.NewPublisher(context.Background(), broker.Topic("q"), dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	r := newRelay(t, pool, pub, outbox.Options{Table: table, ResendFor: -1})
	if r.Span() != 0 {
		t.Fatalf("Span %s, want 0", r.Span())
	}
	enqueue(t, pool, r, &dedupq.Message{ID: "a"}, &dedupq.Message{ID: "b"})
	drain(t, r)
	if s := broker.Stats("q"); s.Published != 2 {
		t.Fatalf("stored %d, want 2", s.Published)
	}
}

// Run wakes on the NOTIFY of a commit and stops cleanly with its context.
func TestRunWakesOnNotify(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	// A poll interval far longer than the test: only NOTIFY can wake it.
	r := newRelay(t, pool, newPublisher(t, broker.Topic("q")), outbox.Options{Table: table, PollInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	t.Cleanup(func() { // before the pool closes, even after a Fatal
		if !stopped {
			cancel()
			<-done
		}
	})
	enqueue(t, pool, r, &dedupq.Message{ID: "n1"})
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats().Sent < 1 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not publish within 10s of the commit")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	stopped = true
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := broker.Stats("q"); s.Published != 1 {
		t.Fatalf("stored %d", s.Published)
	}
}

// Sent rows stay KeepSent, then Sweep deletes them; unsent rows stay.
func TestSweep(t *testing.T) {
	pool := newPool(t)
	table := newTable(t, pool)
	clk := clock.NewFake(time.Now())
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute, Clock: clk})
	r := newRelay(t, pool, newPublisher(t, broker.Topic("q")), outbox.Options{Table: table, Clock: clk, KeepSent: time.Hour})
	enqueue(t, pool, r, &dedupq.Message{ID: "a"}, &dedupq.Message{ID: "b"})
	drain(t, r)
	enqueue(t, pool, r, &dedupq.Message{ID: "c"})
	for _, tt := range []struct {
		advance time.Duration
		want    int64
	}{{30 * time.Minute, 0}, {31 * time.Minute, 2}, {0, 0}} {
		clk.Advance(tt.advance)
		n, err := r.Sweep(context.Background())
		if err != nil || n != tt.want {
			t.Fatalf("after +%s: swept %d (%v), want %d", tt.advance, n, err, tt.want)
		}
	}
	if p, _ := status(t, pool, table); p != 1 {
		t.Fatalf("pending %d, want the unsent row kept", p)
	}
}

func TestCheck(t *testing.T) {
	pool := newPool(t)
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub := newPublisher(t, broker.Topic("q"))
	for _, tt := range []struct {
		name    string
		table   string
		wantErr bool
	}{
		{name: "migrated", table: newTable(t, pool)},
		{name: "missing", table: randName("outbox_missing_"), wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRelay(t, pool, pub, outbox.Options{Table: tt.table})
			err := r.Check(context.Background())
			if (err != nil) != tt.wantErr || (err != nil && !strings.Contains(err.Error(), "EnsureSchema")) {
				t.Fatalf("Check: %v", err)
			}
			if !tt.wantErr {
				return
			}
			// Run fails the same way at once, rather than failing every
			// batch until its context ends and then returning nil.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "EnsureSchema") || ctx.Err() != nil {
				t.Fatalf("Run on a missing table: %v (context: %v)", err, ctx.Err())
			}
		})
	}
}
