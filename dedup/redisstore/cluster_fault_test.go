// These tests talk to a real Redis Cluster they start for themselves (see
// cluster_test.go) and kill one of its masters by PID with SIGKILL while
// concurrent deliveries claim, complete and release keys on every master
// and a few handlers run through a Guard on keys of the master killed.
// They check every answer against what the deliveries did and report the
// figures with -v.
package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/internal/redisserver"
)

// Phases of a fault run, by when a call started.
const (
	beforeKill = iota
	afterKill  // the master is dead (its process exited); the cluster has not reacted yet
	settled    // without replicas: the others marked it failed; with: its replica took over
	audit      // the deliveries stopped; one more claim of every key used
	phases
)

var phaseNames = [phases]string{"before the kill", "after the kill", "after the cluster reacted", "audit of every key"}

// grant is a claim that a delivery was told it acquired.
type grant struct {
	fp string
	// completing and releasing are set before the call is made, completed
	// once Complete returned nil.
	completing, releasing, completed bool
}

// keyModel is what the deliveries did to one key, by their own account.
type keyModel struct {
	grants  []*grant
	claimed map[string]bool // fingerprint of every claim made, answered or not
}

// oracle checks each answer against the calls made before it, in the
// order the deliveries saw them: a condition a call relies on is recorded
// before the call that establishes it is made (a claim may see a
// completion as soon as Complete is sent) or after it returned (a
// completion is certain only once Complete said so), so the checks hold
// whatever the interleaving.
type oracle struct {
	mu   sync.Mutex
	keys map[string]*keyModel
}

func (o *oracle) key(k string) *keyModel {
	m := o.keys[k]
	if m == nil {
		m = &keyModel{claimed: map[string]bool{}}
		o.keys[k] = m
	}
	return m
}

// beforeClaim records a claim about to be made and reports whether the key
// was certainly completed already.
func (o *oracle) beforeClaim(k, fp string) (completed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.key(k)
	m.claimed[fp] = true
	for _, g := range m.grants {
		completed = completed || g.completed
	}
	return completed
}

// checkClaim returns what is wrong with a claim's answer, "" if nothing,
// and the grant if it acquired. ghost reports an in-progress answer
// carrying the caller's own fingerprint: a claim of its own that the
// client sent again after losing the reply.
func (o *oracle) checkClaim(k, fp string, wasCompleted bool, c dedup.Claim) (wrong string, g *grant, ghost bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := o.key(k)
	switch c.State {
	case dedup.Acquired:
		if wasCompleted {
			return "acquired a key completed before the claim was made", nil, false
		}
		for _, h := range m.grants {
			if !h.releasing {
				return fmt.Sprintf("acquired a key granted to %s, which never released it", h.fp), nil, false
			}
		}
		g = &grant{fp: fp}
		m.grants = append(m.grants, g)
		return "", g, false
	case dedup.InProgress:
		if wasCompleted {
			return "in progress, but completed before the claim was made", nil, false
		}
		if c.Fingerprint == fp {
			return "", nil, true
		}
		if !m.claimed[c.Fingerprint] {
			return fmt.Sprintf("in progress by %q, which never claimed it", c.Fingerprint), nil, false
		}
		return "", nil, false
	case dedup.Completed:
		for _, h := range m.grants {
			if h.completing && h.fp == c.Fingerprint {
				if string(c.Result) != result(h.fp) {
					return fmt.Sprintf("completed with result %q, want %q", c.Result, result(h.fp)), nil, false
				}
				return "", nil, false
			}
		}
		return fmt.Sprintf("completed by %q, which never completed it", c.Fingerprint), nil, false
	}
	return fmt.Sprintf("state %s", c.State), nil, false
}

func result(fp string) string { return "done by " + fp }

// tally counts the calls of one phase, split by whether their key lives
// on the killed master.
type tally struct {
	calls, answered, unavailable, wrong [2]int
	// slowest is the longest call, answered or not.
	slowest [2]time.Duration
}

// faultRun is what a fault run found.
type faultRun struct {
	mu     sync.Mutex
	phase  atomic.Int32
	byPh   [phases]tally
	ghosts int
	wrong  []string
	errs   map[string]int // unavailable errors by cause
	calls  atomic.Int64
	// stop is closed when the deliveries must stop.
	stop chan struct{}
	// held is what the handlers that ran across the kill made of it.
	held struct {
		stats             dedup.Stats
		completed, probed int
	}
}

func (r *faultRun) record(ph int32, victim bool, op string, took time.Duration, err error, wrong string) {
	v := boolInt(victim)
	r.mu.Lock()
	defer r.mu.Unlock()
	t := &r.byPh[ph]
	t.calls[v]++
	t.slowest[v] = max(t.slowest[v], took)
	switch {
	case wrong != "":
		t.wrong[v]++
		r.wrong = append(r.wrong, fmt.Sprintf("%s (%s, victim=%t): %s", op, phaseNames[ph], victim, wrong))
	case err != nil:
		t.unavailable[v]++
		r.errs[op+": "+cause(err)]++
	default:
		t.answered[v]++
	}
	r.calls.Add(1)
}

// cause is the last part of an error's text: the client's own words.
func cause(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	for _, p := range []string{"dial tcp", "read tcp", "write tcp"} {
		if strings.HasPrefix(s, p) {
			return p + " …"
		}
	}
	return s
}

// claim makes a claim and checks its answer, returning the grant if it
// acquired the key.
func (r *faultRun) claim(ctx context.Context, s dedup.Store, o *oracle, k, fp string, victim bool) (*grant, string) {
	ph := r.phase.Load()
	wasCompleted := o.beforeClaim(k, fp)
	start := time.Now()
	c, err := s.Claim(ctx, k, fp, time.Minute)
	took := time.Since(start)
	if err != nil {
		wrong := ""
		if !errors.Is(err, dedup.ErrStoreUnavailable) {
			wrong = fmt.Sprintf("error without ErrStoreUnavailable: %v", err)
		}
		r.record(ph, victim, "claim", took, err, wrong)
		return nil, ""
	}
	wrong, g, ghost := o.checkClaim(k, fp, wasCompleted, c)
	if ghost {
		r.mu.Lock()
		r.ghosts++
		r.mu.Unlock()
	}
	r.record(ph, victim, "claim", took, nil, wrong)
	return g, c.Token
}

// deliver is one delivery's worth of calls, as the Guard makes them:
// claim, then complete (or, one time in four, release, as after a handler
// error).
func (r *faultRun) deliver(ctx context.Context, s dedup.Store, o *oracle, k, fp string, victim bool) {
	g, token := r.claim(ctx, s, o, k, fp, victim)
	if g == nil {
		return
	}
	ph := r.phase.Load()
	release := rand.IntN(4) == 0
	o.mu.Lock()
	if release {
		g.releasing = true
	} else {
		g.completing = true
	}
	o.mu.Unlock()
	op := "complete"
	start := time.Now()
	var err error
	if release {
		op = "release"
		err = s.Release(ctx, k, token)
	} else {
		err = s.Complete(ctx, k, token, time.Minute, []byte(result(fp)))
	}
	took := time.Since(start)
	wrong := ""
	switch {
	case err == nil && !release:
		o.mu.Lock()
		g.completed = true
		o.mu.Unlock()
	case errors.Is(err, dedup.ErrLeaseLost):
		wrong = "lease lost, though nobody could take the key over"
	case err != nil && !errors.Is(err, dedup.ErrStoreUnavailable):
		wrong = fmt.Sprintf("error without ErrStoreUnavailable: %v", err)
	}
	r.record(ph, victim, op, took, err, wrong)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestClusterMasterKilled kills one master of a cluster without replicas
// while 16 deliveries run: its slots stay down, and once the other masters
// mark it failed the whole cluster refuses writes (CLUSTERDOWN, Redis's
// default cluster-require-full-coverage). Every call either answers
// correctly or fails with ErrStoreUnavailable.
func TestClusterMasterKilled(t *testing.T) {
	t.Parallel()
	c, rdb := startCluster(t, redisserver.ClusterOptions{NodeTimeout: 500 * time.Millisecond}, fastFail)
	r := runFault(t, c, rdb, false, func(ctx context.Context, killed *redisserver.Server) (bool, error) {
		// Settled once a surviving master reports the cluster down.
		st, err := c.State(ctx, survivor(c, killed))
		return st == "fail", err
	})
	for ph := afterKill; ph < phases; ph++ {
		if n := r.byPh[ph].answered[1]; n > 0 {
			t.Errorf("%d calls on the killed master's keys answered %s", n, phaseNames[ph])
		}
	}
	if n := r.byPh[settled].answered[0]; n > 0 {
		t.Errorf("%d calls answered once the cluster was down", n)
	}
	if st := r.held.stats; st.Ran != 0 || st.Unrecorded != heldRuns {
		t.Errorf("handlers across the kill: %d completions recorded, %d unrecorded; want 0 and %d, since the cluster was down", st.Ran, st.Unrecorded, heldRuns)
	}
}

// TestClusterFailover kills one master of a cluster with a replica per
// master: the replica takes over its slots, and calls answer again.
// Replication is asynchronous: a write the master acknowledged just before
// it died may be missing on the replica, so that a claim is granted twice
// or a completion forgotten (the caveat in the package doc). Such answers
// on the killed master's keys are counted and reported, not failed; any
// other wrong answer fails the test.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	c, rdb := startCluster(t, redisserver.ClusterOptions{ReplicasPerMaster: 1, NodeTimeout: 500 * time.Millisecond}, fastFail)
	var replica *redisserver.Server
	r := runFault(t, c, rdb, true, func(ctx context.Context, killed *redisserver.Server) (bool, error) {
		if replica == nil {
			var err error
			if replica, err = replicaOf(ctx, c, killed); err != nil {
				return false, err
			}
		}
		// Settled once the replica is a master and the cluster is up.
		cl := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1, DialerRetries: 1})
		defer cl.Close()
		role, err := cl.Do(ctx, "role").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			return false, nil
		}
		st, err := c.State(ctx, survivor(c, killed))
		return st == "ok", err
	})
	if n := r.byPh[settled].answered[1]; n == 0 {
		t.Errorf("no call on the killed master's keys answered after its replica took over")
	}
	if n := r.byPh[audit].unavailable[0] + r.byPh[audit].unavailable[1]; n > 0 {
		t.Errorf("%d claims of the audit unavailable after the failover", n)
	}
	if st := r.held.stats; st.Ran+st.Unrecorded != heldRuns || r.held.completed < int(st.Ran) {
		t.Errorf("handlers across the failover: %d completions recorded, %d unrecorded, %d read back; want %d in all, every recorded one read back",
			st.Ran, st.Unrecorded, r.held.completed, heldRuns)
	}
}

// fastFail makes the client dial a dead node once per attempt instead of
// five times (go-redis's DialerRetries), which keeps the runs short: with
// the default a call that needs a dead master took up to 3.6s to fail here,
// and so did every call pipelined with it, since the client sends a
// pipeline to all its nodes and returns once every part is done.
func fastFail(o *redis.ClusterOptions) { o.DialerRetries = 1 }

// replicaOf finds the replica of master m.
func replicaOf(ctx context.Context, c *redisserver.Cluster, m *redisserver.Server) (*redisserver.Server, error) {
	for _, s := range c.Nodes {
		if s == m {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1})
		info, err := cl.Info(ctx, "replication").Result()
		_ = cl.Close()
		if err != nil {
			return nil, err
		}
		if strings.Contains(info, "master_port:"+m.Addr[strings.LastIndex(m.Addr, ":")+1:]+"\r") {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no replica of %s", m.Addr)
}

// survivor is the index of a master other than killed.
func survivor(c *redisserver.Cluster, killed *redisserver.Server) int {
	if c.Nodes[0] == killed {
		return 1
	}
	return 0
}

// heldRuns is how many handlers run across the kill.
const heldRuns = 6

// runFault runs 16 deliveries over keys of every master, kills the master
// of the first key after 1500 calls, waits until reacted says the cluster
// reacted, runs 300 more calls and stops them. If audited, it then claims
// every key used once more, which checks what the cluster remembers of
// the run. It fails t on any wrong answer off the killed master's keys,
// and on the killed master's keys too unless the cluster has replicas.
func runFault(t *testing.T, c *redisserver.Cluster, rdb *redis.ClusterClient, audited bool,
	reacted func(ctx context.Context, killed *redisserver.Server) (bool, error),
) *faultRun {
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	s := newStore(t, rdb, redisstore.Options{})
	o := &oracle{keys: map[string]*keyModel{}}
	r := &faultRun{errs: map[string]int{}, stop: make(chan struct{})}

	// Keys, and which live on the master to be killed: that of key 0.
	const nkeys = 4000
	keys := make([]string, nkeys)
	victim := make(map[string]bool, nkeys)
	var killed *redisserver.Server
	for i := range keys {
		keys[i] = fmt.Sprintf("fault-%d", i)
		m, err := rdb.MasterForKey(ctx, s.Key(keys[i]))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			killed = c.Node(m.Options().Addr)
		}
		victim[keys[i]] = c.Node(m.Options().Addr) == killed
	}

	// A few handlers run through a Guard on keys of the master to be
	// killed, from before the kill until the cluster has reacted, as
	// handlers still running across the fault would; the Guard then
	// records their completion (or fails to).
	reactedCh := make(chan struct{})
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: s, TTL: time.Minute, Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var heldKeys []string
	for i := 0; len(heldKeys) < heldRuns; i++ {
		k := fmt.Sprintf("held-%d", i)
		m, err := rdb.MasterForKey(ctx, s.Key(k))
		if err != nil {
			t.Fatal(err)
		}
		if c.Node(m.Options().Addr) == killed {
			heldKeys = append(heldKeys, k)
		}
	}
	running := make(chan struct{}, heldRuns)
	h := g.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		running <- struct{}{}
		select {
		case <-reactedCh:
		case <-r.stop:
		}
		return nil
	})
	var held sync.WaitGroup
	heldErrs := make([]error, heldRuns)
	for i, k := range heldKeys {
		held.Go(func() {
			heldErrs[i] = h(ctx, &dedupq.Delivery{Message: dedupq.Message{ID: k, Body: []byte(k)}, Attempt: 1})
		})
	}

	// 16 deliveries, each on a key from a window of 48 that moves on as
	// calls are made, so that several deliveries contend for each key
	// and fresh keys keep coming.
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-r.stop:
					return
				default:
				}
				base := int(r.calls.Load()/6) % (nkeys - 48)
				i := base + rand.IntN(48)
				r.deliver(ctx, s, o, keys[i], fmt.Sprintf("w%d-%d", w, n), victim[keys[i]])
			}
		})
	}
	halt := sync.OnceFunc(func() {
		close(r.stop)
		wg.Wait()
		held.Wait()
	})
	defer func() {
		halt()
		report(t, r, c)
	}()

	waitCalls := func(n int64) {
		t.Helper()
		for r.calls.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("only %d calls made, want %d", r.calls.Load(), n)
			}
			tm := time.NewTimer(time.Millisecond)
			<-tm.C
		}
	}
	waitCalls(1500)
	for range heldRuns {
		select {
		case <-running:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("the Guard's handlers did not start: %v", errors.Join(heldErrs...))
		}
	}
	pid, killedAt := killed.PID(), time.Now()
	killed.Kill()
	r.phase.Store(afterKill)
	t.Logf("killed master %s (pid %d) after %d calls", killed.Addr, pid, r.calls.Load())
	for {
		ok, err := reacted(ctx, killed)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not react to the kill")
		}
		tm := time.NewTimer(5 * time.Millisecond)
		<-tm.C
	}
	r.phase.Store(settled)
	close(reactedCh)
	t.Logf("the cluster reacted %s after the kill, after %d calls", time.Since(killedAt).Round(time.Millisecond), r.calls.Load())
	waitCalls(r.calls.Load() + 300)
	halt()
	for i, err := range heldErrs {
		if err != nil {
			t.Errorf("Guard delivery of %s across the kill: %v", heldKeys[i], err)
		}
	}
	r.held.stats = g.Stats()
	if audited {
		for _, k := range heldKeys {
			cl, err := s.Claim(ctx, k, "probe", time.Minute)
			if err == nil {
				r.held.probed++
				if cl.State == dedup.Completed {
					r.held.completed++
				}
			}
		}
		r.phase.Store(audit)
		o.mu.Lock()
		used := make(chan string, len(o.keys))
		for k := range o.keys {
			used <- k
		}
		o.mu.Unlock()
		close(used)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for k := range used {
					r.claim(ctx, s, o, k, "audit", victim[k])
				}
			})
		}
		wg.Wait()
	}
	return r
}

// report logs a run's figures and fails t on wrong answers not excused
// by failover.
func report(t *testing.T, r *faultRun, c *redisserver.Cluster) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum tally
	for ph, tl := range r.byPh {
		for v, where := range []string{"other masters' keys", "killed master's keys"} {
			t.Logf("%-26s %-21s calls=%-5d answered=%-5d unavailable=%-5d wrong=%d slowest=%s",
				phaseNames[ph], where, tl.calls[v], tl.answered[v], tl.unavailable[v], tl.wrong[v], tl.slowest[v].Round(time.Millisecond))
			sum.calls[v] += tl.calls[v]
			sum.answered[v] += tl.answered[v]
			sum.unavailable[v] += tl.unavailable[v]
			sum.wrong[v] += tl.wrong[v]
		}
	}
	t.Logf("total: calls=%d answered=%d unavailable=%d wrong=%d (on the killed master's keys: %d); in-progress answers naming the caller's own claim (client retry after a lost reply): %d",
		sum.calls[0]+sum.calls[1], sum.answered[0]+sum.answered[1], sum.unavailable[0]+sum.unavailable[1],
		sum.wrong[0]+sum.wrong[1], sum.wrong[1], r.ghosts)
	var causes []string
	for k, n := range r.errs {
		causes = append(causes, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(causes)
	t.Logf("unavailable, by cause: %s", strings.Join(causes, "; "))
	t.Logf("handlers run through a Guard on the killed master's keys across the kill: %d; completion recorded %d, unrecorded %d; read back completed by the audit: %d of %d",
		heldRuns, r.held.stats.Ran, r.held.stats.Unrecorded, r.held.completed, r.held.probed)
	for i, w := range r.wrong {
		if i == 20 {
			t.Logf("… and %d more", len(r.wrong)-20)
			break
		}
		t.Logf("wrong: %s", w)
	}
	if sum.answered[0] == 0 || sum.answered[1] == 0 {
		t.Errorf("no call answered on some masters: the run tested nothing")
	}
	excused := 0
	if len(c.Nodes) > c.Masters {
		excused = sum.wrong[1]
	}
	if n := sum.wrong[0] + sum.wrong[1] - excused; n > 0 {
		t.Errorf("%d wrong answers", n)
	}
}
