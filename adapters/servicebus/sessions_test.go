package servicebus_test

// Session entities against the Service Bus double (started by TestMain),
// through the real azservicebus SDK and the portable Consumer: several
// Consumers (each on its own client, as separate processes would be) on
// one session queue, a session's owner that closes or dies mid-group, a
// session let go when idle, duplicate detection with sessions, and the
// refusals (an ordered Consumer without sessions, a message without a
// GroupKey to a session entity, a Receiver of the wrong kind).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// sessionProps are a session queue's properties for these tests.
func sessionProps(lock time.Duration) servicebus.EntityProperties {
	return servicebus.EntityProperties{
		RequiresSession: true, RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
		LockDuration: lock, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes,
	}
}

// sessionQueue is a fresh session queue on the double, with a Topic and a
// session Subscription on it, and the options that open more.
type sessionQueue struct {
	name string
	opts *servicebus.Options
	tp   *servicebus.Topic
	sub  *servicebus.Subscription
}

func newSessionQueue(t *testing.T, lock, idle time.Duration) sessionQueue {
	t.Helper()
	d := needDouble(t)
	a := newFakeAdmin()
	q := sessionQueue{name: newQueue(t, d, a, sessionProps(lock)), opts: servicebus.WithAdmin(servicebus.Options{SessionIdle: idle}, a)}
	q.tp, q.sub = openSessionPair(t, newClient(t, d), q.name, q.opts)
	return q
}

// openSessionSub opens one more session Subscription on queue, through a
// client of its own, as another process would.
func openSessionSub(t *testing.T, q string, opts *servicebus.Options) *servicebus.Subscription {
	t.Helper()
	sub, err := servicebus.OpenSessionSubscription(t.Context(), newClient(t, needDouble(t)), servicebus.Entity{Queue: q}, opts)
	if err != nil {
		t.Fatalf("OpenSessionSubscription: %v", err)
	}
	return sub
}

// publishGroups publishes perGroup messages in each of groups, their
// sequence in the attribute "seq", interleaved across the groups.
func publishGroups(t *testing.T, tp driver.Topic, groups []string, perGroup int) {
	t.Helper()
	pub, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	t.Cleanup(func() { pub.Close(context.Background()) })
	var msgs []*dedupq.Message
	for i := 1; i <= perGroup; i++ {
		for _, g := range groups {
			msgs = append(msgs, &dedupq.Message{ID: fmt.Sprintf("%s-%d", g, i), GroupKey: g, Body: []byte(g), Attributes: map[string]string{"seq": strconv.Itoa(i)}})
		}
	}
	if _, err := pub.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
}

// groupLog checks, across every consumer, that a group's messages are
// handled one at a time and in order, and records who handled what.
type groupLog struct {
	mu         sync.Mutex
	running    map[string]string // group → the consumer running one of it
	done       map[string]int    // group → the last seq handled successfully
	handled    map[string][]string
	violations []string
	changed    chan struct{}
}

func newGroupLog() *groupLog {
	return &groupLog{running: map[string]string{}, done: map[string]int{}, handled: map[string][]string{}, changed: make(chan struct{})}
}

// start records that consumer starts d; it returns d's seq.
func (l *groupLog) start(consumer string, d *dedupq.Delivery) int {
	g := d.Message.GroupKey
	i, _ := strconv.Atoi(d.Message.Attributes["seq"])
	l.mu.Lock()
	defer l.mu.Unlock()
	if other := l.running[g]; other != "" {
		l.violations = append(l.violations, fmt.Sprintf("%s #%d started on %s while %s ran one of its group", d.Message.ID, d.Attempt, consumer, other))
	}
	if i != l.done[g]+1 {
		l.violations = append(l.violations, fmt.Sprintf("%s #%d started on %s after %s-%d succeeded", d.Message.ID, d.Attempt, consumer, g, l.done[g]))
	}
	l.running[g] = consumer
	return i
}

// end records the end of a handler start recorded, successful or not.
func (l *groupLog) end(consumer string, d *dedupq.Delivery, ok bool) {
	g := d.Message.GroupKey
	i, _ := strconv.Atoi(d.Message.Attributes["seq"])
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[g] = ""
	if ok {
		l.done[g] = i
		l.handled[consumer] = append(l.handled[consumer], d.Message.ID)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// handle runs a handler of consumer on d: when retry is positive, a
// group's first message fails once (to come again after retry), and
// every other succeeds.
func (l *groupLog) handle(consumer string, d *dedupq.Delivery, retry time.Duration) error {
	i := l.start(consumer, d)
	fail := retry > 0 && i == 1 && d.Attempt == 1
	l.end(consumer, d, !fail)
	if fail {
		return dedupq.RetryAfter(errors.New("the head of the group fails once"), retry)
	}
	return nil
}

// waitAll waits until the last message of every group succeeded.
func (l *groupLog) waitAll(t *testing.T, timeout time.Duration, groups []string, perGroup int) {
	t.Helper()
	l.wait(t, timeout, "every group's last message", func(l *groupLog) bool {
		for _, g := range groups {
			if l.done[g] != perGroup {
				return false
			}
		}
		return true
	})
}

// wait waits until cond holds, failing the test after timeout.
func (l *groupLog) wait(t *testing.T, timeout time.Duration, what string, cond func(*groupLog) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok, changed := cond(l), l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Fatalf("timed out after %s waiting for %s; done %v, handled %v, violations %q", timeout, what, l.done, l.handled, l.violations)
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
}

// runConsumer runs an ordered Consumer on sub until the test ends or the
// returned stop is called.
func runConsumer(t *testing.T, sub driver.Subscription, concurrency int, h dedupq.Handler) (stop func()) {
	t.Helper()
	// A short drain: a test that stops a Consumer under a handler wants
	// it cancelled now, not after the default half a minute.
	con, err := dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Concurrency: concurrency, Ordered: true, ShutdownTimeout: 200 * time.Millisecond})
	if err != nil {
		sub.Close()
		t.Fatalf("NewConsumer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- con.Run(ctx, h) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			con.Close(context.Background())
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestSessionsTwoConsumers: two Consumers on one session queue, each
// holding up to Concurrency sessions, never run two messages of a session
// at once, nor one out of order, though each session's first message
// fails once; both take part, because neither may hold more sessions
// than its Concurrency.
func TestSessionsTwoConsumers(t *testing.T) {
	q := newSessionQueue(t, 5*time.Second, 300*time.Millisecond)
	tp, subA := q.tp, q.sub
	subB := openSessionSub(t, q.name, q.opts)
	groups := []string{"g1", "g2", "g3", "g4", "g5", "g6"}
	const perGroup = 8
	publishGroups(t, tp, groups, perGroup)

	log := newGroupLog()
	// Each consumer's first handler waits until the other has one too:
	// both then provably hold sessions at the same time.
	var started sync.WaitGroup
	started.Add(2)
	bothStarted := make(chan struct{})
	go func() { started.Wait(); close(bothStarted) }()
	handler := func(name string) dedupq.Handler {
		var first sync.Once
		return func(ctx context.Context, d *dedupq.Delivery) error {
			first.Do(func() {
				started.Done()
				select {
				case <-bothStarted:
				case <-time.After(15 * time.Second):
					t.Errorf("consumer %s got a session, the other none within 15s: one consumer held more sessions than its Concurrency", name)
				}
			})
			return log.handle(name, d, 50*time.Millisecond)
		}
	}
	runConsumer(t, subA, 3, handler("A"))
	runConsumer(t, subB, 3, handler("B"))
	log.waitAll(t, 60*time.Second, groups, perGroup)
	log.check(t)
}

// TestSessionTakeoverOnClose: the owner of a session is closed while a
// message of it runs; the other Consumer takes the session over and goes
// on from that message, in order.
func TestSessionTakeoverOnClose(t *testing.T) {
	q := newSessionQueue(t, 5*time.Second, 300*time.Millisecond)
	tp, subA := q.tp, q.sub
	const perGroup = 10
	publishGroups(t, tp, []string{"g"}, perGroup)

	log := newGroupLog()
	running4 := make(chan struct{})
	stopA := runConsumer(t, subA, 2, func(ctx context.Context, d *dedupq.Delivery) error {
		i := log.start("A", d)
		if i == 4 {
			// Mid-group: A is closed under this handler.
			close(running4)
			<-ctx.Done()
			log.end("A", d, false)
			return ctx.Err()
		}
		log.end("A", d, true)
		return nil
	})
	<-running4
	stopA()
	subB := openSessionSub(t, q.name, q.opts)
	var firstB sync.Once
	runConsumer(t, subB, 2, func(_ context.Context, d *dedupq.Delivery) error {
		i := log.start("B", d)
		firstB.Do(func() {
			if i != 4 || d.Attempt != 2 {
				t.Errorf("B started with %s attempt %d, want g-4 attempt 2: the one A held, given back first", d.Message.ID, d.Attempt)
			}
		})
		log.end("B", d, true)
		return nil
	})
	log.wait(t, 30*time.Second, "the group's last message", func(l *groupLog) bool { return l.done["g"] == perGroup })
	log.check(t)
	if got := strings.Join(log.handled["A"], ","); got != "g-1,g-2,g-3" {
		t.Errorf("A handled %s, want g-1,g-2,g-3", got)
	}
}

// TestSessionTakeoverOnLockLapse: a process that took a session and a
// message of it dies without a word (it never settles, renews or
// closes); once the session lock lapses the Consumer takes the session,
// that message first.
func TestSessionTakeoverOnLockLapse(t *testing.T) {
	const lock = 2 * time.Second
	q := newSessionQueue(t, lock, 300*time.Millisecond)
	tp, sub := q.tp, q.sub
	const perGroup = 5
	publishGroups(t, tp, []string{"g"}, perGroup)

	// The dead owner: a bare SDK session receiver on a client of its own.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	dead, err := newClient(t, needDouble(t)).AcceptNextSessionForQueue(ctx, q.name, nil)
	if err != nil {
		t.Fatalf("AcceptNextSessionForQueue: %v", err)
	}
	ms, err := dead.ReceiveMessages(ctx, 1, nil)
	if err != nil || len(ms) != 1 {
		t.Fatalf("the dead owner's ReceiveMessages = %d, %v", len(ms), err)
	}
	lapsed := dead.LockedUntil()

	log := newGroupLog()
	var first sync.Once
	runConsumer(t, sub, 2, func(_ context.Context, d *dedupq.Delivery) error {
		i := log.start("C", d)
		first.Do(func() {
			if now := time.Now(); now.Before(lapsed) {
				t.Errorf("the Consumer got %s at %s, before the dead owner's session lock lapsed at %s", d.Message.ID, now.Format(time.StampMilli), lapsed.Format(time.StampMilli))
			}
			if i != 1 || d.Attempt != 2 {
				t.Errorf("the Consumer started with %s attempt %d, want g-1 attempt 2", d.Message.ID, d.Attempt)
			}
		})
		log.end("C", d, true)
		return nil
	})
	log.wait(t, 30*time.Second, "the group's last message", func(l *groupLog) bool { return l.done["g"] == perGroup })
	log.check(t)
}

// TestSessionIdleRelease: a Consumer with Concurrency 1 holds one session
// at a time; it lets the first go once it has been idle, and takes the
// other.
func TestSessionIdleRelease(t *testing.T) {
	q := newSessionQueue(t, 5*time.Second, 200*time.Millisecond)
	tp, sub := q.tp, q.sub
	publishGroups(t, tp, []string{"ga", "gb"}, 3)
	log := newGroupLog()
	runConsumer(t, sub, 1, func(_ context.Context, d *dedupq.Delivery) error { return log.handle("C", d, 0) })
	log.waitAll(t, 20*time.Second, []string{"ga", "gb"}, 3)
	log.check(t)
}

// TestSessionsDuplicateDetection: duplicate detection works on a session
// entity (MessageId within the window, whatever the session), and a
// message without a GroupKey is refused before anything is sent.
func TestSessionsDuplicateDetection(t *testing.T) {
	q := newSessionQueue(t, 5*time.Second, 0)
	tp, sub := q.tp, q.sub
	defer sub.Close()
	ctx := t.Context()
	pub, err := dedupq.NewPublisher(ctx, tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("NewPublisher: %v", err)
	}
	defer pub.Close(context.Background())
	for _, body := range []string{"first", "resent"} {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", GroupKey: "customer-7", Body: []byte(body)}); err != nil {
			t.Fatalf("Publish %s: %v", body, err)
		}
	}
	_, err = pub.Publish(ctx, &dedupq.Message{ID: "order-2", Body: []byte("no group")})
	var ve *dedupq.ValidationError
	if !errors.As(err, &ve) || ve.Field != "GroupKey" {
		t.Errorf("Publish without GroupKey to a session entity = %v, want a *ValidationError on GroupKey", err)
	}
	got := receiveN(t, sub, 1)
	if string(got[0].Body) != "first" || got[0].GroupKey != "customer-7" {
		t.Errorf("got %q in group %q, want the first send in customer-7", got[0].Body, got[0].GroupKey)
	}
}

// TestSessionRefusals: an ordered Consumer on an entity without sessions
// is refused with the fix; a Receiver cannot open a session entity, nor
// the session Subscription one without sessions.
func TestSessionRefusals(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	c := newClient(t, d)
	plainProps := sessionProps(5 * time.Second)
	plainProps.RequiresSession = false
	plain := newQueue(t, d, a, plainProps)
	session := newQueue(t, d, a, sessionProps(5*time.Second))
	opts := servicebus.WithAdmin(servicebus.Options{}, a)
	ctx := t.Context()

	_, sub := openPair(t, c, plain, opts)
	_, err := dedupq.NewConsumer(ctx, sub, dedupq.ConsumerOptions{Ordered: true})
	if !errors.Is(err, dedupq.ErrOrderingUnsupported) || !strings.Contains(err.Error(), "sessions=true") {
		t.Errorf("ordered NewConsumer without sessions = %v, want ErrOrderingUnsupported naming sessions=true", err)
	}
	sub.Close()

	r, err := c.NewReceiverForQueue(session, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := servicebus.OpenSubscription(ctx, r, servicebus.Entity{Queue: session}, opts); err == nil || !strings.Contains(err.Error(), "OpenSessionSubscription") {
		t.Errorf("OpenSubscription on a session entity = %v, want a refusal naming OpenSessionSubscription", err)
	}
	if _, err := servicebus.OpenSessionSubscription(ctx, c, servicebus.Entity{Queue: plain}, opts); err == nil || !strings.Contains(err.Error(), "OpenSubscription") {
		t.Errorf("OpenSessionSubscription without sessions = %v, want a refusal naming OpenSubscription", err)
	}
}
