package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// messageID is the dedup ID of message i; parseID reads it back.
func messageID(i int) string { return fmt.Sprintf("m%07d", i) }

func parseID(id string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(id, "m"))
	return n, err == nil && strings.HasPrefix(id, "m")
}

// messageBody is the payload of message i: the same on every send, so
// that a resend is a duplicate and not a conflict.
func messageBody(i int) []byte { return fmt.Appendf(nil, `{"order":%d}`, i) }

// unorderedGroups is how many ordering groups an unordered run on a
// broker that needs them (SQS FIFO) spreads its messages over: SQS FIFO
// delivers one message of a group at a time, so one group would make a
// queue of thousands crawl.
const unorderedGroups = 32

// groupOf puts message i in group i % groups. Each group's messages come
// from one publisher when groups is a multiple of the publisher count
// (publisher p sends the IDs i % count == p, in increasing order), so
// its publish order is the order of its IDs.
func groupOf(groups int) func(int) string {
	return func(i int) string { return fmt.Sprintf("g%03d", i%groups) }
}

// groupBacklog is the ConsumerOptions.GroupBacklog of an ordered run:
// every copy of a group's messages may be stored between two copies of
// one (each message, its resend, and both again from the killed
// publisher's second run). Zero for an unordered run.
func groupBacklog(cfg config) int {
	if !cfg.ordered {
		return 0
	}
	return 4 * ((cfg.n + cfg.groups - 1) / cfg.groups)
}

// sendOrder is the order in which publisher p of count sends: its share of
// the IDs (i % count == p), and a resend of about dupRatio of them a few
// hundred sends later, as an application that retries or replays would.
// It depends only on its arguments, so a restarted publisher sends the
// same sequence again from the beginning.
func sendOrder(n, p, count int, dupRatio float64, seed uint64) []int {
	rng := rand.New(rand.NewPCG(seed, uint64(p)+1))
	var ids []int
	for i := p; i < n; i += count {
		ids = append(ids, i)
	}
	// later[k] holds the resends due after the k-th first send.
	later := make(map[int][]int)
	for k, id := range ids {
		if rng.Float64() < dupRatio {
			at := k + 1 + rng.IntN(500)
			later[at] = append(later[at], id)
		}
	}
	order := make([]int, 0, len(ids)+len(ids)/4)
	for k, id := range ids {
		order = append(order, later[k]...)
		order = append(order, id)
	}
	for k := len(ids); k <= len(ids)+500; k++ {
		order = append(order, later[k]...)
	}
	return order
}

// fault is one planned fault: it fires once the effects counted reach at.
type fault struct {
	at   int
	kind string // kill-consumer, kill-publisher, restart-nats, restart-pg, restart-redis
	// index is the consumer or publisher killed.
	index int
	fired bool
}

// schedule plans the faults of a run: each consumer killed kills times,
// publisher 0 killed once, and each server of the run restarted once, at
// effect counts drawn from the seed between 5% and 80% of n, so that
// every fault meets messages in flight.
func schedule(cfg config, servers []string) []*fault {
	rng := rand.New(rand.NewPCG(cfg.seed, 0xc4a05))
	at := func() int { return cfg.n/20 + rng.IntN(cfg.n*3/4) }
	var fs []*fault
	for c := range cfg.consumers {
		for range cfg.kills {
			fs = append(fs, &fault{at: at(), kind: "kill-consumer", index: c})
		}
	}
	// The publisher is killed by its own progress, not by effects: see
	// publisherKillAt.
	for _, s := range servers {
		fs = append(fs, &fault{at: at(), kind: "restart-" + s})
	}
	slices.SortStableFunc(fs, func(a, b *fault) int { return a.at - b.at })
	return fs
}

// publisherKillAt is how many sends publisher 0 makes, on its first run,
// before it is killed: between a fifth and three fifths of its sequence.
func publisherKillAt(cfg config, sends int) int {
	rng := rand.New(rand.NewPCG(cfg.seed, 0x9b1))
	return sends/5 + rng.IntN(sends*2/5+1)
}

// logger writes the run's narrative: always the faults and problems,
// children's warnings only when verbose.
type logger struct {
	mu      sync.Mutex
	w       io.Writer
	verbose bool
	start   time.Time
}

func newLogger(w io.Writer, verbose bool) *logger {
	return &logger{w: w, verbose: verbose, start: time.Now()}
}

// Printf logs one line, stamped with the time since the run started.
func (l *logger) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "chaos %7.2fs "+format+"\n", append([]any{time.Since(l.start).Seconds()}, args...)...)
}

// Debugf logs only when verbose.
func (l *logger) Debugf(format string, args ...any) {
	if l.verbose {
		l.Printf(format, args...)
	}
}
