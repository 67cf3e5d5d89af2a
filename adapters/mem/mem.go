// Package mem is an in-memory message broker that behaves like a real
// at-least-once broker, so that programs and tests run with no services and
// still meet everything dedupq exists for: a publish-side dedup window,
// leases that expire into redelivery, a delivery limit with dead-lettering,
// ordering per group key, and seeded faults (duplicate publishes, duplicate
// deliveries, lost acks).
//
// All timing runs on an injectable clock.Clock, so tests drive leases,
// backoff and the dedup window with clock.Fake instead of sleeping.
//
// A Broker holds named queues. Each queue is one entity with one consumer
// group: every Subscription of a queue competes for the same messages, as
// consumers of one SQS queue or one JetStream durable consumer do.
//
// Importing the package also registers the "mem" URL scheme with
// dedupq.Register, so that dedupq.OpenPublisher and dedupq.OpenConsumer
// reach a process-wide broker by URL; see URLBroker for the parameters.
package mem

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// Backend is the name the broker reports in its window and in validation
// errors.
const Backend = "mem"

// DefaultAckWait is the lease used when Options.AckWait is zero; it matches
// the SQS and JetStream defaults so that programs tried on mem first see the
// timing they will meet in production.
const DefaultAckWait = 30 * time.Second

// MaxBatch is the most messages one SendBatch accepts. It is larger than any
// real broker's batch on purpose: the portable layer's chunking is tested
// against the real backends' small limits, and mem should not make tests
// slow.
const MaxBatch = 100

var (
	// ErrClosed is returned by a Topic or Subscription used after Close.
	ErrClosed = errors.New("mem: closed")
	// ErrLeaseExpired is returned when a delivery is settled or extended
	// after its lease ended (or after another delivery of the same message
	// nacked it): the broker has taken the message back and will deliver
	// it again, as Service Bus reports a lost lock.
	ErrLeaseExpired = errors.New("mem: delivery lease expired; the message will be redelivered")
	// ErrRefused is wrapped by the per-message error of a send the broker
	// refuses (empty ID, over the limits). The portable layer validates
	// first, so only drivers used directly see it.
	ErrRefused = errors.New("mem: message refused")
)

// Faults injects the failures of real at-least-once systems. Every decision
// is a hash of Seed, the queue name, the message ID and the delivery
// attempt, never a shared random stream, so a given seed produces the same
// faults however goroutines interleave.
type Faults struct {
	// Seed selects one deterministic set of faults.
	Seed uint64
	// DuplicatePublish is the probability that the broker receives a send
	// twice, as it does when a publish's first attempt landed but its
	// answer was lost and the client resent it. The caller sees the answer
	// to the second copy: Duplicate within the dedup window, a second
	// stored message without one.
	DuplicatePublish float64
	// DuplicateDelivery is the probability that a delivery is handed out
	// twice at once (to two Receive calls, or twice in one batch), each
	// copy counting as a delivery.
	DuplicateDelivery float64
	// LostAck is the probability that an Ack returns nil but the broker
	// never records it, so the message comes back after its lease.
	LostAck float64
}

// Options configure a Broker. The zero value is a broker on the real clock
// with no dedup window, a 30s lease and unlimited redelivery.
type Options struct {
	// Clock drives leases, backoff and the dedup window; nil means the real
	// clock.
	Clock clock.Clock
	// DedupWindow is how long a published ID is remembered; a send with
	// the same ID within it is dropped and reported as a duplicate. Zero
	// means no publish-side dedup (the window then reports KindNone).
	DedupWindow time.Duration
	// AckWait is the lease on each delivery; zero means DefaultAckWait.
	AckWait time.Duration
	// MaxDeliveries is how many times a message is delivered before it is
	// dead-lettered; zero means unlimited.
	MaxDeliveries int
	// Backoff holds the waits before the 2nd, 3rd, … delivery after a nack
	// without an explicit delay; the last entry repeats. A nack's own
	// delay wins when it is positive.
	Backoff []time.Duration
	// Limits are what the broker accepts; the zero value means
	// DefaultLimits().
	Limits driver.Limits
	// Faults injects failures; the zero value injects none.
	Faults Faults
}

// DefaultLimits are the limits of a broker whose Options leave Limits zero.
// They are the strictest common ground of the real backends (SQS FIFO's
// 128-character printable-ASCII IDs and 10 attributes, Service Bus
// Standard's 256 KiB, Pub/Sub's 1024-byte attribute values), so a program
// that runs on mem does not trip over a real broker's limit later.
func DefaultLimits() driver.Limits {
	return driver.Limits{
		MaxIDLength:            128,
		IDAllowed:              printableASCII,
		MaxMessageBytes:        256 << 10,
		MaxAttributes:          10,
		MaxAttributeValueBytes: 1024,
		MaxGroupKeyLength:      128,
	}
}

// printableASCII accepts '!' through '~': SQS's rule for dedup and group
// IDs, which also keeps IDs safe in logs and URLs.
func printableASCII(r rune) bool { return r >= '!' && r <= '~' }

func zeroLimits(l driver.Limits) bool {
	return l.MaxIDLength == 0 && l.IDAllowed == nil && l.MaxMessageBytes == 0 && l.MaxAttributes == 0 &&
		l.MaxAttributeValueBytes == 0 && !l.GroupKeyRequired && l.MaxGroupKeyLength == 0 &&
		l.GroupKeyAllowed == nil && l.AttributeNameAllowed == nil
}

// Broker is an in-memory broker holding named queues. It is safe for
// concurrent use.
type Broker struct {
	opts  Options
	clock clock.Clock

	mu     sync.Mutex
	queues map[string]*queue
}

// NewBroker returns an empty broker.
func NewBroker(opts Options) *Broker {
	if opts.AckWait <= 0 {
		opts.AckWait = DefaultAckWait
	}
	if opts.DedupWindow < 0 {
		opts.DedupWindow = 0
	}
	if zeroLimits(opts.Limits) {
		opts.Limits = DefaultLimits()
	}
	opts.Backoff = slices.Clone(opts.Backoff)
	return &Broker{opts: opts, clock: clock.Or(opts.Clock), queues: make(map[string]*queue)}
}

// Options returns the options the broker runs with, defaults filled in.
func (b *Broker) Options() Options {
	o := b.opts
	o.Backoff = slices.Clone(o.Backoff)
	return o
}

func (b *Broker) queue(name string) *queue {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[name]
	if q == nil {
		q = newQueue(b, name)
		b.queues[name] = q
	}
	return q
}

// Topic returns a publishing handle on the named queue, creating the queue
// on first use. Each call returns a new handle; closing one leaves the
// queue and the other handles alone.
func (b *Broker) Topic(name string) driver.Topic {
	return &topic{q: b.queue(name), done: make(chan struct{})}
}

// Subscription returns a consuming handle on the named queue. All
// subscriptions of a queue share one consumer group: each message goes to
// one of them at a time.
func (b *Broker) Subscription(name string) driver.Subscription {
	return &subscription{q: b.queue(name), done: make(chan struct{})}
}

// DeadLetter is a message the broker gave up on.
type DeadLetter struct {
	// Message is the message as published.
	Message driver.Message
	// BackendID is the ID the broker gave it on publish.
	BackendID string
	// Deliveries is how many times the message was delivered.
	Deliveries int
	// Reason is the Terminate reason, or why the broker dead-lettered it.
	Reason string
}

// DeadLetters returns the named queue's dead-lettered messages, oldest
// first, so that tests can see what was terminated or ran out of
// deliveries.
func (b *Broker) DeadLetters(name string) []DeadLetter {
	q := b.queue(name)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.advance(q.now())
	out := make([]DeadLetter, len(q.dead))
	for i, d := range q.dead {
		out[i] = d
		out[i].Message.Attributes = maps.Clone(d.Message.Attributes)
	}
	return out
}

// Stats are counters of one queue, as of the broker's clock now.
type Stats struct {
	// Stored is the number of messages held: ready, waiting out a backoff
	// or in flight. Dead letters are not counted.
	Stored int
	// Ready is the number of deliveries a Receive would hand out now:
	// stored messages neither leased, nor waiting out a backoff, nor held
	// behind an earlier message of their group, plus injected duplicate
	// deliveries not yet handed out. Tests use it to check that nothing is
	// deliverable without waiting for a Receive to time out.
	Ready int
	// InFlight is the number of stored messages under a live lease.
	InFlight int
	// DeadLettered is the number of dead letters.
	DeadLettered int
	// Published counts sends that stored a message.
	Published int
	// Duplicates counts sends dropped by the dedup window.
	Duplicates int
	// Deliveries counts deliveries handed to Receive, duplicates included.
	Deliveries int
	// Acked counts acks that removed a message.
	Acked int
}

// Stats returns the named queue's counters, so that tests can check what
// the broker holds without consuming it.
func (b *Broker) Stats(name string) Stats {
	q := b.queue(name)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.advance(q.now())
	s := q.stats
	s.Stored, s.Ready, s.InFlight, s.DeadLettered = q.stored, q.ready(), q.inFlight, len(q.dead)
	return s
}

func (b *Broker) window(name string) window.Window {
	w := window.Window{Backend: Backend, Source: window.SourceConfigured, Scope: "queue " + name, Settings: window.Settings{
		Window:        "Options.DedupWindow (URL parameter window)",
		AckWait:       "Options.AckWait (URL parameter ack_wait)",
		MaxDeliveries: "Options.MaxDeliveries (URL parameter max_deliveries)",
		Backoff:       "Options.Backoff (URL parameter backoff)",
	}}
	if b.opts.DedupWindow > 0 {
		w.Duration, w.Kind = b.opts.DedupWindow, window.KindConfigured
	}
	return w
}

func (b *Broker) redelivery() window.RedeliveryPolicy {
	return window.RedeliveryPolicy{
		MaxDeliveries: b.opts.MaxDeliveries, AckWait: b.opts.AckWait, Backoff: slices.Clone(b.opts.Backoff),
	}
}

// fault decides one injected fault from a hash, so that the decision for a
// given message and attempt does not depend on the order of operations.
func (b *Broker) fault(p float64, kind, queue, id string, n int) bool {
	if !(p > 0) {
		return false
	}
	h := fnv.New64a()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], b.opts.Faults.Seed)
	h.Write(buf[:])
	for _, s := range []string{kind, queue, id} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	binary.LittleEndian.PutUint64(buf[:], uint64(n))
	h.Write(buf[:])
	// FNV alone mixes its last bytes poorly; a splitmix64 finaliser
	// spreads them over the whole word.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/float64(1<<53) < math.Min(p, 1)
}

// message is one stored message. At any moment it is in exactly one of
// these states, each with its own index in the queue (see queue):
//
//   - waiting: behind an earlier stored message of its group, linked from
//     that message's next; in no index of its own.
//   - ready: deliverable now; in q.fresh or q.again.
//   - leased: under at least one live lease; in q.timers at its earliest
//     lease end.
//   - backing off: nacked with a delay; in q.timers at availableAt.
//   - gone: acked or dead-lettered.
type message struct {
	seq        uint64
	backendID  string
	msg        driver.Message
	deliveries int
	// availableAt is when a nacked message may be delivered again; the
	// zero time means at once.
	availableAt time.Time
	// leases are the live deliveries. More than one only with injected
	// duplicate deliveries.
	leases []lease
	// due is the message's key in q.timers: its earliest lease end, or
	// availableAt while it backs off.
	due time.Time
	// pos is 1 + the message's index in q.again or q.timers, 0 in neither.
	pos int
	// next is the following stored message of the same group.
	next *message
	gone bool
}

type lease struct {
	token uint64
	end   time.Time
}

// earliestEnd is the first of m's lease ends; m has at least one lease.
func (m *message) earliestEnd() time.Time {
	end := m.leases[0].end
	for _, l := range m.leases[1:] {
		if l.end.Before(end) {
			end = l.end
		}
	}
	return end
}

// group is the stored messages of one GroupKey, in seq order, as a linked
// list: only head may be delivered, the others wait behind it.
type group struct{ head, tail *message }

type seenID struct {
	at        time.Time
	backendID string
}

type seenEntry struct {
	id string
	at time.Time
}

// queue is one named entity. Its mutex guards everything below it.
//
// A Receive hands out the ready messages in seq order, where ready means
// stored, not leased, not backing off and first of its group. The queue
// keeps the ready ones in two indexes instead of finding them by a scan:
// fresh holds those never delivered that were first of their group when
// published, in seq order as they arrive (a FIFO: O(1)); again holds
// those that became ready later (a lease ended, a backoff ended, or an
// earlier message of the group went), ordered by seq (a heap: O(log n) in
// the few such messages). The next delivery is the lower seq of the two
// heads. Leased and backing-off messages wait in timers, a heap by the
// time at which they next change; the passage of time is applied (advance)
// by popping its due entries before every read of the state, so it costs
// O(log n) per lease end or backoff end, never a walk of the backlog.
type queue struct {
	b    *Broker
	name string

	mu     sync.Mutex
	seq    uint64
	token  uint64
	fresh  fifo
	again  heap // by seq
	timers heap // by due
	groups map[string]*group
	seen   map[string]seenID
	seenQ  []seenEntry // seen entries in time order, for expiry
	dead   []DeadLetter
	extra  []*driver.Delivery // injected duplicate deliveries not yet handed out
	// dying collects the messages one advance dead-letters, so that they
	// join dead in seq order, as a pass over the queue would find them.
	dying    []*message
	stored   int // messages not gone
	inFlight int // messages with a live lease
	stats    Stats
	wake     chan struct{} // closed and replaced on every change a receiver may wait for
	// watched is set when a Receive took wake to wait on, since its last
	// replacement.
	watched bool
}

func newQueue(b *Broker, name string) *queue {
	return &queue{
		b: b, name: name, wake: make(chan struct{}),
		again:  heap{before: func(a, b *message) bool { return a.seq < b.seq }},
		timers: heap{before: func(a, b *message) bool { return a.due.Before(b.due) }},
		groups: make(map[string]*group), seen: make(map[string]seenID),
	}
}

func (q *queue) now() time.Time { return q.b.clock.Now() }

// changed wakes every blocked Receive; they look again.
func (q *queue) changed() {
	if !q.watched {
		return // nobody waits on q.wake: an ack need not allocate a new one
	}
	close(q.wake)
	q.wake = make(chan struct{})
	q.watched = false
}

// store appends a message and returns its backend ID.
func (q *queue) store(m *driver.Message) string {
	q.seq++
	cp := *m
	cp.Body = slices.Clone(m.Body)
	cp.Attributes = maps.Clone(m.Attributes)
	msg := &message{seq: q.seq, backendID: strconv.FormatUint(q.seq, 10), msg: cp}
	q.stored++
	q.stats.Published++
	if key := cp.GroupKey; key != "" {
		if g := q.groups[key]; g != nil {
			g.tail.next, g.tail = msg, msg // waits behind the group's head
			return msg.backendID
		}
		q.groups[key] = &group{head: msg, tail: msg}
	}
	q.fresh.push(msg)
	return msg.backendID
}

// send is one copy of a send arriving at the broker.
func (q *queue) send(now time.Time, m *driver.Message) driver.SendResult {
	win := q.b.opts.DedupWindow
	if win <= 0 {
		return driver.SendResult{BackendID: q.store(m)}
	}
	for len(q.seenQ) > 0 && now.Sub(q.seenQ[0].at) >= win {
		e := q.seenQ[0]
		if s, ok := q.seen[e.id]; ok && s.at.Equal(e.at) {
			delete(q.seen, e.id)
		}
		q.seenQ = q.seenQ[1:]
	}
	if s, ok := q.seen[m.ID]; ok && now.Sub(s.at) < win {
		q.stats.Duplicates++
		return driver.SendResult{BackendID: s.backendID, Duplicate: true}
	}
	id := q.store(m)
	q.seen[m.ID] = seenID{at: now, backendID: id}
	q.seenQ = append(q.seenQ, seenEntry{id: m.ID, at: now})
	return driver.SendResult{BackendID: id}
}

// remove drops a message from the queue. m is leased or was just taken out
// of timers: either way it has been delivered, so it is first of its
// group, and the group's next message becomes ready.
func (q *queue) remove(m *message) {
	if m.pos > 0 {
		q.timers.remove(m)
	}
	if len(m.leases) > 0 {
		q.inFlight--
	}
	m.gone, m.leases = true, nil
	q.stored--
	if key := m.msg.GroupKey; key != "" {
		g := q.groups[key]
		if g == nil || g.head != m {
			panic(fmt.Sprintf("mem: internal error: removing message %d of group %q, which is not the group's head", m.seq, key))
		}
		if g.head, m.next = m.next, nil; g.head == nil {
			delete(q.groups, key)
		} else {
			q.again.push(g.head)
		}
	}
	// A delivery's handle still points at m: drop what it no longer
	// needs, so that a delivery kept after its settle keeps little alive.
	m.msg = driver.Message{}
}

func (q *queue) deadLetter(m *message, reason string) {
	q.dead = append(q.dead, DeadLetter{
		Message: m.msg, BackendID: m.backendID, Deliveries: m.deliveries, Reason: reason,
	})
	q.remove(m)
}

// release returns a message that is neither leased nor backing off any more
// (its last lease ended, its backoff ended, or it was nacked without a
// delay) to the queue: ready again, or into dying when it used up its
// deliveries. m is in no index.
func (q *queue) release(m *message) {
	if limit := q.b.opts.MaxDeliveries; limit > 0 && m.deliveries >= limit {
		q.dying = append(q.dying, m)
		return
	}
	q.again.push(m)
}

// buryDying dead-letters what release set aside, in seq order.
func (q *queue) buryDying() {
	if len(q.dying) == 0 {
		return
	}
	slices.SortFunc(q.dying, func(a, b *message) int { return cmp.Compare(a.seq, b.seq) })
	for i, m := range q.dying {
		q.deadLetter(m, fmt.Sprintf("delivered %d times, the queue's MaxDeliveries", m.deliveries))
		q.dying[i] = nil
	}
	q.dying = q.dying[:0]
}

// advance applies everything the passage of time decides up to now: leases
// that ended, backoffs that ended, and the dead-lettering of messages that
// used up their deliveries. It runs before every read of the state, so
// that the broker needs no background timer, and costs O(log n) for each
// lease or backoff that ended, nothing for the rest of the queue.
func (q *queue) advance(now time.Time) {
	for {
		m := q.timers.min()
		if m == nil || m.due.After(now) {
			break
		}
		if len(m.leases) > 0 {
			m.leases = slices.DeleteFunc(m.leases, func(l lease) bool { return !l.end.After(now) })
			if len(m.leases) > 0 { // an injected duplicate's lease lives on
				m.due = m.earliestEnd()
				q.timers.fix(m)
				continue
			}
			q.inFlight--
		}
		q.timers.remove(m)
		m.availableAt = time.Time{}
		q.release(m)
	}
	q.buryDying()
}

// ready is the number of deliveries a take would hand out now, after
// advance.
func (q *queue) ready() int { return len(q.extra) + q.fresh.len() + q.again.len() }

// nextReady takes the ready message of the lowest seq out of its index,
// or returns nil when none is ready.
func (q *queue) nextReady() *message {
	f, a := q.fresh.peek(), q.again.min()
	switch {
	case a != nil && (f == nil || a.seq < f.seq):
		q.again.remove(a)
		return a
	case f != nil:
		return q.fresh.pop()
	}
	return nil
}

// take hands out up to n deliveries, the injected duplicates first and
// then the ready messages in seq order, and reports the next time
// something may become deliverable (zero if nothing waits on time). It
// costs O(log n) per delivery.
func (q *queue) take(now time.Time, n int) (out []*driver.Delivery, next time.Time) {
	q.advance(now)
	for len(q.extra) > 0 && len(out) < n {
		d := q.extra[0]
		q.extra = q.extra[1:]
		out = append(out, d)
	}
	for len(out) < n {
		m := q.nextReady()
		if m == nil {
			break
		}
		out = append(out, q.deliver(m, now))
		if q.b.fault(q.b.opts.Faults.DuplicateDelivery, "dupdelivery", q.name, m.msg.ID, m.deliveries) {
			d := q.deliver(m, now)
			if len(out) < n {
				out = append(out, d)
			} else {
				q.extra = append(q.extra, d)
			}
		}
	}
	if m := q.timers.min(); m != nil {
		next = m.due
	}
	return out, next
}

type handle struct {
	q     *queue
	m     *message
	token uint64
}

// deliver leases m to one delivery. m is ready, or leased already when
// this is an injected duplicate of the delivery just made.
func (q *queue) deliver(m *message, now time.Time) *driver.Delivery {
	q.token++
	m.deliveries++
	q.stats.Deliveries++
	end := now.Add(q.b.opts.AckWait)
	m.leases = append(m.leases, lease{token: q.token, end: end})
	m.availableAt = time.Time{}
	if len(m.leases) == 1 {
		q.inFlight++
		m.due = end
		q.timers.push(m)
	} else if end.Before(m.due) {
		m.due = end
		q.timers.fix(m)
	}
	msg := m.msg
	msg.Body = slices.Clone(m.msg.Body)
	msg.Attributes = maps.Clone(m.msg.Attributes)
	return &driver.Delivery{
		Message: msg, Attempt: m.deliveries, BackendID: m.backendID,
		Lease: q.b.opts.AckWait, Handle: &handle{q: q, m: m, token: q.token},
	}
}

// lookup finds the message a delivery refers to, after applying the
// passage of time. It returns nil, -1, nil when the message is gone
// (settled through another delivery, dead-lettered): settling it again is
// harmless, as on JetStream and SQS. It returns ErrLeaseExpired when the
// message is still there but this delivery no longer holds it. Otherwise
// it returns the index of the delivery's lease in m.leases.
func (q *queue) lookup(d *driver.Delivery, now time.Time) (*message, int, error) {
	h, ok := d.Handle.(*handle)
	if !ok || h.q != q {
		return nil, -1, fmt.Errorf("mem: delivery %s does not come from queue %q", d.BackendID, q.name)
	}
	q.advance(now)
	m := h.m
	if m.gone {
		return nil, -1, nil
	}
	for i, l := range m.leases {
		if l.token == h.token {
			return m, i, nil
		}
	}
	return nil, -1, ErrLeaseExpired
}

// topic is a publishing handle.
type topic struct {
	q        *queue
	closeOne sync.Once
	done     chan struct{}
}

func (t *topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case <-t.done:
		return nil, ErrClosed
	default:
	}
	if len(msgs) > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d, at most %d", ErrRefused, len(msgs), MaxBatch)
	}
	q, b := t.q, t.q.b
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	out := make([]driver.SendResult, len(msgs))
	for i, m := range msgs {
		if err := b.check(m); err != nil {
			out[i].Err = err
			continue
		}
		out[i] = q.send(now, m)
		if b.fault(b.opts.Faults.DuplicatePublish, "duppublish", q.name, m.ID, 0) {
			out[i] = q.send(now, m)
		}
	}
	q.changed()
	return out, nil
}

// check refuses what a real broker would refuse, for drivers used without
// the portable layer's validation.
func (b *Broker) check(m *driver.Message) error {
	lim := b.opts.Limits
	switch {
	case m == nil:
		return fmt.Errorf("%w: nil message", ErrRefused)
	case m.ID == "":
		return fmt.Errorf("%w: empty ID", ErrRefused)
	case lim.MaxIDLength > 0 && len(m.ID) > lim.MaxIDLength:
		return fmt.Errorf("%w: ID of %d bytes, at most %d", ErrRefused, len(m.ID), lim.MaxIDLength)
	case lim.MaxMessageBytes > 0 && m.Size() > lim.MaxMessageBytes:
		return fmt.Errorf("%w: message of %d bytes, at most %d", ErrRefused, m.Size(), lim.MaxMessageBytes)
	}
	return nil
}

func (t *topic) MaxBatch() int                  { return MaxBatch }
func (t *topic) Limits() driver.Limits          { return t.q.b.opts.Limits }
func (t *topic) HiddenRetrySpan() time.Duration { return 0 }

// IsRetryable is false for every mem error: they are refusals or misuse,
// and a resend would get the same answer.
func (t *topic) IsRetryable(error) bool { return false }

func (t *topic) Window(context.Context) (window.Window, error) { return t.q.b.window(t.q.name), nil }

func (t *topic) Close() error {
	t.closeOne.Do(func() { close(t.done) })
	return nil
}

// subscription is a consuming handle.
type subscription struct {
	q        *queue
	closeOne sync.Once
	done     chan struct{}
}

func (s *subscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	n = max(n, 1)
	q, clk := s.q, s.q.b.clock
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, ErrClosed
		default:
		}
		q.mu.Lock()
		now := q.now()
		ds, next := q.take(now, n)
		wake := q.wake
		q.watched = q.watched || len(ds) == 0
		q.mu.Unlock()
		if len(ds) > 0 {
			return ds, nil
		}
		// Nothing is deliverable: wait for a change (publish, nack, ack
		// that frees a group) or for the next lease end or backoff on the
		// broker's clock, whichever comes first.
		var timeout <-chan time.Time
		var timer clock.Timer
		if !next.IsZero() {
			timer = clk.NewTimer(next.Sub(now))
			timeout = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-s.done:
		case <-wake:
		case <-timeout:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

func (s *subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	m, _, err := q.lookup(d, q.now())
	if m == nil || err != nil {
		return err
	}
	if q.b.fault(q.b.opts.Faults.LostAck, "lostack", q.name, m.msg.ID, d.Attempt) {
		return nil
	}
	q.remove(m)
	q.stats.Acked++
	q.changed()
	return nil
}

func (s *subscription) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	m, _, err := q.lookup(d, now)
	if m == nil || err != nil {
		return err
	}
	if delay <= 0 {
		delay = q.b.redelivery().BackoffBefore(m.deliveries + 1)
	}
	// The nack returns the message to the queue: every other delivery of
	// it (an injected duplicate) loses its lease with it.
	m.leases = m.leases[:0]
	q.inFlight--
	if m.availableAt = now.Add(delay); m.availableAt.After(now) {
		m.due = m.availableAt // backs off, still in timers
		q.timers.fix(m)
	} else {
		q.timers.remove(m)
		m.availableAt = time.Time{}
		q.release(m)
		q.buryDying()
	}
	q.changed()
	return nil
}

func (s *subscription) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	m, _, err := q.lookup(d, q.now())
	if m == nil || err != nil {
		return err
	}
	why := "terminated"
	if reason != nil {
		why = "terminated: " + reason.Error()
	}
	q.deadLetter(m, why)
	q.changed()
	return nil
}

func (s *subscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	m, i, err := q.lookup(d, now)
	if m == nil || err != nil {
		return err
	}
	if end := now.Add(by); end.After(m.leases[i].end) {
		m.leases[i].end = end
		m.due = m.earliestEnd()
		q.timers.fix(m)
	}
	return nil
}

func (s *subscription) Window(context.Context) (window.Window, error) {
	return s.q.b.window(s.q.name), nil
}

// OrdersGroups reports nil: the broker hands out a group's messages in
// publish order, none while an earlier one is stored (driver.GroupOrderer).
func (s *subscription) OrdersGroups(context.Context) error { return nil }

func (s *subscription) Redelivery(context.Context) (window.RedeliveryPolicy, error) {
	return s.q.b.redelivery(), nil
}

// IsRetryable is false for every mem error: none of them is transient.
func (s *subscription) IsRetryable(error) bool { return false }

// Close wakes a blocked Receive. Unsettled deliveries stay leased and come
// back when their leases end, as on a real broker.
func (s *subscription) Close() error {
	s.closeOne.Do(func() { close(s.done) })
	return nil
}
