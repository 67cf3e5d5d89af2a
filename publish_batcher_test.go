// Tests of concurrent Publish calls sent together, against the scripted
// driver of publisher_test.go: no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
)

// occupied returns a Publisher on a topic whose sends block, with every
// batch slot taken by a Publish of its own ("busy-1"…) waiting in
// SendBatch: the calls made next queue. release lets every send through
// and waits for the blockers' results.
func occupied(t *testing.T, topic *scriptTopic) (p *Publisher, release func()) {
	t.Helper()
	topic.block, topic.entered = make(chan struct{}), make(chan struct{}, 100)
	// Attempts that outlast any test (and fit the 5m window): the blockers
	// wait for release alone.
	retry := fastRetry(3)
	retry.AttemptTimeout = time.Minute
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: retry})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range publishBatchesInFlight {
		wg.Go(func() {
			if _, err := p.Publish(context.Background(), &Message{ID: fmt.Sprintf("busy-%d", i+1), Body: []byte("b")}); err != nil {
				t.Errorf("busy-%d: %v", i+1, err)
			}
		})
		<-topic.entered // one call at a time, so each takes a batch slot alone
	}
	return p, func() { close(topic.block); wg.Wait() }
}

// queued is how many calls wait for a batch.
func (b *publishBatcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// publishAll publishes one message per ID, each from a goroutine of its
// own, and returns each call's result and error by ID once all returned.
func publishAll(ctx context.Context, p *Publisher, ids ...string) (wait func() (map[string]Result, map[string]error)) {
	var mu sync.Mutex
	res, errs := map[string]Result{}, map[string]error{}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			r, err := p.Publish(ctx, &Message{ID: id, Body: []byte("b")})
			mu.Lock()
			defer mu.Unlock()
			res[id], errs[id] = r, err
		})
	}
	return func() (map[string]Result, map[string]error) { wg.Wait(); return res, errs }
}

// Calls that come while every batch slot is busy are sent together, up to
// the driver's MaxBatch a batch, and each gets its own result.
func TestConcurrentPublishesShareBatches(t *testing.T) {
	topic := newScriptTopic()
	p, release := occupied(t, topic)
	var ids []string
	for i := range 15 {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	wait := publishAll(context.Background(), p, ids...)
	testutil.WaitFor(t, func() bool { return p.batcher.queued() == len(ids) })
	release()
	res, errs := wait()
	for _, id := range ids {
		if errs[id] != nil || res[id].ID != id || res[id].BackendID != id+"-stored" || res[id].Attempts != 1 {
			t.Errorf("%s: %+v, %v; want stored at the first attempt", id, res[id], errs[id])
		}
	}
	topic.mu.Lock()
	defer topic.mu.Unlock()
	var sizes []int
	for _, c := range topic.calls {
		sizes = append(sizes, len(c))
	}
	slices.Sort(sizes)
	// Four blockers alone, then the 15 queued calls in batches of at most
	// 10: two of them, however the slots that freed up shared the queue.
	if len(sizes) != publishBatchesInFlight+2 || sizes[len(sizes)-1] > topic.batch {
		t.Errorf("batch sizes %v, want the 15 queued calls in 2 batches of at most %d", sizes, topic.batch)
	}
}

// A message of a shared batch that fails is retried alone, under its own
// caller; the others are answered by the first attempt. A message the
// broker refuses fails only its own call.
func TestPublishBatchedFailuresStayTheirCallers(t *testing.T) {
	topic := newScriptTopic()
	topic.failFirst = map[string]error{"retried": errUnavailable, "refused": errRefused}
	p, release := occupied(t, topic)
	wait := publishAll(context.Background(), p, "ok", "retried", "refused")
	testutil.WaitFor(t, func() bool { return p.batcher.queued() == 3 })
	release()
	res, errs := wait()
	if errs["ok"] != nil || res["ok"].Attempts != 1 {
		t.Errorf("ok: %+v, %v", res["ok"], errs["ok"])
	}
	if errs["retried"] != nil || res["retried"].Attempts != 2 {
		t.Errorf("retried: %+v, %v; want stored at the second attempt", res["retried"], errs["retried"])
	}
	var pe *PublishError
	if !errors.As(errs["refused"], &pe) || pe.ID != "refused" || pe.MaybeSent || !errors.Is(pe, errRefused) {
		t.Errorf("refused: %v; want its own PublishError, not sent", errs["refused"])
	}
	topic.mu.Lock()
	defer topic.mu.Unlock()
	if last := topic.calls[len(topic.calls)-1]; !slices.Equal(last, []string{"retried"}) {
		t.Errorf("last call sent %v, want the retry of the failed message alone", last)
	}
}

// A call whose ctx ends while it waits for a batch is not sent, ever; one
// whose ctx ends during its batch's attempt returns at once, maybe sent,
// and the attempt goes on for the batch's other calls.
func TestPublishBatchedCallerGivesUp(t *testing.T) {
	topic := newScriptTopic()
	p, release := occupied(t, topic)

	queuedCtx, cancelQueued := context.WithCancel(context.Background())
	waitQueued := publishAll(queuedCtx, p, "gone")
	testutil.WaitFor(t, func() bool { return p.batcher.queued() == 1 })
	cancelQueued()
	_, errs := waitQueued()
	var pe *PublishError
	if !errors.As(errs["gone"], &pe) || pe.Attempts != 0 || pe.MaybeSent || !errors.Is(pe, context.Canceled) {
		t.Fatalf("a call given up in the queue: %v; want not sent (Attempts 0), the ctx's error", errs["gone"])
	}

	// Two calls in one batch, which blocks in SendBatch.
	inFlightCtx, cancelInFlight := context.WithCancel(context.Background())
	waitLeaver := publishAll(inFlightCtx, p, "leaver")
	waitStayer := publishAll(context.Background(), p, "stayer")
	testutil.WaitFor(t, func() bool { return p.batcher.queued() == 2 })
	topic.block <- struct{}{} // one blocker returns; its slot takes the two
	<-topic.entered
	cancelInFlight()
	_, errs = waitLeaver()
	if !errors.As(errs["leaver"], &pe) || pe.Attempts != 1 || !pe.MaybeSent {
		t.Fatalf("a call given up during its attempt: %v; want Attempts 1, MaybeSent", errs["leaver"])
	}
	release()
	res, errs := waitStayer()
	if errs["stayer"] != nil || res["stayer"].Attempts != 1 {
		t.Fatalf("the other call of the batch: %+v, %v; want stored by the attempt that went on", res["stayer"], errs["stayer"])
	}
	topic.mu.Lock()
	defer topic.mu.Unlock()
	if topic.stored["gone"] != 0 || topic.stored["leaver"] != 1 {
		t.Errorf("stored %v: want nothing of the call given up in the queue, and the one given up in flight stored by its attempt", topic.stored)
	}
}

// countingTopic counts the SendBatch calls in progress; one whose ctx
// ends takes a while to tear down, as a client's does.
type countingTopic struct {
	*scriptTopic
	inFlight atomic.Int32
}

func (c *countingTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	res, err := c.scriptTopic.SendBatch(ctx, msgs)
	if ctx.Err() != nil {
		time.Sleep(50 * time.Millisecond) // the teardown, not a wait for a condition
	}
	return res, err
}

// The last caller of a batch to give up cancels its attempt and returns
// once the attempt has: nothing of the call is left running after it, as
// with PublishBatch.
func TestPublishLastCallerEndsItsAttempt(t *testing.T) {
	topic := &countingTopic{scriptTopic: newScriptTopic()}
	topic.block, topic.entered = make(chan struct{}), make(chan struct{}, 1)
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wait := publishAll(ctx, p, "alone")
	<-topic.entered
	cancel()
	_, errs := wait()
	var pe *PublishError
	if !errors.As(errs["alone"], &pe) || !pe.MaybeSent || !errors.Is(pe, context.Canceled) {
		t.Fatalf("Publish: %v; want maybe sent, the ctx's error", errs["alone"])
	}
	if n := topic.inFlight.Load(); n != 0 {
		t.Fatalf("%d SendBatch calls still running after Publish returned", n)
	}
}
