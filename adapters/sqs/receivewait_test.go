package sqs

// The long-poll wait each ReceiveMessage sends (issue 29, item 6), against
// a driver-level fake of the sqsAPI interface that enforces SQS's
// documented rules, and the real SDK against an httptest server that only
// records what the SDK puts on the wire. No emulator, no AWS.
//
// The rules the fake enforces:
//   - ReceiveMessage WaitTimeSeconds, "the duration (in seconds) for which
//     the call waits for a message to arrive in the queue before
//     returning"; a request that leaves it out gets the queue's
//     ReceiveMessageWaitTimeSeconds ("A request-level value overrides the
//     queue default": AWS SDK for Python guide, "Configure long polling for
//     Amazon SQS"; SQS API reference, SetQueueAttributes,
//     ReceiveMessageWaitTimeSeconds, 0 to 20). The SDK leaves a zero
//     WaitTimeSeconds out (ReceiveMessageInput.SerializeMembers in
//     aws-sdk-go-v2/service/sqs v1.52.10 writes it only when non-zero;
//     TestSDKLeavesZeroWaitTimeOut checks it).
//   - Long polls are at least 1 second ("set a shorter ReceiveMessage wait
//     time (1 second minimum)": SQS Developer Guide, "Setting-up long
//     polling in Amazon SQS"), and the caller must wait longer than
//     WaitTimeSeconds for the answer ("ensure that the HTTP response
//     timeout for ReceiveMessage requests is longer than the
//     WaitTimeSeconds parameter": SQS API reference, ReceiveMessage).
//   - A message a receive returns is hidden for the visibility timeout and
//     its ApproximateReceiveCount raised, whether or not the caller read
//     the answer; "a message that isn't deleted ... before the visibility
//     timeout expires counts as a failed receive" and may go to the
//     dead-letter queue (SQS API reference, ReceiveMessage,
//     VisibilityTimeout).

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// longPollQueue is a FIFO queue holding one message, with a queue-level
// ReceiveMessageWaitTimeSeconds of 20 (a common setting), reached over a
// network whose round trip is rtt.
type longPollQueue struct {
	sqsAPI
	rtt time.Duration

	mu       sync.Mutex
	waits    []int32 // WaitTimeSeconds of each receive, 0 when left out
	received int     // ApproximateReceiveCount of the message
	unseen   int     // receives of it whose answer nobody read
}

func (q *longPollQueue) GetQueueAttributes(context.Context, *awssqs.GetQueueAttributesInput, ...func(*awssqs.Options)) (*awssqs.GetQueueAttributesOutput, error) {
	return &awssqs.GetQueueAttributesOutput{Attributes: map[string]string{
		"FifoQueue": "true", "VisibilityTimeout": "30", "MaximumMessageSize": "262144",
		"ReceiveMessageWaitTimeSeconds": "20",
		"RedrivePolicy":                 `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:q-dlq.fifo","maxReceiveCount":3}`,
	}}, nil
}

// ReceiveMessage serves the message at once when its answer reaches the
// caller in time. When the poll outlives the caller's deadline, the
// message is still taken, as SQS takes it for a poll whose caller is gone:
// it arrived while the poll waited, is hidden and counts a receive nobody
// saw. The fake waits for the caller's context then, as a caller whose
// request is in flight does, which the test's short deadlines bound.
func (q *longPollQueue) ReceiveMessage(ctx context.Context, in *awssqs.ReceiveMessageInput, _ ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error) {
	q.mu.Lock()
	q.waits = append(q.waits, in.WaitTimeSeconds)
	wait := time.Duration(in.WaitTimeSeconds) * time.Second
	if in.WaitTimeSeconds == 0 {
		wait = 20 * time.Second // left out: the queue's ReceiveMessageWaitTimeSeconds
	}
	q.received++
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+q.rtt {
		q.unseen++
		q.mu.Unlock()
		<-ctx.Done()
		return nil, ctx.Err()
	}
	q.mu.Unlock()
	return &awssqs.ReceiveMessageOutput{Messages: []types.Message{{
		MessageId: aws.String("m1"), ReceiptHandle: aws.String("rh1"), Body: aws.String("x"),
		Attributes: map[string]string{"ApproximateReceiveCount": "1"},
	}}}, nil
}

func TestReceiveNeverOutlivesItsContext(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wait     time.Duration // Options.WaitTime
		deadline time.Duration // the Receive's context
		// got: whether the Receive must return the message; when false
		// it must return the context's error having taken nothing.
		got bool
	}{
		{"under 1s left", 0, 800 * time.Millisecond, false},
		{"just over 1s left: no time for the answer", 0, 1050 * time.Millisecond, false},
		{"3s left", 0, 3 * time.Second, true},
		{"WaitTime 1s, 3s left", time.Second, 3 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &longPollQueue{rtt: 100 * time.Millisecond}
			s, err := openSubscription(t.Context(), q, "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo", &Options{WaitTime: tc.wait})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
			defer cancel()
			ds, err := s.Receive(ctx, 10)
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.unseen > 0 {
				t.Fatalf("Receive sent WaitTimeSeconds %v with %s left: SQS served a receive nobody read; the message is hidden and its receive count is %d", q.waits, tc.deadline, q.received)
			}
			for _, w := range q.waits {
				if w < 1 {
					t.Errorf("a receive sent WaitTimeSeconds %d, which the SDK leaves out (the queue's 20s applies)", w)
				}
			}
			if tc.got && (err != nil || len(ds) != 1) {
				t.Fatalf("Receive = %d deliveries, %v; want the message", len(ds), err)
			}
			if !tc.got && (!errors.Is(err, context.DeadlineExceeded) || len(ds) != 0) {
				t.Fatalf("Receive = %d deliveries, %v; want the context's error", len(ds), err)
			}
		})
	}
}

// TestWaitTimeUnderASecondRefused: a WaitTime under SQS's 1s minimum long
// poll could only be sent as WaitTimeSeconds 0, which the SDK leaves out.
func TestWaitTimeUnderASecondRefused(t *testing.T) {
	q := &longPollQueue{rtt: 100 * time.Millisecond}
	s, err := openSubscription(t.Context(), q, "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo", &Options{WaitTime: 500 * time.Millisecond})
	if err == nil {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, rerr := s.Receive(ctx, 10)
		t.Fatalf("openSubscription with WaitTime 500ms worked; a Receive with 3s left sent WaitTimeSeconds %v and returned %v; %d receive(s) nobody read", q.waits, rerr, q.unseen)
	}
	if !strings.Contains(err.Error(), "WaitTime 500ms") {
		t.Fatalf("openSubscription with WaitTime 500ms: %v, want a refusal naming it", err)
	}
}

// TestSDKLeavesZeroWaitTimeOut checks the premise the fake above builds
// on, with the real SDK: WaitTimeSeconds 0 is not sent at all, 1 is.
func TestSDKLeavesZeroWaitTimeOut(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = io.WriteString(w, "{}")
	}))
	defer srv.Close()
	c := awssqs.New(awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""),
	})
	for _, w := range []int32{0, 1} {
		if _, err := c.ReceiveMessage(t.Context(), &awssqs.ReceiveMessageInput{QueueUrl: aws.String(srv.URL + "/q"), WaitTimeSeconds: w}); err != nil {
			t.Fatalf("ReceiveMessage: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || strings.Contains(bodies[0], "WaitTimeSeconds") || !strings.Contains(bodies[1], `"WaitTimeSeconds":1`) {
		t.Fatalf("request bodies %q: want WaitTimeSeconds absent for 0 and sent for 1", bodies)
	}
}
