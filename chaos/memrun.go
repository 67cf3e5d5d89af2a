package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// memFaults are the broker faults of the mem run, seeded by the run's
// seed: a send the broker receives twice, a delivery handed out twice at
// once, an ack the broker loses.
func memFaults(seed uint64) mem.Faults {
	return mem.Faults{Seed: seed, DuplicatePublish: 0.05, DuplicateDelivery: 0.05, LostAck: 0.05}
}

// memEffects is the mem run's effects table.
type memEffects struct {
	mu   sync.Mutex
	rows []effect
	// open indexes the rows not yet recorded, by instance and ID.
	open map[string]map[int]int
}

func (m *memEffects) add(instance string, id int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.open[instance] == nil {
		m.open[instance] = map[int]int{}
	}
	m.open[instance][id] = len(m.rows)
	m.rows = append(m.rows, effect{id: id, instance: instance, at: time.Now()})
}

func (m *memEffects) mark(instance string, id int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i, ok := m.open[instance][id]; ok {
		m.rows[i].recorded = true
		delete(m.open[instance], id)
	}
}

func (m *memEffects) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows)
}

// memConsumer is one consumer of the mem run; restart ends its Run and
// opens a new one, as a process restart would, under a new instance name.
type memConsumer struct {
	index, gen int
	cancel     context.CancelFunc
	done       chan error
	con        *dedupq.Consumer
	guard      *dedup.Guard
}

// runMem runs the whole matrix entry in this process on a mem broker with
// seeded faults: publishers that send every ID, about dupRatio of them
// twice, with publisher 0 stopped mid-stream and started again from the
// beginning; consumers behind Guards over one memstore, each stopped and
// started again at seeded moments.
func runMem(ctx context.Context, cfg config, log *logger) (*result, error) {
	start := time.Now()
	baseline := runtime.NumGoroutine()
	const queue = "chaos"
	const ttl = dedupTTL // covers an ordered run's backlog, as there
	broker := mem.NewBroker(mem.Options{
		DedupWindow: time.Second, AckWait: 2 * time.Second, MaxDeliveries: 20,
		Faults: memFaults(cfg.seed),
	})
	store := memstore.New(nil)
	effects := &memEffects{open: map[string]map[int]int{}}
	retry := window.RetryPolicy{MaxAttempts: 3}
	quiet := slog.New(slog.DiscardHandler)
	res := &result{backend: "mem", store: "mem"}

	var stats dedup.Stats
	addStats := func(g *dedup.Guard) {
		s := g.Stats()
		stats.Ran += s.Ran
		stats.Suppressed += s.Suppressed
		stats.Unrecorded += s.Unrecorded
		stats.Unavailable += s.Unavailable
		stats.Conflicts += s.Conflicts
	}
	const shutdownTimeout = 5 * time.Second
	startConsumer := func(index, gen int) (*memConsumer, error) {
		instance := fmt.Sprintf("c%d.%d", index, gen)
		guard, err := dedup.NewGuard(dedup.GuardOptions{
			Store: markingStore{Store: store, mark: func(_ context.Context, key string) {
				if id, ok := parseID(key); ok {
					effects.mark(instance, id)
				}
			}},
			TTL: ttl, Logger: quiet,
		})
		if err != nil {
			return nil, err
		}
		con, err := dedupq.NewConsumer(ctx, broker.Subscription(queue), dedupq.ConsumerOptions{
			Concurrency: cfg.concurrency, Dedup: guard, PublisherSpan: retry.WithDefaults().Span(),
			ShutdownTimeout: shutdownTimeout, Logger: quiet, Ordered: cfg.ordered, GroupBacklog: groupBacklog(cfg),
		})
		if err != nil {
			return nil, err
		}
		runCtx, cancel := context.WithCancel(ctx)
		c := &memConsumer{index: index, gen: gen, cancel: cancel, done: make(chan error, 1), con: con, guard: guard}
		go func() {
			c.done <- con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
				id, ok := parseID(d.Message.ID)
				if !ok {
					return dedupq.Permanent(fmt.Errorf("unknown message %q", d.Message.ID))
				}
				effects.add(instance, id)
				return nil
			})
		}()
		return c, nil
	}
	stopConsumer := func(c *memConsumer) error {
		t0 := time.Now()
		c.cancel()
		err := <-c.done
		if took := time.Since(t0); took > shutdownTimeout+time.Second {
			res.problem("consumer c%d.%d took %s to stop, over its ShutdownTimeout %s", c.index, c.gen, took, shutdownTimeout)
		}
		addStats(c.guard)
		return errors.Join(err, c.con.Close(context.Background()))
	}

	consumers := make([]*memConsumer, cfg.consumers)
	for i := range consumers {
		c, err := startConsumer(i, 0)
		if err != nil {
			return nil, err
		}
		consumers[i] = c
	}

	// In an ordered run, group i % groups: each group's messages come from
	// one publisher (groups is a multiple of publishers), in increasing
	// order, so their first effects must come in that order too.
	var group func(int) string
	if cfg.ordered {
		group = groupOf(cfg.groups)
	}

	// Publishers: publisher 0 is stopped at killAt sends on its first run
	// and started again from the beginning.
	var pubWG sync.WaitGroup
	var pubErr atomic.Pointer[error]
	for p := range cfg.publishers {
		order := sendOrder(cfg.n, p, cfg.publishers, cfg.dupRatio, cfg.seed)
		stopAt := -1
		if p == 0 {
			stopAt = publisherKillAt(cfg, len(order))
		}
		pubWG.Go(func() {
			for run := 0; ; run++ {
				pub, err := dedupq.NewPublisher(ctx, broker.Topic(queue), dedupq.PublisherOptions{Retry: &retry, ConsumerDedupTTL: ttl})
				if err != nil {
					pubErr.Store(&err)
					return
				}
				limit := len(order)
				if run == 0 && stopAt >= 0 {
					limit = stopAt
				}
				err = publishOrder(ctx, pub, order[:limit], group, nil, nil)
				pub.Close(ctx)
				if err != nil {
					pubErr.Store(&err)
					return
				}
				if limit == len(order) {
					return
				}
				log.Printf("publisher %d stopped after %d of %d sends; starting it again from the beginning", p, limit, len(order))
			}
		})
	}
	pubDone := make(chan struct{})
	go func() { pubWG.Wait(); close(pubDone) }()

	faults := schedule(cfg, nil)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(cfg.settle + time.Duration(cfg.n/1000)*time.Second)
	published := false
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break loop
		case <-tick.C:
		}
		if e := pubErr.Load(); e != nil {
			runErr = fmt.Errorf("publisher: %w", *e)
			break
		}
		n := effects.count()
		for _, f := range faults {
			if f.fired || n < f.at {
				continue
			}
			f.fired = true
			c := consumers[f.index]
			log.Debugf("restarting consumer c%d.%d at %d effects", c.index, c.gen, n)
			if err := stopConsumer(c); err != nil {
				res.problem("consumer c%d.%d: %v", c.index, c.gen, err)
			}
			nc, err := startConsumer(c.index, c.gen+1)
			if err != nil {
				runErr = err
				break loop
			}
			consumers[f.index] = nc
		}
		if !published {
			select {
			case <-pubDone:
				published = true
			default:
			}
		}
		if published && broker.Stats(queue).Stored == 0 && allFired(faults) {
			break
		}
		if time.Now().After(deadline) {
			s := broker.Stats(queue)
			runErr = fmt.Errorf("not settled in time: %d messages stored, %d in flight", s.Stored, s.InFlight)
			if cfg.verbose {
				buf := make([]byte, 1<<22)
				log.Printf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			}
			break
		}
	}
	for _, c := range consumers {
		if err := stopConsumer(c); err != nil {
			res.problem("consumer c%d.%d: %v", c.index, c.gen, err)
		}
	}
	<-pubDone
	res.deadLettered = len(broker.DeadLetters(queue))
	res.wall = time.Since(start)
	effects.mu.Lock()
	tally(res, cfg.n, effects.rows, nil)
	if cfg.ordered {
		checkGroupOrder(res, cfg.groups, effects.rows)
	}
	effects.mu.Unlock()
	bs := broker.Stats(queue)
	log.Printf("broker: %d stored sends, %d dropped as duplicates, %d deliveries; guards: ran %d, suppressed %d, unrecorded %d",
		bs.Published, bs.Duplicates, bs.Deliveries, stats.Ran, stats.Suppressed, stats.Unrecorded)
	if int(stats.Unrecorded) != res.unrecorded {
		res.problem("the guards counted %d unrecorded completions, the effects show %d", stats.Unrecorded, res.unrecorded)
	}
	if err := goroutinesBackTo(baseline, 5*time.Second); err != nil {
		res.problem("%v", err)
	}
	verdict(res)
	return res, runErr
}

// checkGroupOrder adds a problem for every message whose first effect came
// after the first effect of a later message of its group (i % groups):
// rows are in the order the effects happened.
func checkGroupOrder(res *result, groups int, rows []effect) {
	seen := map[int]bool{}
	last := make([]int, groups)
	for g := range last {
		last[g] = -1
	}
	violations := 0
	for _, r := range rows {
		if seen[r.id] {
			continue
		}
		seen[r.id] = true
		g := r.id % groups
		if r.id < last[g] {
			if violations++; violations <= 5 {
				res.problem("group g%d: %s took effect after %s, published later", g, messageID(r.id), messageID(last[g]))
			}
			continue
		}
		last[g] = r.id
	}
	if violations > 5 {
		res.problem("%d messages in all took effect out of their group's order", violations)
	}
	res.orderChecked, res.outOfOrder = true, violations
}

func allFired(fs []*fault) bool {
	for _, f := range fs {
		if !f.fired {
			return false
		}
	}
	return true
}

// goroutinesBackTo waits until no more goroutines run than baseline: after
// every consumer and publisher is closed, one left over is a leak.
func goroutinesBackTo(baseline int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= baseline {
			return nil
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			return fmt.Errorf("goroutine leak: %d running after shutdown, %d before start:\n%s", n, baseline, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// publishOrder sends the messages of order (indexes into the run's IDs)
// in batches, calling progress after each with the number sent so far.
// With group, each message gets the ordering group it names (SQS FIFO
// needs one). Before each batch it calls wait, when set, to hold off a
// backlog.
func publishOrder(ctx context.Context, pub *dedupq.Publisher, order []int, group func(int) string, wait, progress func(int)) error {
	const batch = 100
	for k := 0; k < len(order); k += batch {
		if wait != nil {
			wait(k)
		}
		msgs := make([]*dedupq.Message, 0, batch)
		for _, i := range order[k:min(k+batch, len(order))] {
			m := &dedupq.Message{ID: messageID(i), Body: messageBody(i)}
			if group != nil {
				m.GroupKey = group(i)
			}
			msgs = append(msgs, m)
		}
		if _, err := pub.PublishBatch(ctx, msgs); err != nil {
			return err
		}
		if progress != nil {
			progress(k + len(msgs))
		}
	}
	return nil
}

// verdict adds the problems the store's promise makes of the counts: the
// transactional path (pg) may repeat nothing; a Guard over a separate
// store only what it left unrecorded (tally has checked each repeat's
// cause already).
func verdict(r *result) {
	if r.store == "pg" && r.duplicated > 0 {
		r.problem("the transactional path repeated %d effect(s)", r.duplicated)
	}
	if r.store == "redis" && r.duplicated > r.unrecorded {
		r.problem("duplicated=%d exceeds unrecorded=%d", r.duplicated, r.unrecorded)
	}
	if r.deadLettered > 0 {
		r.problem("%d message(s) dead-lettered", r.deadLettered)
	}
}
