package pubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// maxTracked bounds the message IDs a Subscription remembers, for attempt
// counting and for terminated messages.
const maxTracked = 100_000

// shutdownNackTimeout bounds the nacks the client sends when a receive
// ends (Close): a server that does not answer in that time leaves the
// messages to come back when their ack deadlines run out.
const shutdownNackTimeout = 10 * time.Second

// errSettled is matched by the error for settling a delivery that was
// already settled another way.
var errSettled = errors.New("delivery already settled")

// SubscriptionInfo is what the adapter read from the subscription.
type SubscriptionInfo struct {
	// Name is the subscription's full resource name.
	Name string
	// Topic is the full name of the topic it receives from.
	Topic string
	// ExactlyOnce is EnableExactlyOnceDelivery: after a successful ack the
	// message is not redelivered to this subscription, and acks are
	// confirmed. When false, a message may be redelivered even after a
	// successful ack.
	ExactlyOnce bool
	// Ordering is EnableMessageOrdering: messages with the same ordering
	// key are delivered in publish order.
	Ordering bool
	// AckDeadline is AckDeadlineSeconds.
	AckDeadline time.Duration
	// MaxDeliveryAttempts is the dead-letter policy's; zero without one.
	MaxDeliveryAttempts int
	// DeadLetterTopic is the dead-letter policy's topic; empty without one.
	DeadLetterTopic string
	// MinBackoff and MaxBackoff are the retry policy's; both zero without
	// one (redelivery at once).
	MinBackoff, MaxBackoff time.Duration
	// Retention is MessageRetentionDuration: how long the subscription
	// keeps an unacknowledged message, counted from its publication. Zero
	// when the server reported none (Pub/Sub's default, 7 days, applies).
	Retention time.Duration
	// TopicRetention is TopicMessageRetentionDuration, the topic's
	// retention, during which a message stays available to subscribers;
	// zero when the topic retains nothing.
	TopicRetention time.Duration
}

// Pub/Sub's documented defaults for a retry policy's unset fields, and for
// a dead-letter policy's MaxDeliveryAttempts.
const (
	defaultMinBackoff          = 10 * time.Second
	defaultMaxBackoff          = 600 * time.Second
	defaultMaxDeliveryAttempts = 5
	defaultRetention           = 7 * 24 * time.Hour
	minRetention               = 10 * time.Minute
)

func readSubscription(ctx context.Context, c *gpubsub.Client, name string) (SubscriptionInfo, error) {
	s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: name})
	if err != nil {
		return SubscriptionInfo{}, fmt.Errorf("dedupq/pubsub: reading subscription %s: %w", name, err)
	}
	return parseSubscription(s), nil
}

func parseSubscription(s *pb.Subscription) SubscriptionInfo {
	info := SubscriptionInfo{
		Name: s.GetName(), Topic: s.GetTopic(),
		ExactlyOnce: s.GetEnableExactlyOnceDelivery(), Ordering: s.GetEnableMessageOrdering(),
		AckDeadline: time.Duration(s.GetAckDeadlineSeconds()) * time.Second,
	}
	if info.AckDeadline <= 0 {
		info.AckDeadline = minAckExtension
	}
	if dl := s.GetDeadLetterPolicy(); dl != nil && dl.GetDeadLetterTopic() != "" {
		info.DeadLetterTopic = dl.GetDeadLetterTopic()
		info.MaxDeliveryAttempts = int(dl.GetMaxDeliveryAttempts())
		if info.MaxDeliveryAttempts <= 0 {
			info.MaxDeliveryAttempts = defaultMaxDeliveryAttempts
		}
	}
	if d := s.GetMessageRetentionDuration(); d != nil {
		info.Retention = max(d.AsDuration(), 0)
	}
	if d := s.GetTopicMessageRetentionDuration(); d != nil {
		info.TopicRetention = max(d.AsDuration(), 0)
	}
	if rp := s.GetRetryPolicy(); rp != nil {
		info.MinBackoff, info.MaxBackoff = defaultMinBackoff, defaultMaxBackoff
		if d := rp.GetMinimumBackoff(); d != nil {
			info.MinBackoff = d.AsDuration()
		}
		if d := rp.GetMaximumBackoff(); d != nil {
			info.MaxBackoff = d.AsDuration()
		}
	}
	return info
}

// Window is the publish-side window of the subscription's topic: none. Its
// scope names the subscription and whether exactly-once delivery rules out
// redelivery after a successful ack, so that startup errors show it.
func (i SubscriptionInfo) Window() window.Window {
	w := noWindow(i.Topic)
	eo := "off"
	if i.ExactlyOnce {
		eo = "on"
	}
	w.Scope = fmt.Sprintf("subscription %s of %s, exactly-once delivery %s", i.Name, w.Scope, eo)
	w.Settings.Expiry, w.Settings.MinExpiry = subscriptionRetentionSetting, minRetention
	if _, _, topic := i.expiry(); topic {
		w.Settings.Expiry = topicRetentionSetting
	}
	return w
}

// Where a message's expiry is set: the subscription's retention, or the
// topic's where that is longer.
const (
	subscriptionRetentionSetting = "the subscription's message retention (message_retention_duration, 10m to 31d)"
	topicRetentionSetting        = "the topic's message retention (the topic's message_retention_duration, which keeps messages available to its subscriptions however short theirs)"
)

// expiry is the latest a message can be delivered after its publication,
// and so after its first delivery: the longer of the subscription's and
// the topic's retention (Pub/Sub retries delivery until the message
// expires, and a topic's retention keeps its messages available to every
// subscription). ok is false when the server reported no subscription
// retention and the documented default is assumed; topic says the
// topic's retention is the longer.
func (i SubscriptionInfo) expiry() (d time.Duration, discovered, topic bool) {
	d, discovered = i.Retention, i.Retention > 0
	if !discovered {
		d = defaultRetention
	}
	if i.TopicRetention > d {
		return i.TopicRetention, true, true
	}
	return d, discovered, false
}

// lease is the ack deadline the client keeps on a message it holds.
func lease(info SubscriptionInfo, o Options) time.Duration {
	if o.AckExtension > 0 {
		return o.AckExtension
	}
	l := max(info.AckDeadline, minAckExtension)
	if info.ExactlyOnce {
		l = max(l, exactlyOnceAckExtension)
	}
	return min(l, maxAckExtension)
}

// AckError says that an ack was not confirmed on an exactly-once
// subscription: the message may be delivered again.
type AckError struct {
	// MessageID is Pub/Sub's message ID.
	MessageID string
	// Status is the service's answer.
	Status gpubsub.AcknowledgeStatus
	// Err is the client's error, if any.
	Err error
}

// Error implements the error interface.
func (e *AckError) Error() string {
	return fmt.Sprintf("dedupq/pubsub: ack of message %s not confirmed: %s: %v", e.MessageID, statusName(e.Status), e.Err)
}

// Unwrap returns the client's error.
func (e *AckError) Unwrap() error { return e.Err }

func statusName(s gpubsub.AcknowledgeStatus) string {
	switch s {
	case gpubsub.AcknowledgeStatusSuccess:
		return "success"
	case gpubsub.AcknowledgeStatusPermissionDenied:
		return "permission denied"
	case gpubsub.AcknowledgeStatusFailedPrecondition:
		return "failed precondition"
	case gpubsub.AcknowledgeStatusInvalidAckID:
		return "invalid ack ID (expired, or superseded by a redelivery)"
	}
	return "other"
}

// Subscription is a driver.Subscription that receives from one Pub/Sub
// subscription. It is safe for concurrent use.
type Subscription struct {
	client     *gpubsub.Client
	ownsClient bool
	name       string
	opts       Options
	lease      time.Duration
	sub        *gpubsub.Subscriber
	// ch carries messages from the client's callbacks to Receive.
	ch      chan *inflight
	closing chan struct{}

	mu       sync.Mutex
	info     SubscriptionInfo
	closed   bool
	run      *receiveRun
	seen     map[string]int     // deliveries per message ID, without DeliveryAttempt
	poisoned map[string]*poison // terminated message IDs, awaiting dead-lettering

	// onTerminated, set only by tests before the first Receive, sees each
	// redelivery of a terminated message that the callback settles unseen,
	// with how: "nack" or "ack".
	onTerminated func(id, op string)
}

var (
	_ driver.Subscription = (*Subscription)(nil)
	_ driver.NackHolder   = (*Subscription)(nil)
)

// receiveRun is one background call of the client's Subscriber.Receive.
type receiveRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

// inflight is one message between the client's callback and its settlement.
type inflight struct {
	m        *gpubsub.Message
	received time.Time
	once     sync.Once
	done     chan struct{}
	// op and ack are set inside once: read them only after once.Do.
	op  string
	ack *gpubsub.AckResult
}

// settle runs f as the delivery's one settlement, named op, unless it was
// settled before, and returns the op that settled it.
func (it *inflight) settle(op string, f func()) string {
	it.once.Do(func() {
		it.op = op
		f()
		close(it.done)
	})
	return it.op
}

// OpenSubscription opens subscription (an ID in the client's project, or
// projects/P/subscriptions/ID) for receiving, reading its settings first.
// The caller keeps ownership of client. Receiving starts with the first
// Receive.
func OpenSubscription(ctx context.Context, client *gpubsub.Client, subscription string, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, client, false, subscription, opts)
}

func openSubscription(ctx context.Context, client *gpubsub.Client, owns bool, subscription string, opts *Options) (*Subscription, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	name, err := fullName(client.Project(), "subscriptions", subscription)
	if err != nil {
		return nil, err
	}
	info, err := readSubscription(ctx, client, name)
	if err != nil {
		return nil, err
	}
	s := &Subscription{
		client: client, ownsClient: owns, name: name, opts: o, lease: lease(info, o),
		sub: client.Subscriber(name), ch: make(chan *inflight), closing: make(chan struct{}),
		info: info, seen: map[string]int{}, poisoned: map[string]*poison{},
	}
	// Every extension is exactly the lease, so that the lease the
	// Subscription reports is the one a dead holder leaves behind.
	s.sub.ReceiveSettings = gpubsub.ReceiveSettings{
		MaxExtension:               o.MaxExtension,
		MaxDurationPerAckExtension: s.lease,
		MinDurationPerAckExtension: s.lease,
		MaxOutstandingMessages:     o.MaxOutstandingMessages,
		NumGoroutines:              1,
		// When the receive ends, the client first cancels its streaming
		// pull and only then nacks every message it still holds. Its
		// default (wait for the callbacks) nacks them while the stream is
		// still open, so the server could hand one straight back down a
		// stream nobody reads any more, and it would come back only when
		// its ack deadline ran out.
		ShutdownOptions: &gpubsub.ShutdownOptions{
			Behavior: gpubsub.ShutdownBehaviorNackImmediately,
			Timeout:  shutdownNackTimeout,
		},
	}
	return s, nil
}

// Info is the subscription's settings as last read.
func (s *Subscription) Info() SubscriptionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *Subscription) refresh(ctx context.Context) (SubscriptionInfo, error) {
	info, err := readSubscription(ctx, s.client, s.name)
	if err != nil {
		return SubscriptionInfo{}, err
	}
	s.mu.Lock()
	s.info = info
	s.mu.Unlock()
	return info, nil
}

// Window reads the subscription again and reports its topic's window:
// none. Info().ExactlyOnce says whether acked messages can come back.
func (s *Subscription) Window(ctx context.Context) (window.Window, error) {
	info, err := s.refresh(ctx)
	if err != nil {
		return window.Window{}, err
	}
	return info.Window(), nil
}

// Redelivery reads the subscription again and reports its redelivery
// policy: deliveries unlimited in count, bounded by the message's expiry
// (Expiry: the subscription's retention, or the topic's where longer), the
// lease the client keeps as AckWait, and as the backoff before each
// redelivery the longest hold of a nack (the lease, see MaxNackHold) plus
// the retry policy's maximum backoff (none without a retry policy).
//
// The dead-letter policy's MaxDeliveryAttempts is no bound: Pub/Sub honours
// it on a best-effort basis, counts attempts only while the dead-letter
// topic's permissions are right, approximately, and may reset the count
// (see the package doc). What it guarantees is that it stops delivering a
// message once its retention has passed, so that is what Span covers.
//
// The hold is counted because a nacked message can stay held that long
// before Pub/Sub's own backoff starts: without it Span would not be a
// worst case. The Consumer also takes the backoff as the delay of a nack
// whose handler asked for none, so such a nack is held for the lease.
func (s *Subscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	info, err := s.refresh(ctx)
	if err != nil {
		return window.RedeliveryPolicy{}, err
	}
	expiry, discovered, _ := info.expiry()
	r := window.RedeliveryPolicy{AckWait: s.lease, Expiry: expiry, ExpirySource: window.SourceDocumented}
	if discovered {
		r.ExpirySource = window.SourceDiscovered
	}
	if b := s.holdCap() + max(info.MaxBackoff, 0); b > 0 {
		r.Backoff = []time.Duration{b}
	}
	return r, nil
}

// IsRetryable reports whether an error from Receive or a settle call is
// transient, by the rules of Topic.IsRetryable.
func (s *Subscription) IsRetryable(err error) bool { return isRetryable(err) }

// current returns the background receive, starting one if none runs. A
// receive that ended on its own reports its error once; the next call
// starts a new one.
func (s *Subscription) current() (*receiveRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if r := s.run; r != nil {
		select {
		case <-r.done:
			s.run = nil
			return nil, r.err
		default:
			return r, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &receiveRun{cancel: cancel, done: make(chan struct{})}
	s.run = r
	go func() {
		defer close(r.done)
		r.err = s.sub.Receive(ctx, s.callback)
		if r.err == nil && ctx.Err() == nil {
			r.err = errors.New("dedupq/pubsub: the client's receive ended without an error")
		}
		if r.err != nil {
			r.err = fmt.Errorf("dedupq/pubsub: receiving from %s: %w", s.name, r.err)
		}
	}()
	return r, nil
}

// ended reports the end of r to one Receive and forgets it.
func (s *Subscription) ended(r *receiveRun) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.run == r {
		s.run = nil
	}
	if r.err == nil {
		return ErrClosed
	}
	return r.err
}

// callback is the client's Receive callback: it hands m to Receive and then
// holds it until it is settled, so that the client neither settles it nor
// hands out the next message of an ordered key meanwhile.
func (s *Subscription) callback(ctx context.Context, m *gpubsub.Message) {
	if op := s.settlePoisoned(m.ID); op != "" {
		if op == "ack" {
			m.Ack()
		} else {
			m.Nack()
		}
		if s.onTerminated != nil {
			s.onTerminated(m.ID, op)
		}
		return
	}
	it := &inflight{m: m, received: time.Now(), done: make(chan struct{})}
	// When the receive ends (Close cancels it), the callback returns
	// without settling m: the client nacks every message it still holds,
	// after it has closed its stream (see ShutdownOptions above). A nack
	// sent from here could reach the server while the stream is still open.
	select {
	case s.ch <- it:
	case <-ctx.Done():
		return
	case <-s.closing:
		return
	}
	select {
	case <-it.done:
	case <-ctx.Done():
		it.settle("nack", func() {})
		return
	case <-s.closing:
		it.settle("nack", func() {})
		return
	}
}

// Receive waits for the first message the client hands over, then takes
// whatever else is waiting, up to maxMessages.
func (s *Subscription) Receive(ctx context.Context, maxMessages int) ([]*driver.Delivery, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, err := s.current()
	if err != nil {
		return nil, err
	}
	var its []*inflight
	select {
	case it := <-s.ch:
		its = append(its, it)
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.done:
		return nil, s.ended(r)
	case <-s.closing:
		return nil, ErrClosed
	}
more:
	for len(its) < max(maxMessages, 1) {
		select {
		case it := <-s.ch:
			its = append(its, it)
		default:
			break more
		}
	}
	ds := make([]*driver.Delivery, len(its))
	for i, it := range its {
		ds[i] = s.delivery(it)
	}
	return ds, nil
}

func (s *Subscription) delivery(it *inflight) *driver.Delivery {
	m := it.m
	id := m.Attributes[AttrID]
	if id == "" {
		id = m.ID
	}
	var attrs map[string]string
	for k, v := range m.Attributes {
		if strings.HasPrefix(k, ReservedAttrPrefix) && !driver.Portable(k) {
			continue
		}
		if attrs == nil {
			attrs = make(map[string]string, len(m.Attributes))
		}
		attrs[k] = v
	}
	return &driver.Delivery{
		Message:   driver.Message{ID: id, Body: m.Data, Attributes: attrs, GroupKey: m.OrderingKey},
		Attempt:   s.attempt(m),
		BackendID: m.ID,
		Lease:     s.lease,
		// The client received it ahead, and its lease has run since.
		Received: it.received,
		Handle:   it,
	}
}

// attempt is DeliveryAttempt where Pub/Sub gives it (only with a
// dead-letter policy), else this Subscription's own count.
func (s *Subscription) attempt(m *gpubsub.Message) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.seen[m.ID]
	if !ok && len(s.seen) >= maxTracked {
		for k := range s.seen { // evict an arbitrary entry
			delete(s.seen, k)
			break
		}
	}
	n++
	s.seen[m.ID] = n
	if m.DeliveryAttempt != nil && *m.DeliveryAttempt > 0 {
		return *m.DeliveryAttempt
	}
	return n
}

func (s *Subscription) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, id)
}

// poison is a terminated message awaiting dead-lettering: how many times
// this Subscription has nacked it, and after how many it gives up.
type poison struct{ nacks, limit int }

// poison remembers a terminated message, nacked once by Terminate. It is
// nacked again on each redelivery, up to twice the attempts Pub/Sub should
// count before it forwards the message (its count is approximate), and
// then dropped: Pub/Sub counts attempts only while the dead-letter topic's
// permissions are right, and may reset the count, so a message still
// coming back after that many nacks is one it is not going to forward.
func (s *Subscription) poison(id string, attempts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, id)
	if len(s.poisoned) >= maxTracked {
		for k := range s.poisoned {
			delete(s.poisoned, k)
			break
		}
	}
	s.poisoned[id] = &poison{nacks: 1, limit: 2 * max(attempts, defaultMaxDeliveryAttempts)}
}

// settlePoisoned says how to settle a redelivery of message id unseen: "nack"
// while it awaits dead-lettering, "ack" (dropped, and forgotten) once the
// nacks reached their limit, "" when it was not terminated.
func (s *Subscription) settlePoisoned(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.poisoned[id]
	switch {
	case !ok:
		return ""
	case p.nacks >= p.limit:
		delete(s.poisoned, id)
		return "ack"
	}
	p.nacks++
	return "nack"
}

func handle(d *driver.Delivery) (*inflight, error) {
	it, ok := d.Handle.(*inflight)
	if !ok || it == nil {
		return nil, fmt.Errorf("dedupq/pubsub: delivery %s was not received by this adapter", d.BackendID)
	}
	return it, nil
}

// Ack acknowledges d with AckWithResult and waits for the result, which on
// an exactly-once subscription is the service's confirmation: any status
// but Success is an *AckError. Calling Ack again waits for the same result.
func (s *Subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	it, err := handle(d)
	if err != nil {
		return err
	}
	if op := it.settle("ack", func() { it.ack = it.m.AckWithResult() }); op != "ack" {
		return fmt.Errorf("dedupq/pubsub: ack of message %s: %w (%s)", it.m.ID, errSettled, op)
	}
	if err := s.wait(ctx, it); err != nil {
		return err
	}
	s.forget(it.m.ID)
	return nil
}

// wait waits for it's ack result.
func (s *Subscription) wait(ctx context.Context, it *inflight) error {
	st, err := it.ack.Get(ctx)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("dedupq/pubsub: waiting for the ack of message %s: %w", it.m.ID, ctx.Err())
	}
	if st != gpubsub.AcknowledgeStatusSuccess || err != nil {
		return &AckError{MessageID: it.m.ID, Status: st, Err: err}
	}
	return nil
}

// Nack makes d available for redelivery at once, subject to the
// subscription's retry policy. Pub/Sub has no per-message delay: the
// Consumer honours a delay by holding the delivery before it calls Nack
// (driver.NackHolder), the message unsettled in the client meanwhile, whose
// lease management keeps extending its ack deadline; delay is ignored.
func (s *Subscription) Nack(_ context.Context, d *driver.Delivery, _ time.Duration) error {
	it, err := handle(d)
	if err != nil {
		return err
	}
	if op := it.settle("nack", it.m.Nack); op != "nack" {
		return fmt.Errorf("dedupq/pubsub: nack of message %s: %w (%s)", it.m.ID, errSettled, op)
	}
	return nil
}

// MaxNackHold is the longest the Consumer may hold d before its Nack: the
// lease (Delivery.Lease, which covers the wait dedup.Guard asks for), and
// no longer than what remains of Options.MaxExtension since receipt, after
// which the client stops extending the lease.
func (s *Subscription) MaxNackHold(d *driver.Delivery) time.Duration {
	it, err := handle(d)
	if err != nil {
		return 0
	}
	return min(s.holdCap(), s.opts.MaxExtension-time.Since(it.received))
}

// holdCap is the longest hold MaxNackHold allows.
func (s *Subscription) holdCap() time.Duration { return s.lease }

// Terminate stops d reaching a handler again. With a dead-letter policy it
// nacks d and nacks each redelivery to this Subscription unseen, until
// Pub/Sub forwards the message to the dead-letter topic or, when it has
// been nacked twice the dead-letter policy's attempts and still comes
// back, acks it, dropping it; without one it acks d at once, dropping it.
// See the package doc.
func (s *Subscription) Terminate(ctx context.Context, d *driver.Delivery, _ error) error {
	it, err := handle(d)
	if err != nil {
		return err
	}
	if info := s.Info(); info.DeadLetterTopic != "" {
		s.poison(it.m.ID, info.MaxDeliveryAttempts)
		if op := it.settle("terminate", it.m.Nack); op != "terminate" {
			return fmt.Errorf("dedupq/pubsub: terminate of message %s: %w (%s)", it.m.ID, errSettled, op)
		}
		return nil
	}
	if op := it.settle("terminate", func() { it.ack = it.m.AckWithResult() }); op != "terminate" {
		return fmt.Errorf("dedupq/pubsub: terminate of message %s: %w (%s)", it.m.ID, errSettled, op)
	}
	if it.ack == nil {
		return nil // a dead-letter policy appeared after the first call
	}
	if err := s.wait(ctx, it); err != nil {
		return err
	}
	s.forget(it.m.ID)
	return nil
}

// Extend sends nothing: the client extends the lease of every message it
// holds until it is settled or Options.MaxExtension has passed since
// receipt. Extend returns nil while that covers by, and an error once it
// would not (the lease then lapses and the message is redelivered).
func (s *Subscription) Extend(_ context.Context, d *driver.Delivery, by time.Duration) error {
	it, err := handle(d)
	if err != nil {
		return err
	}
	select {
	case <-it.done:
		return fmt.Errorf("dedupq/pubsub: extend of message %s: %w", it.m.ID, errSettled)
	default:
	}
	if held := time.Since(it.received); held+by > s.opts.MaxExtension {
		return fmt.Errorf("dedupq/pubsub: message %s has been held %s; the client stops extending its lease at MaxExtension %s",
			it.m.ID, held.Round(time.Second), s.opts.MaxExtension)
	}
	return nil
}

// Close stops receiving, nacks every message not yet settled — those
// waiting for Receive and those handed out, a Consumer's held ones among
// them — after the client's stream has closed, so that each is redelivered
// at once to the next receiver, and closes the client if the Subscription
// made it.
func (s *Subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.closed = true
	r := s.run
	s.mu.Unlock()
	// The receive ends first, so that the client closes its stream before
	// it nacks what it holds; then the callbacks are released.
	if r != nil {
		r.cancel()
	}
	close(s.closing)
	if r != nil {
		<-r.done
	}
	if s.ownsClient {
		return s.client.Close()
	}
	return nil
}
