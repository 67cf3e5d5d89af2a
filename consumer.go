package dedupq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/settlectx"
	"github.com/dedupq/dedupq/window"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ErrShutdownTimeout is the cause of a handler's context cancellation when
// the handler outlives the graceful drain: ConsumerOptions.ShutdownTimeout
// after Run's context was done or Close was called, or Close's context
// ending first. Its delivery is nacked, so it is not lost.
var ErrShutdownTimeout = errors.New("dedupq: shutdown timeout: handler cancelled")

// ConsumerOptions configure a Consumer. The zero value is usable.
type ConsumerOptions struct {
	// Concurrency is how many handlers run at once; 0 means 1. Where the
	// subscription keeps the order of a group key (driver.GroupOrderer:
	// mem, SQS FIFO, Service Bus sessions; README, "Ordered groups"), the
	// deliveries of one GroupKey run one at a time, in
	// the broker's order, and different groups run concurrently; a
	// delivery waiting behind its group's head takes a handler slot (see
	// Ordered). Without
	// Dedup a delivery holds its handler's place until its settle (ack,
	// nack, terminate) is confirmed; with Dedup only until the handler
	// returns (see Dedup), and up to 4 × Concurrency settles more may be
	// in flight.
	Concurrency int
	// Ordered asks for the messages of one GroupKey to be handled one at a
	// time, in publish order: a message's handler starts only once the one
	// before it in its group has succeeded or been terminated; when it
	// fails, the messages behind it are given back unhandled and come again
	// after it. NewConsumer fails with an error matching
	// ErrOrderingUnsupported, naming the fix, on a subscription that cannot
	// keep that order, instead of running the group's messages at once.
	// Where the subscription can, this order is kept with or without
	// Ordered; Ordered makes a program that relies on it refuse a broker
	// (or an entity) that would silently drop it. A message waiting behind
	// its group's head holds a handler slot and no claim: it runs only
	// before its claim deadline (window.ConsumerPlan.ClaimDeadline), else
	// it is given back, so a stuck group holds its slots for at most that
	// long. A message given back costs one of its deliveries: give the
	// entity an ack wait at least twice what the messages of a group that
	// one receive returns (up to ten on SQS) take to run in turn.
	Ordered bool
	// GroupBacklog bounds how many messages of one group can be published
	// within PublisherSpan, for an Ordered consumer: a resent copy of a message waits behind
	// them and behind the first copy, each of which can hold the group for
	// its whole redelivery span, so the dedup TTL must cover that too
	// (package window, "Ordered groups"). It counts only when
	// PublisherSpan does not fit the broker window; there, zero means no
	// bound, which no TTL covers: NewConsumer refuses, and says how many
	// the TTL would cover. (An SQS FIFO queue holds a group back behind
	// its head whether or not the consumer asks for order: set Ordered
	// there to have the check count it.)
	GroupBacklog int
	// Dedup, when set, wraps the handler in consumer-side deduplication.
	// NewConsumer checks that its TTL covers the broker's redelivery span,
	// plus all of PublisherSpan when that does not fit the broker window.
	//
	// It also lets settles pipeline: a delivery gives its handler's place
	// to the next one as soon as the handler has returned, and its settle
	// (still confirmed by the broker, retried within SettleTimeout, counted
	// and logged as before) completes beside the next handlers, which is
	// what lets a broker round trip per ack, or the batches a driver makes
	// of concurrent settles, keep up with the handlers. That is safe only
	// with a dedup store: an ack lost after the next handler started is
	// redelivered and suppressed as a duplicate. Without one the redelivery
	// would run the handler's effect again, so there the handler's place
	// is held until the settle is confirmed: Concurrency then also bounds
	// the deliveries whose effect happened but whose ack the broker has not
	// confirmed, and a broker slow to take acks slows the handlers down.
	// Either way Run and Close return only once every settle has finished.
	// For the same reason, with a dedup store an ack is sent unconfirmed
	// where the driver can (driver.UnconfirmedAcker: JetStream's plain Ack
	// instead of its DoubleAck); a lost one shows as a suppressed duplicate,
	// not as a failed settle.
	Dedup Deduplicator
	// PublisherSpan declares the publishers' worst-case retry span
	// (Publisher.RetryPolicy().Span(); zero for publishers that never
	// resend). When it does not fit the broker window less the margin, a
	// resend may be stored as a new message up to PublisherSpan after the
	// first send, whose key may have been completed right after that send,
	// so the dedup TTL must cover the whole span on top of the redelivery
	// span, not only its part beyond the window (package window's doc has
	// the timeline).
	PublisherSpan time.Duration
	// Margin is the share of the TTL kept free by the startup check: 0
	// means window.DefaultMargin, negative means none.
	Margin float64
	// ShutdownTimeout bounds how long in-flight handlers may keep running
	// once Run's context is done or Close is called; then their contexts
	// are cancelled with ErrShutdownTimeout. Close's context can end the
	// drain sooner, never later. 0 means 30s.
	ShutdownTimeout time.Duration
	// SettleTimeout bounds each ack, nack or terminate call, including its
	// retries. 0 means 10s.
	SettleTimeout time.Duration
	// Clock times lease extension and backoff; nil means the real clock.
	Clock clock.Clock
	// Logger receives what cannot be returned: receive outages, failed
	// acks, failed lease extensions. Nil means slog.Default().
	Logger *slog.Logger
	// MeterProvider receives dedupq's consume metrics (OBSERVABILITY.md
	// lists them); nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives a span per delivery (the messaging
	// conventions' "process" span), child of the publisher's span when the
	// message carries its trace context, and the parent of the handler's
	// context; nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// HandlerSpan adds a span of the handler alone ("dedupq.handler"),
	// child of the delivery's, apart from the dedup store's calls. Off by
	// default: a second span per delivery costs about as much again as
	// the first.
	HandlerSpan bool
}

// Consumer receives deliveries and runs a Handler on each, settling each
// delivery by the handler's result.
type Consumer struct {
	sub        driver.Subscription
	opts       ConsumerOptions
	clock      clock.Clock
	log        *slog.Logger
	win        window.Window
	redelivery window.RedeliveryPolicy
	// claims is the plan the startup check accepted (no TTL without
	// Dedup), whose ClaimDeadline bounds the holds.
	claims window.ConsumerPlan
	// scrub takes what RedactURL hides of the URL it was opened by (if
	// any) out of the driver's errors it logs and returns.
	scrub scrubber
	// ordersGroups: the subscription keeps the order of a group key, so
	// the Consumer runs a group's deliveries one at a time.
	ordersGroups bool
	failures     failureLog // handler failures, logged by kind
	tel          *conTelemetry
	stats        conStats

	mu     sync.Mutex
	active *activeRun // nil when Run is not running
	closed bool
}

// activeRun is what Close needs to stop a running Run and wait for it.
type activeRun struct {
	stop           context.CancelFunc      // stops fetching: the drain starts
	stopping       <-chan struct{}         // closed once stop was called, or Run's context ended
	cancelHandlers context.CancelCauseFunc // ends the drain
	done           chan struct{}           // closed when every handler has settled (and, after Close, the driver is closed)
	closeErr       error                   // the driver's Close error; read after done
	abandoned      bool                    // Close stopped waiting; guarded by Consumer.mu
}

// plan is what the consumer's startup check (and Inspect) compares, for a
// dedup store remembering keys for ttl.
// ordered says whether the subscription keeps a group's order.
func (opts ConsumerOptions) plan(ttl time.Duration, w window.Window, r window.RedeliveryPolicy, ordered bool) window.ConsumerPlan {
	return window.ConsumerPlan{
		Redelivery: r, Window: w, DedupTTL: ttl,
		PublisherSpan: opts.PublisherSpan, Margin: opts.Margin,
		Ordered: ordered, GroupBacklog: opts.GroupBacklog,
	}
}

// NewConsumer wraps a driver subscription. It reads the window and the
// broker's real redelivery settings and, when opts.Dedup is set, fails with
// a *window.UnsafeRetryError if the dedup TTL does not cover them, and with
// the Deduplicator's own error if it is a Checker whose store is not ready;
// with opts.Ordered, with an error matching ErrOrderingUnsupported if the
// subscription cannot keep a group's order. Only then does it let the
// driver create the stream, durable or queue its
// configuration asks for (driver.Provisioner), so a refused open leaves
// the broker as it was. On success the Consumer owns sub; on failure the
// caller still does.
func NewConsumer(ctx context.Context, sub driver.Subscription, opts ConsumerOptions) (*Consumer, error) {
	var w window.Window
	var r window.RedeliveryPolicy
	read := func() (err error) {
		if w, err = sub.Window(ctx); err != nil {
			return fmt.Errorf("dedupq: reading the dedup window: %w", err)
		}
		if r, err = sub.Redelivery(ctx); err != nil {
			return fmt.Errorf("dedupq: reading the redelivery policy: %w", err)
		}
		return nil
	}
	storeChecked := false
	check := func() error {
		if opts.Ordered {
			if _, err := ordersGroups(ctx, sub); err != nil {
				return err
			}
		}
		if opts.Dedup == nil {
			return nil
		}
		if err := window.CheckConsumer(opts.plan(opts.Dedup.TTL(), w, r, opts.Ordered)); err != nil {
			return err
		}
		if storeChecked {
			return nil
		}
		// Once, before anything is created: a dead or unmigrated store
		// must refuse the open as the window check does.
		storeChecked = true
		if c, ok := opts.Dedup.(Checker); ok {
			if err := c.Check(ctx); err != nil {
				return fmt.Errorf("dedupq: consumer-side dedup is not ready: %w", err)
			}
		}
		return nil
	}
	if err := checkThenProvision(ctx, sub, read, check); err != nil {
		return nil, err
	}
	orders, _ := ordersGroups(ctx, sub)
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 30 * time.Second
	}
	if opts.SettleTimeout <= 0 {
		opts.SettleTimeout = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Consumer{sub: sub, opts: opts, clock: clock.Or(opts.Clock), log: log, win: w, redelivery: r}
	c.ordersGroups = orders
	c.failures = failureLog{log: log, clock: c.clock, kinds: map[string]*failureKind{}}
	c.claims = opts.plan(0, w, r, opts.Ordered)
	if opts.Dedup != nil {
		c.claims.DedupTTL = opts.Dedup.TTL()
	}
	c.tel = newConTelemetry(opts, w, r, opts.Ordered, destinationOf(sub))
	return c, nil
}

// Window is the publish-side window of the consumed entity.
func (c *Consumer) Window() window.Window { return c.win }

// Redelivery is the broker's redelivery policy, as read at construction.
func (c *Consumer) Redelivery() window.RedeliveryPolicy { return c.redelivery }

// Run receives and handles deliveries until ctx is done, Close is called,
// or receiving fails for good. A broker that goes away and comes back (a
// restart, a network cut) does not end Run: receive errors the driver calls
// retryable are retried for as long as they last, with capped backoff,
// logged when the outage starts, every minute while it lasts and when it
// ends. On ctx done or Close it stops fetching, lets in-flight handlers
// finish (the drain: see ShutdownTimeout and Close), settles them, and
// returns nil. Where the broker cannot delay a redelivery
// (driver.NackHolder: Pub/Sub, Service Bus), a nack's delay is honoured by
// holding the delivery, its lease kept; the end of Run ends the holds,
// nacking each at once, or, on Close, leaving it to the driver's Close.
// Only one Run may be active at a time.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	// Handlers outlive ctx by design: the drain lets them finish.
	hctx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	run := &activeRun{stop: stop, stopping: rctx.Done(), cancelHandlers: cancelHandlers, done: make(chan struct{})}
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return ErrClosed
	case c.active != nil:
		c.mu.Unlock()
		return errors.New("dedupq: Consumer.Run is already running")
	}
	c.active = run
	c.mu.Unlock()

	h = c.tel.traceHandler(h)
	if c.opts.Dedup != nil {
		h = c.opts.Dedup.Wrap(h)
	}
	var wg sync.WaitGroup
	drained := make(chan struct{})
	stopWatch := context.AfterFunc(rctx, func() {
		if clock.Sleep(c.clock, c.opts.ShutdownTimeout, drained) {
			cancelHandlers(ErrShutdownTimeout)
		}
	})
	defer stopWatch()

	p := &pipeline{slots: make(chan struct{}, c.opts.Concurrency), h: h}
	if c.ordersGroups {
		p.groups = newGroupDispatch()
	}
	workers := c.opts.Concurrency
	if c.opts.Dedup != nil {
		p.settles = make(chan struct{}, settlesPerSlot*c.opts.Concurrency)
		p.fastAck, _ = c.sub.(driver.UnconfirmedAcker)
		workers += cap(p.settles)
	}
	// A fixed pool of workers, not a goroutine per delivery: a worker's
	// stack, once grown by the handler and the driver, stays grown. Every
	// busy worker holds a handler slot or a settle token, so a delivery
	// (which holds a slot) always finds an idle worker.
	// One timer extends the leases of every delivery in flight.
	leases := clock.NewScheduler(c.clock)
	defer leases.Stop()
	p.leases, p.released = leases, rctx.Done()
	p.holder, _ = c.sub.(driver.NackHolder)
	work := make(chan job)
	wg.Add(workers)
	for range workers {
		go func() {
			defer wg.Done()
			// A context of the worker's own under hctx: a handler that
			// derives a cancellable context from it (the Guard does, per
			// delivery) registers it with its worker's, not with one
			// context that every worker's handlers would queue on.
			wctx, cancel := context.WithCancelCause(hctx)
			defer cancel(nil)
			w := &worker{lease: leaseKeeper{c: c, s: leases}, span: c.tel.newProcessStart(),
				ctx: wctx, detached: context.WithoutCancel(wctx)}
			w.lease.extend = w.lease.run
			for j := range work {
				for {
					var err error
					if c.tooLate(j) {
						err = errTooLate
						c.giveBack(p, j, err, 0)
					} else {
						err = c.handle(p, w, j)
					}
					if p.groups == nil {
						break
					}
					var more bool
					if j, more = p.groups.next(c, p, j, err); !more {
						break
					}
				}
			}
		}()
	}
	err := c.receiveLoop(rctx, p.slots, func(ds []*driver.Delivery) {
		// What the deliveries of one receive allocate, in one block.
		ins := make([]inflight, len(ds))
		received := c.clock.Now()
		if p.groups == nil {
			for i, d := range ds {
				work <- job{d, &ins[i], receivedAt(d, received)}
			}
			return
		}
		jobs := make([]job, len(ds))
		for i, d := range ds {
			jobs[i] = job{d, &ins[i], receivedAt(d, received)}
		}
		// The whole receive is admitted before any of it starts: a head
		// that finished before the ones behind it were queued would let
		// them run as a new group's.
		run, back := p.groups.admitAll(jobs, received)
		c.giveBackAll(p, back)
		for _, j := range run {
			work <- j
		}
	})
	// A receive that failed for good ends the Run as a stop does: the
	// drain starts and every hold ends now, not when its wait is over.
	stop()
	close(work)
	// A worker returns only once its last settle has, and a hold once its
	// nack has (the Run's end ended it): the driver is closed (finish)
	// only after the last settle returned.
	wg.Wait()
	p.holds.Wait()
	close(drained)
	c.finish(run)
	return err
}

// finish ends run once its handlers have settled: it closes the driver if
// Close was called meanwhile (Close left that to Run so that no settle
// races the driver's Close) and wakes Close.
func (c *Consumer) finish(run *activeRun) {
	c.mu.Lock()
	c.active = nil
	closing := c.closed
	c.mu.Unlock()
	var closeErr error
	if closing {
		closeErr = c.scrub.err(c.sub.Close())
	}
	c.mu.Lock()
	run.closeErr = closeErr
	close(run.done)
	abandoned := run.abandoned
	c.mu.Unlock()
	if abandoned && closeErr != nil {
		c.log.Warn("dedupq: closing the subscription after the last handler failed", "err", closeErr)
	}
}

// Receive retries. A broker that goes away and comes back (a restart, a
// failover, a network cut) is the normal case, so a receive error the
// driver calls retryable never ends Run: the loop waits and tries again,
// for as long as the outage lasts, with exponential backoff between
// receiveBackoffMin and receiveBackoffMax. Only an error the driver says
// can never heal (the subscription was deleted, the credentials were
// refused) ends Run.
const (
	receiveBackoffMin = 100 * time.Millisecond
	receiveBackoffMax = 5 * time.Second
	// outageReminder spaces the Warn lines of a long outage, so that a
	// broker down for an hour logs a line a minute, not one per attempt.
	outageReminder = time.Minute
)

// receiveBackoff is the wait after the n-th consecutive failed receive
// (n ≥ 1): receiveBackoffMin doubling up to receiveBackoffMax, drawn from
// its upper half so that consumers that lost the same broker do not come
// back in lockstep.
func receiveBackoff(n int) time.Duration {
	b := min(receiveBackoffMin<<min(n-1, 16), receiveBackoffMax)
	return b/2 + rand.N(b/2+1)
}

// outage tracks consecutive failed receives, to log the start of an outage
// once (Warn), remind of it rarely (Warn) and report its end (Info).
type outage struct {
	failures int
	since    time.Time
	reminded time.Time
}

// failed records a retryable receive error, logs as due, and returns how
// long to wait before the next receive.
func (o *outage) failed(c *Consumer, err error) time.Duration {
	now := c.clock.Now()
	err = c.scrub.err(err)
	o.failures++
	wait := receiveBackoff(o.failures)
	switch {
	case o.failures == 1:
		o.since, o.reminded = now, now
		c.log.Warn("dedupq: receive failed; retrying with backoff until the broker answers", "err", err, "wait", wait)
	case now.Sub(o.reminded) >= outageReminder:
		o.reminded = now
		c.log.Warn("dedupq: receive still failing; retrying", "err", err, "for", now.Sub(o.since), "attempts", o.failures, "wait", wait)
	default:
		c.log.Debug("dedupq: receive failed; retrying", "err", err, "attempts", o.failures, "wait", wait)
	}
	return wait
}

// recovered records a receive that worked, logging the end of an outage.
func (o *outage) recovered(c *Consumer) {
	if o.failures == 0 {
		return
	}
	c.log.Info("dedupq: receive recovered", "after", c.clock.Now().Sub(o.since), "failed_attempts", o.failures)
	o.failures = 0
}

// receiveLoop fetches as many deliveries as there are free handler slots
// and starts each; it returns nil when ctx is done, and an error only when
// receiving failed for good. The slots a receive did not fill stay its
// own for the next one: given back, they would be taken again at once,
// a cost per slot that a broker handing out one delivery per receive (an
// ordered group's next message, once its head is acked) pays per message.
func (c *Consumer) receiveLoop(ctx context.Context, slots chan struct{}, start func([]*driver.Delivery)) error {
	var out outage
	held := 0
	defer func() {
		for range held {
			<-slots
		}
	}()
	for {
		if held == 0 {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
			held = 1
		}
		n := held
		for yielded := false; n < cap(slots); {
			select {
			case slots <- struct{}{}:
				n++
				continue
			default:
			}
			// A busy consumer frees its slots one by one: let the
			// workers that are finishing give theirs back once, so
			// that one fetch serves several of them.
			if yielded || n >= cap(slots)/4 {
				break
			}
			yielded = true
			runtime.Gosched()
		}
		ds, err := c.sub.Receive(ctx, n)
		held = n - len(ds)
		if len(ds) > 0 {
			start(ds)
		}
		switch {
		case err == nil:
			out.recovered(c)
		case ctx.Err() != nil:
			return nil
		case c.sub.IsRetryable(err):
			if !clock.Sleep(c.clock, out.failed(c, err), ctx.Done()) {
				return nil
			}
		default:
			err = c.scrub.err(err)
			c.log.Error("dedupq: receive failed for good; the consumer stops", "err", err)
			return fmt.Errorf("dedupq: receive: %w", err)
		}
	}
}

// settlesPerSlot bounds the settles a Run with Dedup lets proceed off the
// handler slots: at most settlesPerSlot × Concurrency at once, beyond which
// a handler that returned keeps its slot until a settle finishes, so that
// the goroutines and deliveries held by a slow broker stay bounded.
const settlesPerSlot = 4

// pipeline is what every delivery of one Run shares.
type pipeline struct {
	slots   chan struct{} // a token per running handler (Concurrency)
	settles chan struct{} // a token per settle in flight off its slot; nil without Dedup
	// fastAck sends the acks of a Run with Dedup without waiting for the
	// broker's confirmation, where the driver can; nil otherwise.
	fastAck driver.UnconfirmedAcker
	h       Handler
	timers  settlectx.Timers // the settles' timers, reused
	// holder is the driver when its broker cannot delay a redelivery:
	// nacks with a delay are then held here (see hold); nil otherwise.
	holder driver.NackHolder
	leases *clock.Scheduler // extends the leases of running and held deliveries
	// released is closed when the Run stops (its context done, Close, or
	// a receive failed for good): every hold ends.
	released <-chan struct{}
	holds    sync.WaitGroup // the held nacks in progress
	// groups runs the deliveries of one group key one at a time; nil
	// where the subscription does not keep a group's order.
	groups *groupDispatch
}

// handle runs p.h on one delivery, keeping its lease alive, then settles it,
// and gives back its handler slot: as soon as the handler has returned when
// the Run has a dedup store (p.settles), only once the settle is confirmed
// otherwise (see ConsumerOptions.Dedup). A handler that fails with
// ErrUnavailable is run again on the delivery while retryUnavailable
// allows. It returns the handler's last result.
func (c *Consumer) handle(p *pipeline, w *worker, j job) error {
	d, in := j.d, j.in
	c.stats.received.Add(1)
	ctx, span := c.tel.startDelivery(w.ctx, w.span, d)
	defer span.End()
	lease := &w.lease
	lease.start(ctx, d, j.received)
	copyDelivery(&in.d, d)
	in.d.ClaimDeadline = c.claims.ClaimDeadline(j.received, d.Lease)
	err := safeCall(ctx, p.h, &in.d)
	if errors.Is(err, ErrUnavailable) && !IsPermanent(err) {
		c.failures.failed(ctx, d, err, "held and run again with backoff until its claim deadline")
		err = c.retryUnavailable(ctx, p, d, j.received, err)
	}
	lease.stop()
	if err != nil {
		failed(span, err)
	}
	if p.settles == nil {
		c.settleDelivery(ctx, p, w, &in.sctx, d, err)
		<-p.slots
		return err
	}
	if err == nil && p.fastAck != nil && p.fastAck.AckUnconfirmed(d) == nil {
		<-p.slots
		c.count(ctx, "ack", nil)
		return nil
	}
	p.settles <- struct{}{}
	<-p.slots
	c.settleDelivery(ctx, p, w, &in.sctx, d, err)
	<-p.settles
	return err
}

// job is a delivery for a worker, the zero inflight it is handled in, and
// when its receive returned: where its lease and its claim budget start.
type job struct {
	d        *driver.Delivery
	in       *inflight
	received time.Time
}

// tooLate reports whether j, which a driver held before handing it over
// (driver.Delivery.Received), is past its claim deadline already: started
// now, it could claim its key later than the startup check counts, so it is
// given back instead. A delivery the driver did not hold starts at once.
func (c *Consumer) tooLate(j job) bool {
	return !j.d.Received.IsZero() && !c.clock.Now().Before(c.claims.ClaimDeadline(j.received, j.d.Lease))
}

// receivedAt is when d's lease started: when the driver says the broker
// handed it out (driver.Delivery.Received), if that is before Receive
// returned it at returned.
func receivedAt(d *driver.Delivery, returned time.Time) time.Time {
	if !d.Received.IsZero() && d.Received.Before(returned) {
		return d.Received
	}
	return returned
}

// retryUnavailable runs the handler again on d, after a backoff
// (receiveBackoff's), while it fails with ErrUnavailable, holding the
// delivery (its lease kept alive) instead of nacking it, which would spend
// one of the message's deliveries per failed try. It returns the last
// try's error, for the delivery to be settled by.
//
// The hold is bounded by the startup check's model (package window): every
// try, and so every claim of the key, must start before the delivery's
// claim deadline (ConsumerPlan.ClaimDeadline: the broker's ack wait from
// its receipt, before the lease's first renewal, and within the dedup
// TTL), as if the broker had kept the delivery for its ack wait and no
// longer. A hold that ran on until the dependency came back could claim
// the key after its completion record had expired, and run the effect a
// second time; one that renewed the lease while holding no claim could
// push the message's next delivery past the redelivery span. Once no try fits before the deadline, or the
// Run stops, the error is returned and the delivery nacked as any failure:
// the broker's next delivery gets a deadline of its own, and MaxDeliveries
// ends the chain within the redelivery span the check covered.
func (c *Consumer) retryUnavailable(ctx context.Context, p *pipeline, d *driver.Delivery, received time.Time, err error) error {
	deadline := c.claims.ClaimDeadline(received, d.Lease)
	for n := 1; errors.Is(err, ErrUnavailable) && !IsPermanent(err); n++ {
		wait := receiveBackoff(n)
		if !c.clock.Now().Add(wait).Before(deadline) {
			break
		}
		c.log.Debug("dedupq: handler dependency unavailable; holding the delivery and trying again", "id", d.Message.ID, "err", err, "wait", wait)
		if !clock.Sleep(c.clock, wait, p.released) {
			return err
		}
		// A wake-up later than asked for must not claim late either.
		if !c.clock.Now().Before(deadline) {
			break
		}
		again := fromDriverDelivery(d)
		again.ClaimDeadline = deadline
		err = safeCall(ctx, p.h, again)
	}
	if errors.Is(err, ErrUnavailable) && !IsPermanent(err) {
		c.log.Debug("dedupq: handler dependency still unavailable at the delivery's claim deadline; nacking it", "id", d.Message.ID, "err", err)
	}
	return err
}

// worker is what one of Run's workers reuses from one delivery to the
// next.
type worker struct {
	lease leaseKeeper
	span  *processStart // nil with tracing off
	// ctx is the parent of the worker's handlers' contexts, a child of
	// Run's handlers' context, and detached the same without its
	// cancellation: the parent of every settle whose delivery has no span
	// of its own (telemetry off), detached once per worker, not per settle.
	ctx, detached context.Context
}

// inflight is what one delivery needs of its own: the handler's copy of it
// and the context of its settle. The inflights of one receive are
// allocated together, and stay in memory until the last of them is done
// with.
type inflight struct {
	d    Delivery
	sctx settlectx.Ctx
}

// settleDelivery acks, nacks or terminates d by its handler's result err,
// retrying within SettleTimeout (on sctx, a zero Ctx it sets up), and
// counts and logs the outcome.
func (c *Consumer) settleDelivery(ctx context.Context, p *pipeline, w *worker, sctx *settlectx.Ctx, d *driver.Delivery, err error) {
	var what string
	var delay time.Duration
	switch {
	case err == nil:
		what = "ack"
	case IsPermanent(err), c.lastGroupDelivery(p, d):
		what = "terminate"
	default:
		what, delay = "nack", c.nackDelay(p, d, err)
	}
	if what == "nack" && p.holder != nil && delay > 0 {
		c.failures.failed(ctx, d, err, "nack, held "+window.FormatDuration(delay)+" first")
		c.hold(ctx, p, d, err, delay, w.lease.renewed)
		return
	}
	switch what {
	case "terminate":
		c.failures.failed(ctx, d, err, "terminate (dead-letter where the backend can)")
	case "nack":
		c.failures.failed(ctx, d, err, "nack, redelivered after "+window.FormatDuration(delay))
	}
	detached := w.detached
	if ctx != w.ctx {
		detached = context.WithoutCancel(ctx)
	}
	sctx.InitDetached(detached, c.opts.SettleTimeout, &p.timers)
	defer sctx.Release()
	c.finishSettle(ctx, sctx, what, d, err, delay)
}

// finishSettle makes the settle call, retrying within sctx, and counts and
// logs its outcome.
func (c *Consumer) finishSettle(ctx context.Context, sctx context.Context, what string, d *driver.Delivery, err error, delay time.Duration) {
	serr := c.scrub.err(c.settle(sctx, what, d, err, delay))
	c.count(ctx, what, serr)
	if serr != nil {
		// The broker redelivers after the lease; consumer-side dedup makes
		// that harmless for an ack that was lost.
		c.log.Warn("dedupq: settling a delivery failed; the broker will redeliver it", "op", what,
			"id", d.Message.ID, "backend_id", d.BackendID, "err", serr)
	}
}

// hold keeps d, nacked with the handler's error cause, for the broker
// that cannot delay its redelivery (p.holder): its lease extended on the
// Run's scheduler, on the rhythm of the handler's extensions (the lease was
// last renewed at renewed, so the next renewal is due half a lease after
// that, not after the hold's start: a lock renewed late can lapse), until
// the delay has passed or the Run stops, then nacks it with no delay. It returns at once; the Run waits for its end
// (p.holds) before it closes the driver.
//
// When the Run stops because the Consumer is closing, d is left unsettled
// instead: the driver's Close, which comes next, gives it back, and it can
// do so at a better moment than a nack now, while its receive is still
// open (Pub/Sub's client nacks what it holds only once its stream is
// closed; a nack sent before could be handed straight back down the
// closing stream, and the message would wait out its ack deadline).
func (c *Consumer) hold(ctx context.Context, p *pipeline, d *driver.Delivery, cause error, delay time.Duration, renewed time.Time) {
	p.holds.Add(1)
	go func() {
		defer p.holds.Done()
		k := leaseKeeper{c: c, s: p.leases}
		k.extend = k.run
		k.start(ctx, d, renewed)
		ended := clock.Sleep(c.clock, delay, p.released)
		k.stop()
		if !ended && c.isClosed() {
			return
		}
		sctx := settlectx.New(context.WithoutCancel(ctx), c.opts.SettleTimeout)
		defer sctx.Release()
		c.finishSettle(ctx, sctx, "nack", d, cause, 0)
	}()
}

// isClosed reports whether Close was called.
func (c *Consumer) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// count records one settlement in Stats and on the meter.
func (c *Consumer) count(ctx context.Context, what string, serr error) {
	if serr != nil {
		c.stats.settleFailed.Add(1)
		c.tel.settled(ctx, "settle_failed")
		return
	}
	switch what {
	case "ack":
		c.stats.acked.Add(1)
	case "nack":
		c.stats.nacked.Add(1)
	case "terminate":
		c.stats.terminated.Add(1)
	}
	c.tel.settled(ctx, what)
}

// settleBackoffMax caps the wait between two tries of one settle call.
const settleBackoffMax = time.Second

// settle retries a settle operation while its error is retryable, until
// ctx (SettleTimeout) ends: an ack that fails while the broker restarts
// reaches it once it is back, if that is within SettleTimeout, instead of
// leaving the message to be redelivered.
// what is "ack", "terminate" (with cause) or "nack" (with delay).
func (c *Consumer) settle(ctx context.Context, what string, d *driver.Delivery, cause error, delay time.Duration) error {
	for i := 0; ; i++ {
		var err error
		switch what {
		case "ack":
			err = c.sub.Ack(ctx, d)
		case "terminate":
			err = c.sub.Terminate(ctx, d, cause)
		default:
			err = c.sub.Nack(ctx, d, delay)
		}
		if err == nil || !c.sub.IsRetryable(err) {
			return err
		}
		if !clock.Sleep(c.clock, min(50*time.Millisecond<<min(i, 16), settleBackoffMax), ctx.Done()) {
			return err
		}
	}
}

// leaseKeeper extends the lease of its worker's delivery at half its
// length, on the Run's Scheduler (no timer or goroutine per delivery), from
// start until stop. A worker reuses its own for each of its deliveries.
type leaseKeeper struct {
	c      *Consumer
	s      *clock.Scheduler
	job    clock.Job
	extend func() bool // k.run, bound once per worker
	ctx    context.Context
	d      *driver.Delivery // nil when d has no lease
	// renewed is when the lease last started: the delivery's receipt, or
	// the start of the last extension that succeeded. It stays readable
	// after stop, for a hold that takes the lease over.
	renewed time.Time
}

// start keeps d's lease, which was last renewed at renewed: the first
// extension is due half a lease after that.
func (k *leaseKeeper) start(ctx context.Context, d *driver.Delivery, renewed time.Time) {
	k.renewed = renewed
	if d.Lease <= 0 {
		return
	}
	k.ctx, k.d = ctx, d
	k.s.RepeatAfter(&k.job, renewed.Add(d.Lease/2).Sub(k.c.clock.Now()), d.Lease/2, k.extend)
}

// stop ends the extensions, waiting for one in progress.
func (k *leaseKeeper) stop() {
	if k.d == nil {
		return
	}
	k.job.Stop()
	k.ctx, k.d = nil, nil
}

func (k *leaseKeeper) run() bool {
	c, d := k.c, k.d
	// The broker restarts the lease when it takes the extension, which is
	// after this: counting from here never overestimates it.
	at := c.clock.Now()
	err := c.sub.Extend(k.ctx, d, d.Lease)
	if errors.Is(err, errors.ErrUnsupported) {
		return false
	}
	c.countExtension(k.ctx, err)
	if err != nil {
		c.log.Warn("dedupq: extending a delivery's lease failed", "id", d.Message.ID, "err", c.scrub.err(err))
		return true
	}
	k.renewed = at
	return true
}

// countExtension records one lease extension in Stats and on the meter.
func (c *Consumer) countExtension(ctx context.Context, err error) {
	outcome := "ok"
	c.stats.leaseExt.Add(1)
	if err != nil {
		outcome = "error"
		c.stats.leaseExtFailed.Add(1)
	}
	c.tel.extended(ctx, outcome)
}

// safeCall runs h, turning a panic into a *PanicError so one bad message
// cannot take the consumer down.
func safeCall(ctx context.Context, h Handler, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = recoverPanic(r)
		}
	}()
	return h(ctx, d)
}

// Close stops Run, if it is running, as cancelling its context would, and
// releases the driver. Run and Close called later fail with ErrClosed.
//
// ctx bounds the graceful drain: in-flight handlers may finish until ctx is
// done or ShutdownTimeout has passed since the stop, whichever comes first;
// then the handlers still running are cancelled with ErrShutdownTimeout, as
// Run's own shutdown does, and their deliveries are nacked as they return.
// Close waits for them to return and settle, and for the settles of
// handlers that had already returned, at most SettleTimeout more, so that
// their acks and nacks reach the broker before the driver closes; a handler
// that ignores its context past that makes Close return an error wrapping
// ctx's, and the driver is closed once the last handler has settled. Acks
// made before Close are never undone. A done ctx skips the graceful part:
// handlers are cancelled at once.
//
// Close must not be called from a handler: it waits for the handlers.
func (c *Consumer) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed = true
	c.tel.close()
	run := c.active
	c.mu.Unlock()
	if run == nil {
		return c.scrub.err(c.sub.Close())
	}
	run.stop()
	select {
	case <-run.done:
		return run.closeErr
	case <-ctx.Done():
	}
	run.cancelHandlers(ErrShutdownTimeout)
	clock.Sleep(c.clock, c.opts.SettleTimeout, run.done)
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-run.done:
		return run.closeErr
	default:
		run.abandoned = true
		return fmt.Errorf("dedupq: Consumer.Close: handlers still running %s after their cancellation (%w); the subscription closes when the last has settled", c.opts.SettleTimeout, ctx.Err())
	}
}
