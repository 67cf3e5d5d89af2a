package sqs_test

// Adapter tests against fauxqs, the SQS emulator started by TestMain (see
// fauxqs_test.go for how it is started and where it differs from AWS).
// Where fauxqs matters here: it returns at most one message per group per
// ReceiveMessage, so tests that want several deliveries use distinct
// groups and receive in a loop (receiveN); every queue is created with
// FifoQueue=true, as AWS requires, although fauxqs would infer it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// ctxFor is a context for one test step, bounded so that a hung emulator
// fails the test instead of the run.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func openTopic(t *testing.T, api sqs.API, url string, o *sqs.Options) *sqs.Topic {
	t.Helper()
	tp, err := sqs.OpenTopicAPI(ctxFor(t, 10*time.Second), api, url, o)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	return tp
}

func openSub(t *testing.T, api sqs.API, url string, o *sqs.Options) *sqs.Subscription {
	t.Helper()
	s, err := sqs.OpenSubscriptionAPI(ctxFor(t, 10*time.Second), api, url, o)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// receiveN receives until it has n deliveries or within has passed, with
// short long-polls so that it never waits past its deadline.
func receiveN(t *testing.T, s driver.Subscription, n int, within time.Duration) []*driver.Delivery {
	t.Helper()
	ctx := ctxFor(t, within)
	var got []*driver.Delivery
	for len(got) < n {
		ds, err := s.Receive(ctx, n-len(got))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("Receive: %v", err)
		}
		got = append(got, ds...)
	}
	if len(got) != n {
		t.Fatalf("received %d deliveries within %s, want %d", len(got), within, n)
	}
	return got
}

// ackAll acks every delivery.
func ackAll(t *testing.T, s driver.Subscription, ds []*driver.Delivery) {
	t.Helper()
	for _, d := range ds {
		if err := s.Ack(ctxFor(t, 10*time.Second), d); err != nil {
			t.Fatalf("Ack(%s): %v", d.Message.ID, err)
		}
	}
}

// assertEmpty checks that the queue holds no message, visible or in
// flight.
func assertEmpty(t *testing.T, c *awssqs.Client, url string) {
	t.Helper()
	if v, f := queueCounts(t, c, url); v != "0" || f != "0" {
		t.Fatalf("queue holds %s visible and %s in-flight messages, want none", v, f)
	}
}

func TestOpenRefusesStandardQueue(t *testing.T) {
	c := needFauxqs(t)
	url, _ := createQueue(t, c, false, nil)
	for _, tc := range []struct {
		name string
		open func() error
	}{
		{"topic", func() error { _, err := sqs.OpenTopic(t.Context(), c, url, nil); return err }},
		{"subscription", func() error { _, err := sqs.OpenSubscription(t.Context(), c, url, nil); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.open()
			if !errors.Is(err, sqs.ErrNotFIFO) {
				t.Fatalf("err = %v, want ErrNotFIFO", err)
			}
			if !strings.Contains(err.Error(), "standard queue does not deduplicate") {
				t.Errorf("error does not say why: %v", err)
			}
		})
	}
}

func TestQueueAttributesShapeWindowLimitsRedelivery(t *testing.T) {
	c := needFauxqs(t)
	dlq, _ := newQueue(t, c, nil)
	dlqArn := queueArn(t, c, dlq)
	for _, tc := range []struct {
		name      string
		attrs     map[string]string
		opts      sqs.Options
		scope     string
		maxBytes  int
		redeliver window.RedeliveryPolicy
	}{
		{
			name: "defaults", scope: "queue", maxBytes: 1 << 20,
			redeliver: window.RedeliveryPolicy{AckWait: 30 * time.Second},
		},
		{
			name: "high throughput with redrive",
			attrs: map[string]string{
				"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId",
				"MaximumMessageSize": "2048", "VisibilityTimeout": "45",
				"RedrivePolicy": `{"deadLetterTargetArn":"` + dlqArn + `","maxReceiveCount":4}`,
			},
			scope: "message group", maxBytes: 2048,
			redeliver: window.RedeliveryPolicy{MaxDeliveries: 4, AckWait: 45 * time.Second},
		},
		{
			name:  "visibility and backoff options",
			attrs: map[string]string{"VisibilityTimeout": "45"},
			opts:  sqs.Options{VisibilityTimeout: 7 * time.Second, NackBackoff: []time.Duration{time.Second, 5 * time.Second}},
			scope: "queue", maxBytes: 1 << 20,
			redeliver: window.RedeliveryPolicy{AckWait: 7 * time.Second, Backoff: []time.Duration{time.Second, 5 * time.Second}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, _ := newQueue(t, c, tc.attrs)
			tp := openTopic(t, c, url, &tc.opts)
			w, err := tp.Window(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			want := window.Window{Backend: "sqs", Duration: 5 * time.Minute, Kind: window.KindFixed, Source: window.SourceDiscovered, Scope: tc.scope,
				Settings: sqs.QueueInfo{}.Window().Settings}
			if w != want {
				t.Errorf("Window = %+v, want %+v", w, want)
			}
			if got := tp.Limits().MaxMessageBytes; got != tc.maxBytes {
				t.Errorf("Limits.MaxMessageBytes = %d, want %d", got, tc.maxBytes)
			}
			s := openSub(t, c, url, &tc.opts)
			if w2, err := s.Window(t.Context()); err != nil || w2 != want {
				t.Errorf("Subscription.Window = %+v, %v; want %+v", w2, err, want)
			}
			r, err := s.Redelivery(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if r.MaxDeliveries != tc.redeliver.MaxDeliveries || r.AckWait != tc.redeliver.AckWait || !slices.Equal(r.Backoff, tc.redeliver.Backoff) {
				t.Errorf("Redelivery = %v, want %v", r, tc.redeliver)
			}
		})
	}
}

func queueArn(t *testing.T, c *awssqs.Client, url string) string {
	t.Helper()
	out, err := c.GetQueueAttributes(t.Context(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Attributes["QueueArn"]
}

// TestRoundTrip publishes through the portable Publisher and consumes with
// the portable Consumer: what arrives must be exactly what was published,
// once, including what SQS cannot carry as it is.
func TestRoundTrip(t *testing.T) {
	c := needFauxqs(t)
	long := strings.Repeat("x", 200)
	msgs := []*dedupq.Message{
		{ID: "plain", Body: []byte("hello"), Attributes: map[string]string{"k": "v", "n.x": "ü"}, GroupKey: "g1"},
		{ID: "binary", Body: []byte{0, 1, 2, 0xff, 0xfe}, GroupKey: "g2"},
		{ID: "empty-body", Body: nil, Attributes: map[string]string{"empty": "", "bin": "\x00\xff"}, GroupKey: "g3"},
		{ID: long, Body: []byte("long id"), GroupKey: "g4"},
		{ID: "sha256:looks-hashed", Body: []byte("prefixed id"), GroupKey: "g5"},
		{ID: "with space", Body: []byte("id SQS refuses")}, // default group
	}
	opts := &sqs.Options{HashLongIDs: true, DefaultGroup: "default"}
	url, _ := newQueue(t, c, nil)
	pub, err := dedupq.NewPublisher(t.Context(), openTopic(t, c, url, opts), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	first, err := pub.PublishBatch(ctxFor(t, 10*time.Second), msgs)
	if err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	// Publishing the same IDs again must not deliver anything twice, and
	// SQS's answer (the kept message's MessageId) reads as a duplicate.
	second, err := pub.PublishBatch(ctxFor(t, 10*time.Second), msgs)
	if err != nil {
		t.Fatalf("second PublishBatch: %v", err)
	}
	for i := range msgs {
		if first[i].Duplicate || !second[i].Duplicate || first[i].BackendID != second[i].BackendID {
			t.Errorf("message %d: first %+v, second %+v; want the second a duplicate of the first", i, first[i], second[i])
		}
	}

	sub, err := sqs.OpenSubscription(t.Context(), c, url, &sqs.Options{DefaultGroup: "default"})
	if err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(t.Context())
	var mu sync.Mutex
	got := map[string][]dedupq.Delivery{}
	all := make(chan struct{})
	ctx, stop := context.WithTimeout(t.Context(), 20*time.Second)
	defer stop()
	runErr := make(chan error, 1)
	go func() {
		runErr <- con.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got[d.Message.ID] = append(got[d.Message.ID], *d)
			if len(got) == len(msgs) {
				close(all)
			}
			return nil
		})
	}()
	select {
	case <-all:
	case <-ctx.Done():
	}
	stop()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, m := range msgs {
		ds := got[m.ID]
		if len(ds) != 1 {
			t.Errorf("message %.20q delivered %d times, want once", m.ID, len(ds))
			continue
		}
		d := ds[0]
		if !bytes.Equal(d.Message.Body, m.Body) || d.Message.GroupKey != m.GroupKey || !maps.Equal(d.Message.Attributes, m.Attributes) {
			t.Errorf("delivered %+v, published %+v", d.Message, *m)
		}
		if d.Attempt != 1 || d.BackendID == "" || d.Lease != 30*time.Second {
			t.Errorf("message %.20q: Attempt %d, BackendID %q, Lease %s; want 1, set, 30s", m.ID, d.Attempt, d.BackendID, d.Lease)
		}
	}
	assertEmpty(t, c, url)
}

// TestHashedIDsOnTheWire checks the transform SQS sees: IDs that fit go
// as they are, others as sha256:hex, identical for every send.
func TestHashedIDsOnTheWire(t *testing.T) {
	c := needFauxqs(t)
	long := strings.Repeat("é", 100)
	for _, tc := range []struct {
		id, wire string
	}{
		{"order-1", "order-1"},
		{long, sqs.HashID(long)},
		{"sha256:abc", sqs.HashID("sha256:abc")},
	} {
		t.Run(tc.id[:min(len(tc.id), 10)], func(t *testing.T) {
			url, _ := newQueue(t, c, nil)
			tp := openTopic(t, c, url, &sqs.Options{HashLongIDs: true})
			res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: tc.id, Body: []byte("b"), GroupKey: "g"}})
			if err != nil || res[0].Err != nil {
				t.Fatalf("SendBatch: %v %v", err, res)
			}
			out, err := c.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{
				QueueUrl: aws.String(url), WaitTimeSeconds: 1,
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageDeduplicationId},
			})
			if err != nil || len(out.Messages) != 1 {
				t.Fatalf("ReceiveMessage: %v, %d messages", err, len(out.Messages))
			}
			if got := out.Messages[0].Attributes["MessageDeduplicationId"]; got != tc.wire {
				t.Errorf("MessageDeduplicationId = %q, want %q", got, tc.wire)
			}
		})
	}
}

func TestRefusedBeforeSending(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, map[string]string{"MaximumMessageSize": "1024"})
	for _, tc := range []struct {
		name  string
		opts  sqs.Options
		msg   dedupq.Message
		field string
	}{
		{"no group", sqs.Options{}, dedupq.Message{ID: "a", Body: []byte("x")}, "GroupKey"},
		{"id too long", sqs.Options{}, dedupq.Message{ID: strings.Repeat("a", 129), Body: []byte("x"), GroupKey: "g"}, "ID"},
		{"id character", sqs.Options{}, dedupq.Message{ID: "a b", Body: []byte("x"), GroupKey: "g"}, "ID"},
		{"group character", sqs.Options{HashLongIDs: true}, dedupq.Message{ID: "a", Body: []byte("x"), GroupKey: "g ü"}, "GroupKey"},
		{"reserved attribute", sqs.Options{DefaultGroup: "g"}, dedupq.Message{ID: "a", Body: []byte("x"), Attributes: map[string]string{"dedupq-id": "x"}}, "Attributes"},
		{"aws attribute", sqs.Options{DefaultGroup: "g"}, dedupq.Message{ID: "a", Body: []byte("x"), Attributes: map[string]string{"AWS.trace": "x"}}, "Attributes"},
		{"too many attributes", sqs.Options{DefaultGroup: "g", HashLongIDs: true}, dedupq.Message{ID: "a", Body: []byte("x"), Attributes: nAttrs(9)}, "Attributes"},
		{"body over MaximumMessageSize", sqs.Options{DefaultGroup: "g"}, dedupq.Message{ID: "a", Body: bytes.Repeat([]byte("x"), 1025)}, "Body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := dedupq.NewPublisher(t.Context(), openTopic(t, c, url, &tc.opts), dedupq.PublisherOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(context.Background())
			_, err = pub.Publish(t.Context(), &tc.msg)
			var ve *dedupq.ValidationError
			if !errors.As(err, &ve) || ve.Field != tc.field {
				t.Fatalf("err = %v, want a ValidationError on %s", err, tc.field)
			}
		})
	}
	assertEmpty(t, c, url)
}

func nAttrs(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("a%d", i)] = "v"
	}
	return m
}

// TestEncodedSizeRefusedBySendBatch: the portable check counts body plus
// attribute keys and values; SQS also counts data types and the adapter's
// markers, and a base64 body grows by a third. The adapter refuses what
// SQS would, without sending it, and not retryably.
func TestEncodedSizeRefusedBySendBatch(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, map[string]string{"MaximumMessageSize": "1024"})
	tp := openTopic(t, c, url, &sqs.Options{DefaultGroup: "g"})
	res, err := tp.SendBatch(t.Context(), []*driver.Message{
		{ID: "fits", Body: bytes.Repeat([]byte("x"), 1024)},
		{ID: "binary", Body: bytes.Repeat([]byte{0}, 1000)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err != nil || res[0].BackendID == "" {
		t.Errorf("fits: %+v", res[0])
	}
	if !errors.Is(res[1].Err, sqs.ErrTooLarge) || tp.IsRetryable(res[1].Err) {
		t.Errorf("binary: err %v (retryable %v), want ErrTooLarge, not retryable", res[1].Err, tp.IsRetryable(res[1].Err))
	}
}

// TestEncodedSizeRefusedBeforeSending: through the Publisher, the same
// oversize message is a ValidationError and nothing in its batch is sent.
func TestEncodedSizeRefusedBeforeSending(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, map[string]string{"MaximumMessageSize": "1024"})
	pub, err := dedupq.NewPublisher(t.Context(), openTopic(t, c, url, &sqs.Options{DefaultGroup: "g"}), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := pub.PublishBatch(t.Context(), []*dedupq.Message{
		{ID: "fits", Body: []byte("x")},
		{ID: "binary", Body: bytes.Repeat([]byte{0}, 1000)},
	})
	var ve *dedupq.ValidationError
	if !errors.As(err, &ve) || ve.Index != 1 || ve.Field != "Body" || !errors.Is(err, sqs.ErrTooLarge) {
		t.Fatalf("err = %v, want a ValidationError on message 1's Body wrapping ErrTooLarge", err)
	}
	if !errors.Is(res[0].Err, dedupq.ErrNotSent) {
		t.Errorf("the valid message: %v, want ErrNotSent", res[0].Err)
	}
	out, err := c.GetQueueAttributes(t.Context(), &awssqs.GetQueueAttributesInput{QueueUrl: &url,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	if n := out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)]; n != "0" {
		t.Errorf("queue holds %s messages, want 0", n)
	}
}

func TestNackRedeliversWithAttempt(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, nil)
	tp := openTopic(t, c, url, nil)
	if res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: "m", Body: []byte("b"), GroupKey: "g"}}); err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %v", err, res)
	}
	s := openSub(t, c, url, nil)
	for attempt := 1; attempt <= 3; attempt++ {
		d := receiveN(t, s, 1, 10*time.Second)[0]
		if d.Attempt != attempt || d.Message.ID != "m" {
			t.Fatalf("delivery %d: Attempt %d, ID %q", attempt, d.Attempt, d.Message.ID)
		}
		if err := s.Nack(t.Context(), d, 0); err != nil {
			t.Fatalf("Nack: %v", err)
		}
	}
	ackAll(t, s, receiveN(t, s, 1, 10*time.Second))
	assertEmpty(t, c, url)
}

func TestExtendAndSettleAfterAck(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, nil)
	tp := openTopic(t, c, url, nil)
	if res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: "m", Body: []byte("b"), GroupKey: "g"}}); err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %v", err, res)
	}
	s := openSub(t, c, url, &sqs.Options{VisibilityTimeout: 2 * time.Second})
	d := receiveN(t, s, 1, 10*time.Second)[0]
	if d.Lease != 2*time.Second {
		t.Errorf("Lease = %s, want 2s", d.Lease)
	}
	if err := s.Extend(t.Context(), d, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	ackAll(t, s, []*driver.Delivery{d})
	// The receipt handle is gone: SQS refuses, and that is not retryable.
	err := s.Extend(t.Context(), d, time.Minute)
	if err == nil || s.IsRetryable(err) {
		t.Errorf("Extend after Ack: err %v, retryable %v; want a final error", err, s.IsRetryable(err))
	}
}

func TestTerminate(t *testing.T) {
	c := needFauxqs(t)
	for _, tc := range []struct {
		name    string
		redrive string // RedrivePolicy target: "dlq", "missing" or none
		opts    sqs.Options
		// moved: the message ends in the DLQ at once; failed: Terminate
		// fails and the message stays in flight; else it is deleted.
		moved, failed bool
	}{
		{name: "no redrive policy deletes"},
		{name: "redrive policy moves to the DLQ", redrive: "dlq", moved: true},
		{name: "TerminateDeletes deletes", redrive: "dlq", opts: sqs.Options{TerminateDeletes: true}},
		{name: "unreachable DLQ fails", redrive: "missing", failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dlq, _ := newQueue(t, c, nil)
			attrs := map[string]string{}
			switch tc.redrive {
			case "dlq":
				attrs["RedrivePolicy"] = `{"deadLetterTargetArn":"` + queueArn(t, c, dlq) + `","maxReceiveCount":5}`
			case "missing":
				attrs["RedrivePolicy"] = `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:no-such-queue.fifo","maxReceiveCount":5}`
			}
			url, _ := newQueue(t, c, attrs)
			tp := openTopic(t, c, url, &sqs.Options{HashLongIDs: true})
			long := strings.Repeat("L", 200)
			msg := &driver.Message{ID: long, Body: []byte{0, 1}, Attributes: map[string]string{"k": "v"}, GroupKey: "g"}
			if res, err := tp.SendBatch(t.Context(), []*driver.Message{msg}); err != nil || res[0].Err != nil {
				t.Fatalf("SendBatch: %v %v", err, res)
			}
			s := openSub(t, c, url, &tc.opts)
			d := receiveN(t, s, 1, 10*time.Second)[0]
			err := s.Terminate(t.Context(), d, errors.New("poison message"))
			if tc.failed {
				if err == nil {
					t.Fatal("Terminate succeeded with an unreachable dead-letter queue")
				}
				if v, f := queueCounts(t, c, url); v != "0" || f != "1" {
					t.Errorf("queue holds %s visible, %s in flight; want the message still in flight", v, f)
				}
				return
			}
			if err != nil {
				t.Fatalf("Terminate: %v", err)
			}
			assertEmpty(t, c, url)
			if !tc.moved {
				assertEmpty(t, c, dlq)
				return
			}
			// On the wire: the same dedup ID, and the reason beside it
			// for whoever inspects the queue.
			out, err := c.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{
				QueueUrl: aws.String(dlq), WaitTimeSeconds: 5, MessageAttributeNames: []string{"All"},
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			})
			if err != nil || len(out.Messages) != 1 {
				t.Fatalf("ReceiveMessage from the DLQ: %v, %d messages", err, len(out.Messages))
			}
			raw := out.Messages[0]
			if id := raw.Attributes["MessageDeduplicationId"]; id != sqs.HashID(long) {
				t.Errorf("dead letter MessageDeduplicationId %q, want %q", id, sqs.HashID(long))
			}
			if r := raw.MessageAttributes[sqs.ReasonAttr]; aws.ToString(r.StringValue) != "poison message" {
				t.Errorf("reason attribute %+v", r)
			}
			if _, err := c.ChangeMessageVisibility(t.Context(), &awssqs.ChangeMessageVisibilityInput{
				QueueUrl: aws.String(dlq), ReceiptHandle: raw.ReceiptHandle, VisibilityTimeout: 0,
			}); err != nil {
				t.Fatal(err)
			}
			// Through the adapter: the message as published.
			got := receiveN(t, openSub(t, c, dlq, nil), 1, 10*time.Second)[0].Message
			if got.ID != long || !bytes.Equal(got.Body, msg.Body) || !maps.Equal(got.Attributes, msg.Attributes) || got.GroupKey != "g" {
				t.Errorf("dead letter %+v, want %+v", got, *msg)
			}
		})
	}
}

// countingAPI counts the requests the adapter makes.
type countingAPI struct {
	sqs.API
	mu      sync.Mutex
	deletes [][]string // receipt handles of each DeleteMessageBatch
	sends   atomic.Int64
}

func (c *countingAPI) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, o ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	var hs []string
	for _, e := range in.Entries {
		hs = append(hs, aws.ToString(e.ReceiptHandle))
	}
	c.mu.Lock()
	c.deletes = append(c.deletes, hs)
	c.mu.Unlock()
	return c.API.DeleteMessageBatch(ctx, in, o...)
}

func (c *countingAPI) SendMessageBatch(ctx context.Context, in *awssqs.SendMessageBatchInput, o ...func(*awssqs.Options)) (*awssqs.SendMessageBatchOutput, error) {
	c.sends.Add(1)
	return c.API.SendMessageBatch(ctx, in, o...)
}

// TestAcksShareDeleteBatches: concurrent acks go out together, at most 10
// to a request, each getting its own entry's result.
func TestAcksShareDeleteBatches(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, nil)
	const n = 12
	var msgs []*driver.Message
	for i := range n {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprint("m", i), Body: []byte("b"), GroupKey: fmt.Sprint("g", i)})
	}
	tp := openTopic(t, c, url, nil)
	for _, chunk := range [][]*driver.Message{msgs[:10], msgs[10:]} {
		if res, err := tp.SendBatch(t.Context(), chunk); err != nil || slices.ContainsFunc(res, func(r driver.SendResult) bool { return r.Err != nil }) {
			t.Fatalf("SendBatch: %v %v", err, res)
		}
	}
	api := &countingAPI{API: c}
	// A long linger makes the grouping deterministic: the 10th ack sends a
	// full batch at once, the last two go when the linger ends.
	s := openSub(t, api, url, &sqs.Options{DeleteLinger: time.Second})
	ds := receiveN(t, s, n, 15*time.Second)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, d := range ds {
		wg.Go(func() { errs[i] = s.Ack(ctxFor(t, 10*time.Second), d) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	var sizes []int
	for _, hs := range api.deletes {
		sizes = append(sizes, len(hs))
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int{2, 10}) {
		t.Errorf("DeleteMessageBatch sizes %v, want [2 10]", sizes)
	}
	assertEmpty(t, c, url)
}

func TestReceiveHonoursContext(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, nil)
	s := openSub(t, c, url, nil)
	for _, d := range []time.Duration{300 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(d.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), d)
			defer cancel()
			start := time.Now()
			ds, err := s.Receive(ctx, 10)
			if !errors.Is(err, context.DeadlineExceeded) || len(ds) != 0 {
				t.Fatalf("Receive = %d deliveries, %v; want the context's error", len(ds), err)
			}
			if took := time.Since(start); took > d+2*time.Second {
				t.Errorf("Receive returned %s after its deadline", took-d)
			}
		})
	}
}
