package jetstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// DefaultAckWait is the server's AckWait for a consumer created without
// one.
const DefaultAckWait = 30 * time.Second

// pollWait bounds one waiting pull: long enough that an idle consumer
// costs a request every few seconds only. A durable's MaxRequestExpires
// below it shortens the pull to fit (pullWait).
const pollWait = 5 * time.Second

// minPullWait is the shortest MaxRequestExpires a durable may have. The
// client asks the server to expire a pull a tenth of its wait before it
// stops listening itself; below a second that tenth nears a network's
// round trip, so a message the server sends as the pull ends can reach a
// client that has stopped listening (a delivery spent on nobody, back only
// after AckWait), and an idle Consumer would pull several times a second.
const minPullWait = time.Second

// pullWait is how long one waiting pull may last on a durable configured
// as c: pollWait, or the durable's MaxRequestExpires when that is shorter.
// The client sends the server 90% of it as the pull's expiry, within the
// limit, which the server enforces on every pull ("Exceeded
// MaxRequestExpires").
func pullWait(c jetstream.ConsumerConfig) time.Duration {
	if c.MaxRequestExpires > 0 {
		return min(pollWait, c.MaxRequestExpires)
	}
	return pollWait
}

// settleTimeout bounds a settle call whose context has no deadline.
const settleTimeout = 10 * time.Second

// Subscription consumes a stream through a durable pull consumer. It
// implements driver.Subscription and is safe for concurrent use.
type Subscription struct {
	nc      *nats.Conn
	ownConn bool
	release func() // set by URLOpener: called once nc is closed
	js      jetstream.JetStream
	cfg     Config
	// groupPrefix is cfg.Subject and a dot, made once rather than per
	// delivery.
	groupPrefix string

	// provision serializes Provision; mu guards the fields below it.
	provision sync.Mutex
	mu        sync.Mutex
	stream    jetstream.Stream         // nil until the stream exists (Provision)
	cons      jetstream.Consumer       // nil until the durable exists (Provision)
	consCfg   jetstream.ConsumerConfig // as last read from the server, or as it will be created
	closed    bool
}

var (
	_ driver.Subscription     = (*Subscription)(nil)
	_ driver.Provisioner      = (*Subscription)(nil)
	_ driver.UnconfirmedAcker = (*Subscription)(nil)
)

// OpenSubscription opens the durable pull consumer cfg.Durable on the stream
// cfg.Stream. An existing durable is used as it is, after checking that it
// is a pull consumer with explicit acks and that AckWait, MaxDeliver and
// BackOff match cfg where cfg sets them. A missing durable, and a missing
// stream when cfg.CreateStream, are created by Provision, which
// dedupq.NewConsumer calls once its startup check passed (see
// driver.Provisioner); until then Window and Redelivery report what will
// be created, so that a refused open leaves nothing behind. nc stays the
// caller's: Close leaves it open.
func OpenSubscription(ctx context.Context, nc *nats.Conn, cfg Config) (*Subscription, error) {
	return newSubscription(ctx, nc, cfg, false)
}

func newSubscription(ctx context.Context, nc *nats.Conn, cfg Config, ownConn bool) (*Subscription, error) {
	if err := cfg.validate(true); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	stream, err := lookupStream(ctx, js, &cfg)
	if err != nil {
		return nil, err
	}
	var cons jetstream.Consumer
	if stream != nil {
		if cons, err = lookupConsumer(ctx, stream, cfg); err != nil {
			return nil, err
		}
	}
	s := &Subscription{nc: nc, ownConn: ownConn, js: js, cfg: cfg, groupPrefix: cfg.Subject + "."}
	s.set(stream, cons)
	return s, nil
}

// set records the stream and the durable (nil: not created yet), and the
// durable's configuration: as read, or as createConsumer will make it.
func (s *Subscription) set(stream jetstream.Stream, cons jetstream.Consumer) {
	c := plannedConsumer(s.cfg)
	if cons != nil {
		c = cons.CachedInfo().Config
	}
	s.mu.Lock()
	s.stream, s.cons, s.consCfg = stream, cons, c
	s.mu.Unlock()
}

func (s *Subscription) current() (jetstream.Stream, jetstream.Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stream, s.cons
}

// Provision creates what is missing: the stream (with cfg.CreateStream),
// then the durable. When the durable cannot be made, a stream created for
// it is removed again unless something uses it already. A stream or
// durable another process created meanwhile is used when it fits, as at
// open. See driver.Provisioner.
func (s *Subscription) Provision(ctx context.Context) error {
	s.provision.Lock()
	defer s.provision.Unlock()
	stream, cons := s.current()
	if cons != nil {
		return nil
	}
	createdStream := false
	if stream == nil {
		st, created, err := createStream(ctx, s.js, &s.cfg)
		if err != nil {
			return err
		}
		stream, createdStream = st, created
	}
	cons, err := createConsumer(ctx, stream, s.cfg)
	if err != nil {
		if createdStream {
			err = errors.Join(err, removeCreatedStream(ctx, s.js, stream))
		}
		return err
	}
	s.set(stream, cons)
	return nil
}

// consumer is the durable, provisioned first when the Subscription is used
// without dedupq.NewConsumer.
func (s *Subscription) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if _, cons := s.current(); cons != nil {
		return cons, nil
	}
	if err := s.Provision(ctx); err != nil {
		return nil, err
	}
	_, cons := s.current()
	return cons, nil
}

// consumerConfig is the durable createConsumer makes.
func consumerConfig(cfg Config) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:    cfg.Durable,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    cfg.AckWait,
		MaxDeliver: cfg.MaxDeliver,
		BackOff:    cfg.BackOff,
	}
}

// plannedConsumer is the durable createConsumer makes as the server will
// report it, with the server's defaults filled in: AckWait 30s, or
// BackOff's first entry when there is a BackOff; MaxDeliver unlimited (-1).
func plannedConsumer(cfg Config) jetstream.ConsumerConfig {
	c := consumerConfig(cfg)
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if len(c.BackOff) > 0 {
		c.AckWait = c.BackOff[0]
	}
	if c.MaxDeliver == 0 {
		c.MaxDeliver = -1
	}
	return c
}

// lookupConsumer looks the durable up and checks it against cfg; it
// returns nil and no error when the durable does not exist.
func lookupConsumer(ctx context.Context, stream jetstream.Stream, cfg Config) (jetstream.Consumer, error) {
	cons, err := stream.Consumer(ctx, cfg.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: opening durable consumer %s on stream %s: %w", cfg.Durable, cfg.Stream, err)
	}
	return cons, checkConsumer(cons.CachedInfo().Config, cfg)
}

// createConsumer creates the durable, or uses the one another process
// created meanwhile when it fits.
func createConsumer(ctx context.Context, stream jetstream.Stream, cfg Config) (jetstream.Consumer, error) {
	cons, err := stream.CreateConsumer(ctx, consumerConfig(cfg))
	if errors.Is(err, jetstream.ErrConsumerExists) {
		// Created by another process meanwhile: use theirs.
		cons, err = stream.Consumer(ctx, cfg.Durable)
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: creating durable consumer %s on stream %s: %w", cfg.Durable, cfg.Stream, err)
	}
	return cons, checkConsumer(cons.CachedInfo().Config, cfg)
}

// checkConsumer checks a durable's configuration c against cfg, and that
// the adapter's pulls can work with it.
//
// A durable with a PriorityPolicy is refused: the server refuses every
// pull on it that names none of its PriorityGroups ("Priority Group
// missing"), and the adapter has no setting for the group to pull as.
// Picking one on its own would be wrong for each policy: pinned_client
// would take the pin from the client the operator meant to hold it,
// overflow needs the thresholds that make a pull an overflow one, and
// prioritized needs a priority that ranks this client against the others.
func checkConsumer(c jetstream.ConsumerConfig, cfg Config) error {
	var problems []string
	if c.DeliverSubject != "" {
		problems = append(problems, "it is a push consumer; dedupq needs a pull consumer")
	}
	if c.AckPolicy != jetstream.AckExplicitPolicy {
		problems = append(problems, fmt.Sprintf("its AckPolicy is %s; dedupq needs explicit acks", c.AckPolicy))
	}
	if c.MaxRequestExpires > 0 && c.MaxRequestExpires < minPullWait {
		problems = append(problems, fmt.Sprintf("its MaxRequestExpires is %s, too short for dedupq's pulls: raise MaxRequestExpires to %s or more, or to 0 for no limit",
			window.FormatDuration(c.MaxRequestExpires), minPullWait))
	}
	if c.PriorityPolicy != jetstream.PriorityPolicyNone || len(c.PriorityGroups) > 0 {
		policy, _ := c.PriorityPolicy.MarshalJSON()
		problems = append(problems, fmt.Sprintf("its PriorityPolicy is %s with PriorityGroups %v; dedupq pulls without a priority group, which the server refuses on such a durable: use a durable without PriorityPolicy and PriorityGroups",
			strings.Trim(string(policy), `"`), c.PriorityGroups))
	}
	// With BackOff the server sets AckWait to its first entry.
	if cfg.AckWait != 0 && len(cfg.BackOff) == 0 && c.AckWait != cfg.AckWait {
		problems = append(problems, fmt.Sprintf("its AckWait is %s, not %s", window.FormatDuration(c.AckWait), window.FormatDuration(cfg.AckWait)))
	}
	if cfg.MaxDeliver != 0 && c.MaxDeliver != cfg.MaxDeliver && !(cfg.MaxDeliver < 0 && c.MaxDeliver <= 0) {
		problems = append(problems, fmt.Sprintf("its MaxDeliver is %d, not %d", c.MaxDeliver, cfg.MaxDeliver))
	}
	if cfg.BackOff != nil && !slices.Equal(c.BackOff, cfg.BackOff) {
		problems = append(problems, fmt.Sprintf("its BackOff is %v, not %v", c.BackOff, cfg.BackOff))
	}
	if problems != nil {
		return &DurableError{Stream: cfg.Stream, Durable: cfg.Durable, Problems: problems}
	}
	return nil
}

// Receive returns up to n deliveries: those waiting now if any, else the
// first to arrive. It returns ctx's error when ctx ends first.
func (s *Subscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	// A pull over the durable's MaxRequestBatch would be refused.
	s.mu.Lock()
	if limit := s.consCfg.MaxRequestBatch; limit > 0 {
		n = min(n, limit)
	}
	s.mu.Unlock()
	n = min(max(n, 1), 10000)
	cons, err := s.consumer(ctx)
	if err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ds, err := s.fetchNoWait(cons, n)
		if len(ds) > 0 {
			return ds, nil
		}
		if err != nil {
			return nil, s.refused(ctx, cons, err)
		}
		d, err := s.waitOne(ctx, cons)
		if d != nil {
			return []*driver.Delivery{d}, nil
		}
		if err != nil {
			return nil, s.refused(ctx, cons, err)
		}
	}
}

// refused returns a pull's error, having read the durable again when the
// error says it was changed since it was read: a request limit lowered
// (the next pull fits the new one), or a 400 for a pull the adapter makes
// well-formed, which a PriorityPolicy added since causes. A durable no
// longer usable makes a *DurableError.
func (s *Subscription) refused(ctx context.Context, cons jetstream.Consumer, err error) error {
	var pl *pullLimitError
	limit := errors.As(err, &pl) && pl.setting != "MaxWaiting"
	if !limit && !errors.Is(err, jetstream.ErrBadRequest) {
		return err
	}
	info, ierr := cons.Info(ctx)
	if ierr != nil {
		return errors.Join(err, fmt.Errorf("jetstream: reading consumer info: %w", ierr))
	}
	s.mu.Lock()
	s.consCfg = info.Config
	s.mu.Unlock()
	if cerr := checkConsumer(info.Config, s.cfg); cerr != nil {
		return cerr
	}
	return err
}

// fetchNoWait takes what is waiting, up to n, without waiting.
func (s *Subscription) fetchNoWait(cons jetstream.Consumer, n int) ([]*driver.Delivery, error) {
	batch, err := cons.FetchNoWait(n)
	if err != nil {
		return nil, fmt.Errorf("jetstream: fetch: %w", err)
	}
	ds := s.deliveries(batch.Messages(), n)
	if err := batch.Error(); err != nil && len(ds) == 0 {
		return nil, fmt.Errorf("jetstream: fetch: %w", asPullLimit(err))
	}
	return ds, nil
}

// waitOne waits, within one bounded pull, for a single message. It returns
// nothing and no error when the pull expired empty.
//
// The pull is tied to ctx: when ctx ends, the client drops the pull's
// inbox, and the server, which checks a waiting pull's interest before it
// delivers on it, discards the pull. A pull left open instead would take a
// message published after Receive returned, count a delivery nobody
// handled (the next Run sees attempt 2 of a new message, and a consumer
// with MaxDeliver loses one of its deliveries) and hold it for its AckWait
// unless something gives it back.
func (s *Subscription) waitOne(ctx context.Context, cons jetstream.Consumer) (*driver.Delivery, error) {
	s.mu.Lock()
	wait := pullWait(s.consCfg)
	s.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := cons.Fetch(1, jetstream.FetchContext(pctx))
	if err != nil {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// FetchContext refuses a deadline that passed before ctx noticed.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return nil, context.DeadlineExceeded
		}
		return nil, fmt.Errorf("jetstream: fetch: %w", err)
	}
	// The channel closes when the pull ends: a message, the server's
	// expiry, or pctx done (then the client has dropped the pull).
	m, ok := <-batch.Messages()
	if ok {
		// Delivered already, even if ctx ended meanwhile: hand it out
		// rather than leave it to wait out its AckWait.
		d := new(driver.Delivery)
		s.fill(d, m)
		return d, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("jetstream: fetch: %w", asPullLimit(err))
	}
	return nil, nil
}

// deliveries wraps the messages of one pull of up to n. The Deliveries
// come in blocks, each as long as what the client has buffered when it is
// made (and no longer than the pull can still bring): a pull costs an
// allocation or a few instead of one per message, and one that brings
// fewer than n costs no more than it brings. A block stays in memory until
// its last Delivery is settled.
func (s *Subscription) deliveries(msgs <-chan jetstream.Msg, n int) []*driver.Delivery {
	var ds []*driver.Delivery
	var block []driver.Delivery
	for m := range msgs {
		if len(block) == 0 {
			block = make([]driver.Delivery, max(min(len(msgs)+1, n-len(ds)), 1))
		}
		if ds == nil {
			ds = make([]*driver.Delivery, 0, len(block))
		}
		s.fill(&block[0], m)
		ds = append(ds, &block[0])
		block = block[1:]
	}
	return ds
}

// fill makes d the delivery of a consumed message.
func (s *Subscription) fill(d *driver.Delivery, m jetstream.Msg) {
	*d = driver.Delivery{Message: fromNATS(s.groupPrefix, m), Handle: m}
	if delivered, seq, ok := ackReplyFields(m.Reply()); ok {
		d.Attempt, d.BackendID = int(min(delivered, math.MaxInt32)), seq
	}
	d.Attempt = max(d.Attempt, 1)
	s.mu.Lock()
	d.Lease = hold(s.consCfg, d.Attempt)
	s.mu.Unlock()
}

// hold is how long the server holds delivery n before redelivering it:
// BackOff[n-1] (the last entry repeating) when the consumer has BackOff,
// else AckWait.
func hold(c jetstream.ConsumerConfig, n int) time.Duration {
	if l := len(c.BackOff); l > 0 {
		return c.BackOff[min(max(n-1, 0), l-1)]
	}
	if c.AckWait > 0 {
		return c.AckWait
	}
	return DefaultAckWait
}

func msgOf(d *driver.Delivery) (jetstream.Msg, error) {
	if m, ok := d.Handle.(jetstream.Msg); ok && m != nil {
		return m, nil
	}
	return nil, errors.New("jetstream: delivery was not received from this backend")
}

// withDeadline gives ctx a deadline if it has none, for client calls that
// need one.
func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, settleTimeout)
}

// Ack double-acks d: it returns once the server confirmed the ack.
func (s *Subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	m, err := msgOf(d)
	if err != nil {
		return err
	}
	if err := m.DoubleAck(ctx); err != nil {
		return fmt.Errorf("jetstream: ack: %w", err)
	}
	return nil
}

// closeFlushTimeout bounds Close's wait for the server to take the acks
// sent before it.
const closeFlushTimeout = 5 * time.Second

// AckUnconfirmed sends a plain Ack, which the server does not answer: the
// Consumer uses it instead of Ack's DoubleAck where a dedup store covers an
// ack that is lost (driver.UnconfirmedAcker).
func (s *Subscription) AckUnconfirmed(d *driver.Delivery) error {
	m, err := msgOf(d)
	if err != nil {
		return err
	}
	if err := m.Ack(); err != nil {
		return fmt.Errorf("jetstream: ack: %w", err)
	}
	return nil
}

// Nack returns d for redelivery: at once when delay is zero, else after
// delay (plus, on a consumer with BackOff, the server's adjustment
// described in the package doc).
func (s *Subscription) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	m, err := msgOf(d)
	if err != nil {
		return err
	}
	if delay > 0 {
		err = m.NakWithDelay(delay)
	} else {
		err = m.Nak()
	}
	return s.flush(ctx, "nak", err)
}

// Terminate stops redelivery of d with Term, giving reason to servers that
// take one (2.10.4 on; older ones would ignore a Term with a reason).
func (s *Subscription) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	m, err := msgOf(d)
	if err != nil {
		return err
	}
	if reason != nil && serverAtLeast(s.nc.ConnectedServerVersion(), 2, 10, 4) {
		// The reason travels in the ack payload on one line.
		err = m.TermWithReason(strings.Join(strings.Fields(reason.Error()), " "))
	} else {
		err = m.Term()
	}
	return s.flush(ctx, "term", err)
}

// Extend sends InProgress, which restarts d's ack timer: the server then
// holds it for its own hold time again (d.Lease), whatever by asks.
func (s *Subscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	m, err := msgOf(d)
	if err != nil {
		return err
	}
	return s.flush(ctx, "in progress", m.InProgress())
}

// flush makes sure a fire-and-forget ack reached the server: a flush
// returns after the server answered a ping sent behind it.
func (s *Subscription) flush(ctx context.Context, op string, err error) error {
	if err != nil {
		return fmt.Errorf("jetstream: %s: %w", op, err)
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("jetstream: %s sent, but not confirmed to reach the server: %w", op, err)
	}
	return nil
}

// Window reads the stream's dedup window from the server; before Provision
// created the stream, the window it will be created with.
func (s *Subscription) Window(ctx context.Context) (window.Window, error) {
	stream, _ := s.current()
	return currentWindow(ctx, s.js, stream, s.cfg)
}

// Redelivery reads the durable's settings from the server; see the package
// doc for how they make the policy. Before Provision created the durable,
// it reports the durable as Provision will create it.
func (s *Subscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	_, cons := s.current()
	if cons == nil {
		s.mu.Lock()
		c := s.consCfg
		s.mu.Unlock()
		return redeliveryPolicy(c), nil
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return window.RedeliveryPolicy{}, fmt.Errorf("jetstream: reading consumer info: %w", err)
	}
	s.mu.Lock()
	s.consCfg = info.Config
	s.mu.Unlock()
	return redeliveryPolicy(info.Config), nil
}

// redeliveryPolicy is the worst-case policy of a consumer: every delivery
// held for the longest hold the consumer has, nacks redelivering at once.
func redeliveryPolicy(c jetstream.ConsumerConfig) window.RedeliveryPolicy {
	longest := hold(c, 1)
	for _, b := range c.BackOff {
		longest = max(longest, b)
	}
	if c.AckWait > longest {
		longest = c.AckWait
	}
	return window.RedeliveryPolicy{MaxDeliveries: max(c.MaxDeliver, 0), AckWait: longest}
}

// IsRetryable reports whether a Receive or settle error is transient.
func (s *Subscription) IsRetryable(err error) bool { return isRetryable(err) }

// Close releases the subscription, and the connection when the
// subscription dialled it. The durable stays on the server.
func (s *Subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	// A flush is a round trip after every ack handed to the connection
	// (AckUnconfirmed's): once it returns the server has them, so none
	// is lost to the close and redelivered.
	if s.nc.IsConnected() {
		_ = s.nc.FlushTimeout(closeFlushTimeout)
	}
	if s.ownConn {
		s.nc.Close()
	}
	if s.release != nil {
		s.release()
	}
	return nil
}

// serverAtLeast compares a "major.minor.patch[-suffix]" version.
func serverAtLeast(version string, want ...int) bool {
	version, _, _ = strings.Cut(version, "-")
	parts := strings.Split(version, ".")
	for i, w := range want {
		if i >= len(parts) {
			return false
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		if n != w {
			return n > w
		}
	}
	return true
}
