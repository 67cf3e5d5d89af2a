package pubsub

import (
	"context"
	"fmt"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// Topic is a driver.Topic that publishes to one Pub/Sub topic. It is safe
// for concurrent use.
type Topic struct {
	client      *gpubsub.Client
	ownsClient  bool
	name        string
	opts        Options
	retries     bool // the client's Publish calls retry on their own
	limits      driver.Limits
	bundleLimit int

	mu     sync.Mutex
	closed bool
	// flushing counts client Publishers still sending an attempt's
	// messages after SendBatch returned; Close waits for them.
	flushing sync.WaitGroup
}

var _ driver.Topic = (*Topic)(nil)

// OpenTopic opens topic (an ID in the client's project, or
// projects/P/topics/ID) for publishing, after checking that it exists. The
// caller keeps ownership of client. Use a client from NewClient: with one
// whose Publish calls retry, HiddenRetrySpan is Options.PublishTimeout (see
// the package doc).
func OpenTopic(ctx context.Context, client *gpubsub.Client, topic string, opts *Options) (*Topic, error) {
	return openTopic(ctx, client, false, topic, opts)
}

func openTopic(ctx context.Context, client *gpubsub.Client, owns bool, topic string, opts *Options) (*Topic, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	name, err := fullName(client.Project(), "topics", topic)
	if err != nil {
		return nil, err
	}
	t := &Topic{
		client: client, ownsClient: owns, name: name, opts: o, retries: publishRetries(client),
		limits: limits(name), bundleLimit: bundleLimit(name),
	}
	if err := t.check(ctx); err != nil {
		return nil, err
	}
	return t, nil
}

// Name is the topic's full resource name.
func (t *Topic) Name() string { return t.name }

func (t *Topic) check(ctx context.Context) error {
	if _, err := t.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: t.name}); err != nil {
		return fmt.Errorf("dedupq/pubsub: reading topic %s: %w", t.name, err)
	}
	return nil
}

// MaxBatch is the most messages one Publish request takes.
func (t *Topic) MaxBatch() int { return maxRequestMessages }

// Limits are Pub/Sub's, less the attribute that carries the dedup ID.
func (t *Topic) Limits() driver.Limits { return t.limits }

// Window checks that the topic still exists and reports Pub/Sub's window:
// none (window.KindNone, documented).
func (t *Topic) Window(ctx context.Context) (window.Window, error) {
	if err := t.check(ctx); err != nil {
		return window.Window{}, err
	}
	return noWindow(t.name), nil
}

// HiddenRetrySpan is zero when the client's own Publish retries are off,
// as NewClient sets them: every RPC of an attempt ends by the attempt's
// deadline. With a client that retries, it is Options.PublishTimeout,
// which bounds those retries.
func (t *Topic) HiddenRetrySpan() time.Duration {
	if t.retries {
		return t.opts.PublishTimeout
	}
	return 0
}

// IsRetryable reports whether a send error may succeed when tried again. A
// gRPC status that says the service refused the request (InvalidArgument,
// NotFound, PermissionDenied, …) is not; a transient status, a lost answer,
// a paused ordering key or an unknown error is, because the message may
// have been stored or was never sent.
func (t *Topic) IsRetryable(err error) bool { return isRetryable(err) }

// Close waits for the RPCs of abandoned attempts to end (each is bounded by
// its attempt's deadline or PublishTimeout), then closes the client if the
// Topic made it.
func (t *Topic) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	t.closed = true
	t.mu.Unlock()
	t.flushing.Wait()
	if t.ownsClient {
		return t.client.Close()
	}
	return nil
}

// enter registers one round of publishing, unless the Topic is closed.
func (t *Topic) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.flushing.Add(1)
	return true
}

// pending is one message of a SendBatch still to send.
type pending struct {
	index int
	msg   *gpubsub.Message
	size  int
}

// SendBatch makes one attempt: it publishes msgs and waits for every
// PublishResult, reporting each message's outcome. Messages without a
// group key are published together; each ordering key's messages are
// published in request-sized chunks, one chunk after the other, so that a
// key's later messages are sent only once its earlier ones are stored.
func (t *Topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	results := make([]driver.SendResult, len(msgs))
	// queues holds, per ordering key ("" for none), the messages still to
	// send, in order.
	queues := map[string][]pending{}
	var keys []string
	for i, m := range msgs {
		p := toMessage(m)
		if _, ok := queues[m.GroupKey]; !ok {
			keys = append(keys, m.GroupKey)
		}
		queues[m.GroupKey] = append(queues[m.GroupKey], pending{index: i, msg: p, size: messageSize(m)})
	}
	for len(queues) > 0 {
		if err := ctx.Err(); err != nil {
			for _, q := range queues {
				for _, p := range q {
					results[p.index].Err = err
				}
			}
			break
		}
		var round []pending
		for _, k := range keys {
			q, ok := queues[k]
			if !ok {
				continue
			}
			n := len(q)
			if k != "" {
				n = t.chunk(q)
			}
			round = append(round, q[:n]...)
			if n == len(q) {
				delete(queues, k)
			} else {
				queues[k] = q[n:]
			}
		}
		failed := t.publishRound(ctx, round, results)
		for k := range failed {
			for _, p := range queues[k] {
				results[p.index].Err = fmt.Errorf("dedupq/pubsub: ordering key %q: %w", k, ErrEarlierFailed)
			}
			delete(queues, k)
		}
	}
	return results, nil
}

// chunk is how many of q's first messages fit one Publish request, so that
// the client sends them as one bundle (at least one).
func (t *Topic) chunk(q []pending) int {
	n, size := 0, 0
	for n < len(q) && n < maxRequestMessages && (n == 0 || size+q[n].size <= t.bundleLimit) {
		size += q[n].size
		n++
	}
	return n
}

// publishRound publishes round on a fresh client Publisher whose RPCs end by
// ctx's deadline, waits for each result, and records it. It returns the
// ordering keys with a failed message.
func (t *Topic) publishRound(ctx context.Context, round []pending, results []driver.SendResult) map[string]bool {
	failed := map[string]bool{}
	fail := func(m pending, err error) {
		results[m.index].Err = err
		if key := m.msg.OrderingKey; key != "" {
			failed[key] = true
		}
	}
	timeout := t.opts.PublishTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	var err error
	switch {
	case timeout <= 0:
		err = context.DeadlineExceeded
	case !t.enter():
		err = ErrClosed
	}
	if err != nil {
		for _, m := range round {
			fail(m, err)
		}
		return failed
	}
	p := t.client.Publisher(t.name)
	p.EnableMessageOrdering = true
	p.PublishSettings = gpubsub.PublishSettings{
		DelayThreshold: time.Millisecond,
		CountThreshold: maxRequestMessages,
		// Only the request limit splits bundles, so that each ordered
		// chunk is one request.
		ByteThreshold: maxRequestBytes,
		// One worker per message at most: no bundle waits for a worker,
		// so none starts its Timeout after the attempt's deadline.
		NumGoroutines:       len(round) + 1,
		Timeout:             timeout,
		FlowControlSettings: gpubsub.FlowControlSettings{LimitExceededBehavior: gpubsub.FlowControlIgnore},
	}
	res := make([]*gpubsub.PublishResult, len(round))
	for i, m := range round {
		res[i] = p.Publish(ctx, m.msg)
	}
	// Stop flushes at once and returns when every RPC has ended; the RPCs
	// are bounded by timeout, so this goroutine is too.
	go func() {
		defer t.flushing.Done()
		p.Stop()
	}()
	for i, m := range round {
		id, err := res[i].Get(ctx)
		if err != nil {
			fail(m, err)
			continue
		}
		results[m.index].BackendID = id
	}
	return failed
}
