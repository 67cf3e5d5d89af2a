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
		q = &queue{
			b: b, name: name, wake: make(chan struct{}),
			bySeq: make(map[uint64]*message), seen: make(map[string]seenID),
		}
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
	q.sweep(q.now())
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
	now := q.now()
	_, _, ready := q.take(now, 0, true)
	s := q.stats
	s.Ready = ready
	s.DeadLettered = len(q.dead)
	for _, m := range q.msgs {
		if m.gone {
			continue
		}
		s.Stored++
		if len(m.leases) > 0 {
			s.InFlight++
		}
	}
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

// message is one stored message.
type message struct {
	seq        uint64
	msg        driver.Message
	deliveries int
	// availableAt is when the message may be delivered (after a nack's
	// backoff); the zero time means at once.
	availableAt time.Time
	// leases maps each live delivery's token to its lease end. More than
	// one only with injected duplicate deliveries.
	leases map[uint64]time.Time
	// firstEnd is at or before the earliest end in leases (extensions
	// and settles only move that later), so that a scan skips messages
	// whose leases cannot have ended without ranging over the map.
	firstEnd time.Time
	gone     bool
}

type seenID struct {
	at        time.Time
	backendID string
}

type seenEntry struct {
	id string
	at time.Time
}

// queue is one named entity. Its mutex guards everything below it.
type queue struct {
	b    *Broker
	name string

	mu    sync.Mutex
	seq   uint64
	token uint64
	msgs  []*message // in seq order; gone ones are compacted away lazily
	ngone int
	head  int // q.msgs[:head] are all gone: where take starts its scan
	bySeq map[uint64]*message
	seen  map[string]seenID
	seenQ []seenEntry // seen entries in time order, for expiry
	dead  []DeadLetter
	extra []*driver.Delivery // injected duplicate deliveries not yet handed out
	stats Stats
	wake  chan struct{} // closed and replaced on every change a receiver may wait for
	// watched is set when a Receive took wake to wait on, since its last
	// replacement.
	watched bool
}

func (q *queue) now() time.Time { return q.b.clock.Now() }

// changed wakes every blocked Receive; they rescan.
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
	msg := &message{seq: q.seq, msg: cp}
	q.msgs = append(q.msgs, msg)
	q.bySeq[msg.seq] = msg
	q.stats.Published++
	return strconv.FormatUint(msg.seq, 10)
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

// remove drops a message from the queue.
func (q *queue) remove(m *message) {
	m.gone = true
	m.leases = nil
	delete(q.bySeq, m.seq)
	q.ngone++
	if q.ngone > 32 && q.ngone > len(q.msgs)/2 {
		q.msgs = slices.DeleteFunc(q.msgs, func(m *message) bool { return m.gone })
		q.ngone, q.head = 0, 0
	}
}

func (q *queue) deadLetter(m *message, reason string) {
	q.dead = append(q.dead, DeadLetter{
		Message: m.msg, BackendID: strconv.FormatUint(m.seq, 10), Deliveries: m.deliveries, Reason: reason,
	})
	q.remove(m)
}

// expireLeases drops m's leases that ended by now; when the last one ends
// the message is available again at once.
func expireLeases(m *message, now time.Time) {
	if len(m.leases) == 0 || now.Before(m.firstEnd) {
		return
	}
	m.firstEnd = time.Time{}
	for tok, end := range m.leases {
		switch {
		case !end.After(now):
			delete(m.leases, tok)
		case m.firstEnd.IsZero() || end.Before(m.firstEnd):
			m.firstEnd = end
		}
	}
}

// sweep applies everything the passage of time decides: expired leases and
// dead-lettering of messages that used up their deliveries. It runs before
// every read of the state, so that the broker needs no background timer.
func (q *queue) sweep(now time.Time) {
	for _, m := range q.msgs {
		if !m.gone {
			q.age(m, now)
		}
	}
}

// age applies the passage of time to one message.
func (q *queue) age(m *message, now time.Time) {
	expireLeases(m, now)
	limit := q.b.opts.MaxDeliveries
	if limit > 0 && len(m.leases) == 0 && m.deliveries >= limit && !m.availableAt.After(now) {
		q.deadLetter(m, fmt.Sprintf("delivered %d times, the queue's MaxDeliveries", m.deliveries))
	}
}

// take hands out up to n deliveries and reports the next time something
// may become deliverable (zero if nothing is pending on time). With dry
// set it hands out nothing and only counts, in ready, what it would hand
// out with n unbounded.
//
// A take that hands out n deliveries stops scanning there (its next is
// then partial, and unused): Receive must not cost a walk of the whole
// queue. It ages each message it looks at, as sweep would, so that what it
// hands out reflects the passage of time; the messages past the stop are
// aged by the next take, lookup or sweep that reaches them.
func (q *queue) take(now time.Time, n int, dry bool) (out []*driver.Delivery, next time.Time, ready int) {
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if dry {
		ready = len(q.extra)
	}
	for !dry && len(q.extra) > 0 && len(out) < n {
		d := q.extra[0]
		q.extra = q.extra[1:]
		out = append(out, d)
	}
	// Acked messages pile up gone at the front until the next compaction:
	// skip them once, not on every take.
	for q.head < len(q.msgs) && q.msgs[q.head].gone {
		q.head++
	}
	var blocked map[string]bool // groups with an earlier stored message
	for i := q.head; i < len(q.msgs); i++ {
		if !dry && len(out) >= n {
			break
		}
		m := q.msgs[i]
		if m.gone {
			continue
		}
		// age may dead-letter m, and its removal may compact q.msgs;
		// compaction keeps seq order, so carry on after m's seq.
		if q.age(m, now); m.gone {
			if i >= len(q.msgs) || q.msgs[i] != m {
				i = q.resume(m.seq) - 1
			}
			continue
		}
		group := m.msg.GroupKey
		earlier := group != "" && blocked[group]
		if group != "" {
			if blocked == nil {
				blocked = make(map[string]bool)
			}
			blocked[group] = true
		}
		if len(m.leases) > 0 {
			later(m.firstEnd) // may wake a Receive early, never late
			continue
		}
		if m.availableAt.After(now) {
			later(m.availableAt)
			continue
		}
		if earlier {
			continue
		}
		if dry {
			ready++
			continue
		}
		if len(out) >= n {
			continue
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
	return out, next, ready
}

// resume returns the index of the first message in q.msgs with a seq
// greater than seq (q.msgs is in seq order).
func (q *queue) resume(seq uint64) int {
	i, _ := slices.BinarySearchFunc(q.msgs, seq+1, func(m *message, s uint64) int { return cmp.Compare(m.seq, s) })
	return i
}

type handle struct {
	q     *queue
	seq   uint64
	token uint64
}

func (q *queue) deliver(m *message, now time.Time) *driver.Delivery {
	q.token++
	m.deliveries++
	q.stats.Deliveries++
	if m.leases == nil {
		m.leases = make(map[uint64]time.Time)
	}
	end := now.Add(q.b.opts.AckWait)
	m.leases[q.token] = end
	if len(m.leases) == 1 || end.Before(m.firstEnd) {
		m.firstEnd = end
	}
	m.availableAt = time.Time{}
	msg := m.msg
	msg.Body = slices.Clone(m.msg.Body)
	msg.Attributes = maps.Clone(m.msg.Attributes)
	return &driver.Delivery{
		Message: msg, Attempt: m.deliveries, BackendID: strconv.FormatUint(m.seq, 10),
		Lease: q.b.opts.AckWait, Handle: &handle{q: q, seq: m.seq, token: q.token},
	}
}

// lookup finds the message a delivery refers to. It returns nil, nil when
// the message is gone (settled through another delivery, dead-lettered):
// settling it again is harmless, as on JetStream and SQS. It returns
// ErrLeaseExpired when the message is still there but this delivery no
// longer holds it.
func (q *queue) lookup(d *driver.Delivery, now time.Time) (*message, uint64, error) {
	h, ok := d.Handle.(*handle)
	if !ok || h.q != q {
		return nil, 0, fmt.Errorf("mem: delivery %s does not come from queue %q", d.BackendID, q.name)
	}
	m := q.bySeq[h.seq]
	if m == nil {
		return nil, 0, nil
	}
	if q.age(m, now); m.gone {
		return nil, 0, nil
	}
	if _, live := m.leases[h.token]; !live {
		return nil, 0, ErrLeaseExpired
	}
	return m, h.token, nil
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
		ds, next, _ := q.take(now, n, false)
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
	m.leases = nil
	m.availableAt = now.Add(delay)
	q.age(m, now)
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
	m, tok, err := q.lookup(d, now)
	if m == nil || err != nil {
		return err
	}
	if end := now.Add(by); end.After(m.leases[tok]) {
		m.leases[tok] = end
	}
	return nil
}

func (s *subscription) Window(context.Context) (window.Window, error) {
	return s.q.b.window(s.q.name), nil
}

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
