package dedupq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// PublisherOptions configure a Publisher. The zero value is usable.
type PublisherOptions struct {
	// Retry bounds resends of a message. Nil means
	// window.DefaultRetryPolicy(), which also fills the fields a policy
	// leaves unset (window.RetryPolicy.WithDefaults); use
	// &window.RetryPolicy{MaxAttempts: 1} for no retries.
	Retry *window.RetryPolicy
	// ConsumerDedupTTL declares that the consumers of this publisher's
	// messages run consumer-side dedup (package dedup) remembering keys at
	// least this long. A retry span that does not fit the broker window
	// must then fit this TTL, which lets a publisher on a backend with a
	// short window, or none, retry for longer; a span that fits the window
	// is accepted whatever the TTL. The consumers' TTL must in fact cover
	// this span plus their redelivery span, which the publisher cannot see:
	// give them the span as ConsumerOptions.PublisherSpan and NewConsumer
	// checks it.
	ConsumerDedupTTL time.Duration
	// Margin is the share of the window kept free by the startup check: 0
	// means window.DefaultMargin (20%), negative means none.
	Margin float64
	// KeyFunc derives the dedup ID of a message published without one. Nil
	// means an empty ID is refused. ContentKey is one choice.
	KeyFunc func(*Message) (string, error)
	// Clock times backoff waits; nil means the real clock.
	Clock clock.Clock
	// MeterProvider receives dedupq's publish metrics (OBSERVABILITY.md
	// lists them); nil means otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives a send span per Publish and PublishBatch
	// call and, for PublishBatch, a create span per message, whose context
	// travels to consumers in the message attributes (OBSERVABILITY.md);
	// nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// NoCreateSpans makes PublishBatch trace the call alone: no create
	// span per message, and every message carries the send span's
	// context, so that a batch's messages share one parent.
	NoCreateSpans bool
}

// Publisher sends messages with dedup IDs and retries failed sends within
// the window that deduplicates them. It is safe for concurrent use.
type Publisher struct {
	topic  driver.Topic
	opts   PublisherOptions
	retry  window.RetryPolicy
	clock  clock.Clock
	limits driver.Limits
	mu     sync.Mutex
	win    window.Window
	closed bool
	// inflight counts PublishBatch calls in progress; idle, made by Close
	// while some are, is closed by the last of them to return.
	inflight int
	idle     chan struct{}
	tel      *pubTelemetry
	// attemptOpts is tel's base attributes as options of the attempts
	// counter, made once: built per chunk, they and their variadic slice
	// cost two allocations each time.
	attemptOpts []metric.AddOption
	stats       pubStats
	batcher     publishBatcher // the first attempts of concurrent Publish calls
	// scrub takes what RedactURL hides of the URL it was opened by (if
	// any) out of the driver's errors it returns.
	scrub scrubber
}

// NewPublisher wraps a driver topic. It reads the backend's window and fails
// with a *window.UnsafeRetryError when the retry policy's worst-case span
// does not fit it (or the declared ConsumerDedupTTL). Only then does it
// let the driver create what its configuration asks for
// (driver.Provisioner), so a refused open leaves the broker as it was. On
// success the Publisher owns topic and closes it on Close; on failure the
// caller still owns it.
func NewPublisher(ctx context.Context, topic driver.Topic, opts PublisherOptions) (*Publisher, error) {
	retry := opts.retryPolicy()
	var w window.Window
	read := func() (err error) {
		if w, err = topic.Window(ctx); err != nil {
			return fmt.Errorf("dedupq: reading the dedup window: %w", err)
		}
		return nil
	}
	check := func() error { return window.CheckPublisher(opts.plan(retry, topic, w)) }
	if err := checkThenProvision(ctx, topic, read, check); err != nil {
		return nil, err
	}
	p := &Publisher{
		topic: topic, opts: opts, retry: retry, clock: clock.Or(opts.Clock),
		limits: topic.Limits(), win: w,
	}
	span := retry.Span() + max(topic.HiddenRetrySpan(), 0)
	p.tel = newPubTelemetry(opts, w.Backend, destinationOf(topic), func() (time.Duration, time.Duration) {
		return p.Window().Duration, span
	})
	p.attemptOpts = []metric.AddOption{metric.WithAttributeSet(p.tel.base)}
	p.batcher.p = p
	return p, nil
}

// Window is the window that protects this publisher's retries, as read at
// construction or by the last Recheck.
func (p *Publisher) Window() window.Window {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.win
}

// RetryPolicy is the policy the publisher retries with.
func (p *Publisher) RetryPolicy() window.RetryPolicy { return p.retry }

// Recheck reads the window from the broker again and repeats the startup
// check, for windows that can change after startup (KindConfigured). A
// failing check is returned; the publisher keeps working, so the caller
// decides whether to stop.
func (p *Publisher) Recheck(ctx context.Context) error {
	w, err := p.topic.Window(ctx)
	if err != nil {
		return fmt.Errorf("dedupq: reading the dedup window: %w", err)
	}
	p.mu.Lock()
	p.win, p.limits = w, p.topic.Limits()
	p.mu.Unlock()
	return window.CheckPublisher(p.opts.plan(p.retry, p.topic, w))
}

// retryPolicy is the policy a publisher with opts runs: Retry with its
// unset fields filled, or the default.
func (opts PublisherOptions) retryPolicy() window.RetryPolicy {
	if opts.Retry == nil {
		return window.DefaultRetryPolicy()
	}
	return opts.Retry.WithDefaults()
}

// plan is what the publisher's startup check (and Recheck, and Inspect)
// compares.
func (opts PublisherOptions) plan(retry window.RetryPolicy, topic driver.Topic, w window.Window) window.PublisherPlan {
	return window.PublisherPlan{
		Retry: retry, HiddenSpan: topic.HiddenRetrySpan(), Window: w,
		DedupTTL: opts.ConsumerDedupTTL, Margin: opts.Margin,
	}
}

// Publish sends one message and returns its result. The error is nil, a
// *ValidationError (nothing sent) or a *PublishError (see MaybeSent).
//
// Concurrent Publish calls are sent together: while a few batches are on
// their way to the broker, the calls that come meanwhile queue, and the
// next batch takes them all (up to the backend's largest batch), so that
// Publish from many goroutines costs about what PublishBatch does. A call
// that finds the broker idle is sent at once. Each call keeps its own
// Result, error and context: only the first attempt is shared; retries are
// the call's own, as in PublishBatch. A ctx that ends while the message
// waits for its first attempt returns a *PublishError with Attempts 0 (not
// sent); one that ends during the attempt returns at once with MaybeSent.
func (p *Publisher) Publish(ctx context.Context, m *Message) (Result, error) {
	if err := p.enter(); err != nil {
		return Result{}, err
	}
	defer p.exit()
	var results []Result
	var id string
	if m != nil {
		id = m.ID
	}
	ctx, span := p.tel.startPublish(ctx, id)
	defer func() { p.tel.endPublish(ctx, span, nil, results); p.stats.count(results) }()
	out, results, err := p.prepare(ctx, []*Message{m}, nil)
	if err != nil {
		if len(results) == 1 {
			return results[0], results[0].Err
		}
		return Result{}, err
	}
	sent, err, attempted := p.batcher.first(ctx, out[0])
	if !attempted {
		p.notSent(ctx, 0, out, results)
	} else {
		p.countFirstAttempt(ctx, results)
		p.settle(ctx, 0, out, results, sent, err)
	}
	return results[0], results[0].Err
}

// PublishBatch sends msgs, in backend-sized chunks, and returns one Result
// per message in order. Every message is validated first: if any is
// invalid, nothing is sent and the *BatchError lists every message, the
// invalid ones as *ValidationError and the others as *PublishError
// wrapping ErrNotSent. Otherwise failed sends are retried with the same
// dedup IDs, and the error, if any, is a *BatchError listing exactly the
// messages that were not stored; all others were. When the call returns,
// nothing is left sending.
//
// First attempts reach the broker in batch order, also where a driver
// takes several chunks at once (driver.BatchStarter). A retried message
// may be stored after messages that followed it in the batch.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []*Message) ([]Result, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.exit()
	var results []Result
	ctx, span, spans := p.tel.startBatch(ctx, msgs)
	defer func() { p.tel.endPublish(ctx, span, spans, results); p.stats.count(results) }()
	out, results, err := p.prepare(ctx, msgs, spans)
	if err != nil {
		return results, err
	}
	chunk := max(p.topic.MaxBatch(), 1)
	if bs, ok := p.topic.(driver.BatchStarter); ok && len(out) > chunk {
		p.sendStarted(ctx, bs, out, results, chunk)
	} else {
		for start := 0; start < len(out); start += chunk {
			end := min(start+chunk, len(out))
			p.sendChunk(ctx, start, out[start:end], results[start:end])
		}
	}
	var failed []error
	for _, r := range results {
		if r.Err != nil {
			failed = append(failed, r.Err)
		}
	}
	if failed != nil {
		return results, &BatchError{Total: len(msgs), Failed: failed}
	}
	return results, nil
}

// Validate checks msgs as PublishBatch does before it sends anything (the
// backend's limits, a derived ID from KeyFunc), without sending: nil, or a
// *BatchError like PublishBatch's. A transactional outbox calls it before
// it stores messages that will be published later.
//
// It checks messages without trace context: with tracing on, the trace
// attributes PublishBatch adds later count toward the backend's limits too.
func (p *Publisher) Validate(msgs ...*Message) error {
	_, _, err := p.prepare(context.Background(), msgs, nil)
	return err
}

// prepare converts and validates msgs, with their creation context
// injected: the create span each gets from spans, or ctx's span (see
// pubTelemetry.inject). If any is invalid, the error is a *BatchError
// listing every message and nothing may be sent.
func (p *Publisher) prepare(ctx context.Context, msgs []*Message, spans *batchSpans) ([]*driver.Message, []Result, error) {
	p.mu.Lock()
	backend, limits := p.win.Backend, p.limits
	p.mu.Unlock()
	out := make([]*driver.Message, len(msgs))
	// One allocation for every message's driver copy, not one each.
	copies := make([]driver.Message, len(msgs))
	results := make([]Result, len(msgs))
	var invalid []error
	for i, m := range msgs {
		if m == nil {
			m = &Message{}
		}
		dm := &copies[i]
		toDriverMessage(m, dm)
		if dm.ID == "" && p.opts.KeyFunc != nil {
			id, err := p.opts.KeyFunc(m)
			if err != nil {
				invalid = append(invalid, &ValidationError{Index: i, Field: "ID", Reason: "KeyFunc: " + err.Error(), Backend: backend, Err: err})
				continue
			}
			dm.ID = id
		}
		out[i] = dm
		results[i].ID = dm.ID
		if err := checkReserved(backend, i, dm); err != nil {
			invalid = append(invalid, err)
			continue
		}
		p.tel.inject(ctx, spans, i, dm)
		if err := validate(backend, limits, i, dm); err != nil {
			invalid = append(invalid, err)
		}
	}
	if len(invalid) > 0 {
		// Nothing is sent, so every message goes into the error: a caller
		// that resends Failed must resend the valid ones too.
		for i := range results {
			results[i].Err = &PublishError{Index: i, ID: results[i].ID, Err: ErrNotSent}
		}
		for _, err := range invalid {
			results[err.(*ValidationError).Index].Err = err
		}
		failed := make([]error, len(results))
		for i, r := range results {
			failed[i] = r.Err
		}
		return nil, results, &BatchError{Total: len(msgs), Failed: failed}
	}
	return out, results, nil
}

// chunksStarted bounds the chunks whose first attempt is on its way at
// once when the driver starts batches (driver.BatchStarter). Four of
// JetStream's 1024-message chunks keep about as many publishes waiting for
// a PubAck as the client's own cap for PublishAsync (4000), which is what
// keeps the broker busy without holding a whole large batch in flight.
const chunksStarted = 4

// startedChunk is a chunk whose first attempt a driver.BatchStarter took.
type startedChunk struct {
	start, end int
	wait       func() ([]driver.SendResult, error)
	err        error // StartBatch's own (wait is then nil), then wait's
	sent       []driver.SendResult
	answered   bool // wait returned (or there was none)
	cancel     context.CancelFunc
}

// answer waits for c's answers, once, and ends its attempt's context.
func (c *startedChunk) answer() ([]driver.SendResult, error) {
	if !c.answered {
		if c.wait != nil {
			c.sent, c.err = c.wait()
		}
		c.cancel()
		c.answered = true
	}
	return c.sent, c.err
}

// allStored reports answers that need no resend.
func allStored(sent []driver.SendResult, err error, n int) bool {
	if err != nil || len(sent) < n {
		return false
	}
	for _, r := range sent {
		if r.Err != nil {
			return false
		}
	}
	return true
}

// sendStarted sends out in chunks whose first attempts overlap: up to
// chunksStarted are started before the oldest one's answers are awaited,
// and each is then settled, retries included, in batch order. Every
// started chunk is awaited before it returns; one not started because ctx
// ended is reported not sent.
func (p *Publisher) sendStarted(ctx context.Context, bs driver.BatchStarter, out []*driver.Message, results []Result, chunk int) {
	var ring [chunksStarted]startedChunk
	head, n, next := 0, 0, 0
	for {
		for n < len(ring) && next < len(out) && ctx.Err() == nil {
			end := min(next+chunk, len(out))
			c := &ring[(head+n)%len(ring)]
			c.start, c.end = next, end
			msgs := out[next:end:end]
			p.countFirstAttempt(ctx, results[next:end])
			attemptCtx := ctx
			c.cancel = func() {}
			if p.retry.AttemptTimeout > 0 {
				// From this chunk's own start: it waits behind no other.
				attemptCtx, c.cancel = context.WithTimeout(ctx, p.retry.AttemptTimeout)
			}
			c.wait, c.err = bs.StartBatch(attemptCtx, msgs)
			n, next = n+1, end
		}
		if n == 0 {
			break
		}
		c := &ring[head]
		head, n = (head+1)%len(ring), n-1
		sent, err := c.answer()
		if !allStored(sent, err, c.end-c.start) {
			// Its retries, backoffs included, would run while the
			// later chunks' attempt timeouts tick: take their answers
			// first, so that a slow retry does not turn answers that
			// were on their way into maybe-sent resends.
			for i := range n {
				ring[(head+i)%len(ring)].answer()
			}
		}
		p.settle(ctx, c.start, out[c.start:c.end], results[c.start:c.end], sent, err)
		*c = startedChunk{}
	}
	for ; next < len(out); next += chunk {
		end := min(next+chunk, len(out))
		p.notSent(ctx, next, out[next:end], results[next:end])
	}
}

// sendChunk sends one chunk, resending only the failed entries.
func (p *Publisher) sendChunk(ctx context.Context, offset int, msgs []*driver.Message, results []Result) {
	if ctx.Err() != nil {
		p.notSent(ctx, offset, msgs, results)
		return
	}
	p.countFirstAttempt(ctx, results)
	// Capped, so that a driver that appends to its batch cannot write
	// over the next chunk's messages.
	sent, err := p.attempt(ctx, msgs[:len(msgs):len(msgs)])
	p.settle(ctx, offset, msgs, results, sent, err)
}

// notSent reports a chunk that ctx ended before its turn (after an earlier
// chunk): it was never handed to the driver, so it is not "maybe sent".
func (p *Publisher) notSent(ctx context.Context, offset int, msgs []*driver.Message, results []Result) {
	for i := range msgs {
		results[i].Err = &PublishError{Index: offset + i, ID: msgs[i].ID, Err: context.Cause(ctx)}
	}
}

// countFirstAttempt records the first attempt of a chunk about to be
// handed to the driver.
func (p *Publisher) countFirstAttempt(ctx context.Context, results []Result) {
	for i := range results {
		results[i].Attempts = 1
	}
	p.tel.attempts.Add(ctx, int64(len(results)), p.attemptOpts...)
	p.stats.attempts.Add(uint64(len(results)))
}

// settle takes the answers to a chunk's first attempt (sent, err) and
// resends only the failed entries until each is stored, refused, or out
// of attempts or time. The bookkeeping of failures is made only once one
// fails, so that a chunk stored at once costs no allocation here.
func (p *Publisher) settle(ctx context.Context, offset int, msgs []*driver.Message, results []Result, sent []driver.SendResult, err error) {
	var (
		pending   []int // indexes into msgs still to send, after the first attempt
		maybeSent []bool
		lastErr   []error
	)
	// index maps a position in this attempt's batch to one in msgs.
	index := func(j int) int {
		if pending == nil {
			return j
		}
		return pending[j]
	}
	attempts := max(p.retry.MaxAttempts, 1)
	batch := msgs
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			batch = make([]*driver.Message, len(pending))
			for j, i := range pending {
				batch[j] = msgs[i]
				results[i].Attempts = attempt
			}
			p.tel.attempts.Add(ctx, int64(len(batch)), p.attemptOpts...)
			p.stats.attempts.Add(uint64(len(batch)))
			trace.SpanFromContext(ctx).AddEvent("retry", trace.WithAttributes(attribute.Int("dedupq.attempt", attempt), attribute.Int("dedupq.messages", len(batch))))
			sent, err = p.attempt(ctx, batch)
		}
		var retry []int
		for j := range batch {
			i := index(j)
			e := err
			unknown := false // the driver gave no answer for this message
			if e == nil {
				if j >= len(sent) {
					e = fmt.Errorf("dedupq: driver returned %d results for %d messages", len(sent), len(batch))
					unknown = true
				} else if sent[j].Err == nil {
					results[i].BackendID, results[i].Duplicate = sent[j].BackendID, sent[j].Duplicate
					continue
				} else {
					e = sent[j].Err
				}
			}
			if lastErr == nil {
				maybeSent, lastErr = make([]bool, len(msgs)), make([]error, len(msgs))
			}
			lastErr[i] = e
			retryable := p.topic.IsRetryable(e) || ctxError(e)
			maybeSent[i] = maybeSent[i] || retryable || unknown
			if retryable && attempt < attempts && ctx.Err() == nil {
				retry = append(retry, i)
				continue
			}
			results[i].Err = &PublishError{Index: offset + i, ID: msgs[i].ID, Attempts: attempt, MaybeSent: maybeSent[i], Err: p.scrub.err(e)}
		}
		if len(retry) == 0 {
			return
		}
		pending = retry
		delay := p.retry.Delay(attempt, rand.Float64())
		p.tel.retryDelay.Record(ctx, delay.Seconds(), metric.WithAttributeSet(p.tel.base))
		if !p.sleep(ctx, delay) {
			for _, i := range pending {
				results[i].Err = &PublishError{Index: offset + i, ID: msgs[i].ID, Attempts: attempt, MaybeSent: maybeSent[i],
					Err: p.scrub.err(errors.Join(context.Cause(ctx), lastErr[i]))}
			}
			return
		}
	}
}

// attempt makes one SendBatch call bounded by the policy's AttemptTimeout.
func (p *Publisher) attempt(ctx context.Context, batch []*driver.Message) ([]driver.SendResult, error) {
	if p.retry.AttemptTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.retry.AttemptTimeout)
		defer cancel()
	}
	return p.topic.SendBatch(ctx, batch)
}

// sleep waits d unless ctx is done first.
func (p *Publisher) sleep(ctx context.Context, d time.Duration) bool {
	return ctx.Err() == nil && clock.Sleep(p.clock, d, ctx.Done())
}

// ContentKey is a KeyFunc that derives the dedup ID from the body alone:
// the hex SHA-256 of Body (64 characters, valid on every backend), the same
// rule as SQS content-based deduplication. Two different messages with the
// same body are then one message.
func ContentKey(m *Message) (string, error) {
	sum := sha256.Sum256(m.Body)
	return hex.EncodeToString(sum[:]), nil
}

func ctxError(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func (p *Publisher) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.inflight++
	return nil
}

// enterBatch counts a batch of concurrent Publish calls as a publish in
// progress, for Close to wait for: a caller that started it may have
// returned, its ctx done, while the attempt goes on for the others. It is
// called by a caller in progress, so Close cannot have found none.
func (p *Publisher) enterBatch() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight++
}

func (p *Publisher) exit() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	if p.inflight == 0 && p.idle != nil {
		close(p.idle)
	}
}

// Close waits for publishes in progress to return, then closes the driver.
// Publishes started after Close fail with ErrClosed. ctx bounds the wait;
// with nothing in progress a done ctx does not matter.
func (p *Publisher) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.tel.close()
	if p.inflight == 0 {
		p.mu.Unlock()
		return p.topic.Close()
	}
	idle := make(chan struct{})
	p.idle = idle
	p.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("dedupq: publishes still in progress: %w", ctx.Err()), p.topic.Close())
	}
	return p.topic.Close()
}
