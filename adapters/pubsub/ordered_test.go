package pubsub_test

// Ordered consumers on subscriptions with message ordering and
// exactly-once delivery, against pstest and the official emulator (see
// main_test.go): the refusal of a subscription without ordering, the
// takeover of a key when its Consumer (with a subscriber client of its
// own) closes mid-group, and a failed head with a backlog. Two Consumers
// sharing the keys is the conformance suite's GroupOrderingTwoConsumers
// (conformance_test.go).
//
// What the two servers model of Pub/Sub's ordering, as read in pstest's
// source (fake.go: orderMsgs, pull, deliver) and probed on the emulator:
//   - pstest hands out only the oldest unacked message of a key, and the
//     next one only once it is acked; a nacked message goes to the next
//     stream (subscriber client) round-robin. So it never streams a key's
//     later messages while an earlier one is out, never redelivers them
//     after a nack, and has no key affinity: the failed-head path of the
//     dispatcher is never taken on pstest.
//   - The emulator streams a key's later messages while an earlier one is
//     out, as Pub/Sub does, and keeps a key on one subscriber client while
//     it is connected. After a nack it does not redeliver the key's later
//     messages; it requeues the nacked message behind the key's messages
//     not yet delivered, and nacked ones in the order of the nacks (publish
//     A1–A7, pull A1–A5, nack A3 A1 A5 A2 A4: the next pull is A6 A7 A3 A1
//     A5), where Pub/Sub redelivers a key in publish order. The Consumer
//     gives back every later message of a key until its failed head comes
//     again, one at a time (the client's callback for a key waits for the
//     delivery to be settled), so the emulator requeues them in order and
//     the head comes first; the tests below pass on it for that reason.
//     When a subscriber client closes, the client nacks what it holds in
//     one request, in no order, and the emulator requeues them so: the
//     takeover check therefore publishes the key's later messages only
//     once the new owner has its head (see TestOrderedTakeover).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/window"
)

// servers are the two servers each ordered test runs on.
var servers = []struct {
	name string
	srv  func(testing.TB) server
}{
	{"pstest", func(testing.TB) server { return pstestServer() }},
	{"emulator", emulatorServer},
}

// TestOrderedRefused: an ordered Consumer is refused on a subscription
// without message ordering, with the fix named; with ordering it is
// accepted.
func TestOrderedRefused(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			srv := s.srv(t)
			c := srv.client(t)
			ctx := t.Context()
			for _, ordering := range []bool{false, true} {
				f := srv.create(ctx, t, c, subConfig{ordering: ordering, exactlyOnce: true})
				sub, err := dpubsub.OpenSubscription(ctx, c, f.sub, srv.options())
				if err != nil {
					t.Fatal(err)
				}
				con, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Ordered: true})
				if ordering {
					if err != nil {
						t.Fatalf("NewConsumer(Ordered) on an ordered subscription: %v", err)
					}
					con.Close(context.Background())
					continue
				}
				sub.Close()
				if err == nil {
					con.Close(context.Background())
					t.Fatal("NewConsumer(Ordered) accepted a subscription without message ordering")
				}
				if !errors.Is(err, dedupq.ErrOrderingUnsupported) || !errors.Is(err, dpubsub.ErrNoMessageOrdering) ||
					!strings.Contains(err.Error(), "create, topic and ordering") || !strings.Contains(err.Error(), f.sub) {
					t.Errorf("NewConsumer(Ordered) = %v; want ErrOrderingUnsupported and ErrNoMessageOrdering naming the subscription and the fix", err)
				}
			}
		})
	}
}

// groupLog checks, across every Consumer of a test, that each key's
// messages run one at a time and in publish order, each once: a message
// starts only when the one before it in its key succeeded.
type groupLog struct {
	mu         sync.Mutex
	running    map[string]string // key → the consumer running one of it
	done       map[string]int    // key → last seq that succeeded
	owners     map[string][]string
	violations []string
	changed    chan struct{}
}

func newGroupLog() *groupLog {
	return &groupLog{running: map[string]string{}, done: map[string]int{}, owners: map[string][]string{}, changed: make(chan struct{})}
}

func (l *groupLog) start(who, key string, seq, attempt int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if other, ok := l.running[key]; ok {
		l.violations = append(l.violations, fmt.Sprintf("%s: %s-%d (attempt %d) started while %s ran one of its key", who, key, seq, attempt, other))
	}
	if seq != l.done[key]+1 {
		l.violations = append(l.violations, fmt.Sprintf("%s: %s-%d (attempt %d) started after %s-%d succeeded", who, key, seq, attempt, key, l.done[key]))
	}
	l.running[key] = who
	if o := l.owners[key]; len(o) == 0 || o[len(o)-1] != who {
		l.owners[key] = append(o, who)
	}
}

func (l *groupLog) end(key string, seq int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.running, key)
	if ok && seq == l.done[key]+1 {
		l.done[key] = seq
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// wait waits until every key in keys has succeeded up to n.
func (l *groupLog) wait(t *testing.T, keys []string, n int, within time.Duration) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		all := true
		for _, k := range keys {
			all = all && l.done[k] >= n
		}
		changed, done, violations := l.changed, fmt.Sprint(l.done), strings.Join(l.violations, "; ")
		l.mu.Unlock()
		if all {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("keys handled up to %s after %s; want %d each (violations: %s)", done, within, n, violations)
		}
	}
}

func (l *groupLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.violations {
		t.Error(v)
	}
	t.Logf("consumers that ran each key, in turn: %v", l.owners)
}

// orderedEnv is an ordered, exactly-once subscription with a publisher.
type orderedEnv struct {
	srv  server
	f    fixture
	pub  *dedupq.Publisher
	opts *dpubsub.Options
}

// newOrderedEnv makes the subscription with the ack deadline lease (zero:
// the shortest the server takes), which its consumers keep.
func newOrderedEnv(t *testing.T, srv server, lease time.Duration) *orderedEnv {
	t.Helper()
	c := srv.client(t)
	opts := srv.options()
	if lease > 0 {
		opts.AckExtension = lease
	}
	f := srv.create(t.Context(), t, c, subConfig{ordering: true, exactlyOnce: true, ackDeadline: opts.AckExtension})
	tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, srv.options())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	return &orderedEnv{srv: srv, f: f, pub: pub, opts: opts}
}

// publish sends seqs from..to of each key, in order.
func (e *orderedEnv) publish(t *testing.T, keys []string, from, to int) {
	t.Helper()
	var msgs []*dedupq.Message
	for i := from; i <= to; i++ {
		for _, k := range keys {
			msgs = append(msgs, &dedupq.Message{
				ID: fmt.Sprintf("%s-%d", k, i), Body: []byte(k), GroupKey: k,
				Attributes: map[string]string{"seq": strconv.Itoa(i)},
			})
		}
	}
	if _, err := e.pub.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
}

// consumer opens an ordered Consumer on its own subscriber client.
func (e *orderedEnv) consumer(t *testing.T, concurrency int) *dedupq.Consumer {
	t.Helper()
	c := e.srv.client(t)
	sub, err := dpubsub.OpenSubscription(t.Context(), c, e.f.sub, e.opts)
	if err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{
		Ordered: true, Concurrency: concurrency, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		sub.Close()
		t.Fatalf("NewConsumer: %v", err)
	}
	t.Cleanup(func() { con.Close(context.Background()) })
	return con
}

// run runs con with h until the returned stop is called (at the latest
// when the test ends), and fails the test if Run fails.
func run(t *testing.T, con *dedupq.Consumer, h dedupq.Handler) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- con.Run(ctx, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, dedupq.ErrClosed) {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func seqOf(d *dedupq.Delivery) int {
	n, _ := strconv.Atoi(d.Message.Attributes["seq"])
	return n
}

// TestOrderedTakeover: the Consumer running a key's message closes
// mid-group, its handler cancelled and the message nacked; the other
// Consumer takes the key over and runs it on from that message, in
// order.
//
// On the emulator the message usually reaches the other Consumer within a
// second, but now and then only after 10 s (the lease) or about 50 s,
// plain subscriptions too (not an effect of ordering): the nack the
// closing client sends does not always take. The waits below allow for
// it, and the test logs how long the takeover took.
func TestOrderedTakeover(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			e := newOrderedEnv(t, s.srv(t), 0)
			keys := []string{"k"}
			const perKey, stuck = 6, 3
			log := newGroupLog()
			owner := make(chan string, 1)
			var once sync.Once
			handler := func(who string) dedupq.Handler {
				return func(ctx context.Context, d *dedupq.Delivery) error {
					seq := seqOf(d)
					log.start(who, "k", seq, d.Attempt)
					first := false
					if seq == stuck {
						once.Do(func() { first = true })
					}
					if first {
						// Hold the message until its consumer closes. (The
						// other consumer counts its own attempts, without a
						// dead-letter policy: its delivery is attempt 1 too.)
						owner <- who
						<-ctx.Done()
						log.end("k", seq, false)
						return ctx.Err()
					}
					log.end("k", seq, true)
					return nil
				}
			}
			cons := map[string]*dedupq.Consumer{"A": e.consumer(t, 2), "B": e.consumer(t, 2)}
			for who, con := range cons {
				run(t, con, handler(who))
			}
			// On pstest the whole group is out at once: pstest hands the
			// next message out only once the one before it is acked. The
			// emulator requeues a closing client's messages in no order
			// (see the file comment), so there the key's later messages are
			// published once the new owner has its head.
			later := s.name == "pstest"
			last := perKey
			if !later {
				last = stuck
			}
			e.publish(t, keys, 1, last)
			var who string
			select {
			case who = <-owner:
			case <-time.After(time.Minute):
				t.Fatalf("no consumer got message %d", stuck)
			}
			start := time.Now()
			closed, cancel := context.WithCancel(context.Background())
			cancel() // the handler is cancelled at once
			if err := cons[who].Close(closed); err != nil {
				t.Logf("Close of the owner %s: %v", who, err)
			}
			t.Logf("%s closed in %s", who, time.Since(start))
			if !later {
				log.wait(t, keys, stuck, time.Minute)
				t.Logf("message %d taken over after %s", stuck, time.Since(start))
				e.publish(t, keys, stuck+1, perKey)
			}
			log.wait(t, keys, perKey, 2*time.Minute)
			t.Logf("the key done after %s", time.Since(start))
			log.check(t)
			log.mu.Lock()
			owners := log.owners["k"]
			log.mu.Unlock()
			if owners[len(owners)-1] == who {
				t.Errorf("the closed consumer %s ran the key last (owners in turn: %v)", who, owners)
			}
		})
	}
}

// TestOrderedFailedHeadBacklog: a key whose later messages the client
// already holds when its head fails (Pub/Sub streams them; so does the
// emulator, not pstest): each is given back until the head comes again,
// and the key then runs in order from the head. Emulator only.
//
// They are given back one at a time (the client calls the callback of a
// key's next message once the one before is settled), each after the
// dispatcher's short hold, and the dispatcher waits for the head for one
// lease: the backlog here stays well within that (30 messages, a 30 s
// lease; see the package doc).
func TestOrderedFailedHeadBacklog(t *testing.T) {
	e := newOrderedEnv(t, emulatorServer(t), 30*time.Second)
	const n = 30
	log := newGroupLog()
	var once sync.Once
	con := e.consumer(t, 4)
	e.publish(t, []string{"k"}, 1, n)
	run(t, con, func(_ context.Context, d *dedupq.Delivery) error {
		seq := seqOf(d)
		log.start("A", "k", seq, d.Attempt)
		fail := false
		if seq == 1 {
			once.Do(func() { fail = true })
		}
		log.end("k", seq, !fail)
		if fail {
			return dedupq.RetryAfter(errors.New("the head fails once"), 200*time.Millisecond)
		}
		return nil
	})
	log.wait(t, []string{"k"}, n, 2*time.Minute)
	log.check(t)
}
