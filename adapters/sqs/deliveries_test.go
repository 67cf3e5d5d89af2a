package sqs

// Conversion of received messages into deliveries, on messages made in
// the test: talks to nothing.

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestDeliveriesOfAReceive: each message of a receive becomes its own
// delivery, with its ID, attempt, backend ID, lease, body and receipt; the
// ten of a full receive cost the slice, one block of Deliveries and
// handles, and each body's copy: 12 allocations (32 with a Delivery and a
// handle allocated per message, as before).
func TestDeliveriesOfAReceive(t *testing.T) {
	s := &Subscription{}
	ms := make([]types.Message, maxBatch)
	for i := range ms {
		n := strconv.Itoa(i)
		ms[i] = types.Message{
			MessageId: aws.String("mid-" + n), ReceiptHandle: aws.String("rh-" + n), Body: aws.String("body " + n),
			Attributes: map[string]string{
				string(types.MessageSystemAttributeNameMessageDeduplicationId):  "id-" + n,
				string(types.MessageSystemAttributeNameApproximateReceiveCount): strconv.Itoa(i + 1),
			},
		}
	}
	ds := s.deliveries(ms, 30*time.Second)
	if len(ds) != len(ms) {
		t.Fatalf("%d deliveries of %d messages", len(ds), len(ms))
	}
	for i, d := range ds {
		n := strconv.Itoa(i)
		receipt, err := handle(d)
		if err != nil || receipt != "rh-"+n || d.Message.ID != "id-"+n || d.Attempt != i+1 ||
			d.BackendID != "mid-"+n || d.Lease != 30*time.Second || string(d.Message.Body) != "body "+n {
			t.Fatalf("delivery %d: %+v, receipt %q (%v)", i, d, receipt, err)
		}
		if r, _ := handleOf(d); aws.ToString(r.msg.MessageId) != "mid-"+n {
			t.Fatalf("delivery %d forwards message %s to a dead-letter queue", i, aws.ToString(r.msg.MessageId))
		}
		if i > 0 && (d == ds[i-1] || d.Handle == ds[i-1].Handle) {
			t.Fatalf("deliveries %d and %d share their Delivery or handle", i-1, i)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.deliveries(ms, time.Second) }); n > 12 {
		t.Errorf("%.0f allocations for a receive of %d messages, want 12", n, len(ms))
	}
}

// fakeReceives answers every ReceiveMessage with out; every other call of
// the API panics (nil interface).
type fakeReceives struct {
	sqsAPI
	out *awssqs.ReceiveMessageOutput
}

func (f *fakeReceives) ReceiveMessage(context.Context, *awssqs.ReceiveMessageInput, ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error) {
	return f.out, nil
}

// TestReceiveAllocations: a receive of ten messages costs the request
// (input, queue URL, attempt ID and its pointer) and the deliveries'
// 12: 16, where a fresh attribute-name list per receive made 17, and 18
// under the race detector, which moved crypto/rand's buffer to the heap.
// Bodies of 64 bytes: the tiny allocator's counting of 1-byte copies
// varies.
func TestReceiveAllocations(t *testing.T) {
	out := &awssqs.ReceiveMessageOutput{Messages: make([]types.Message, maxBatch)}
	for i := range out.Messages {
		n := strconv.Itoa(i)
		out.Messages[i] = types.Message{
			MessageId: aws.String("mid-" + n), ReceiptHandle: aws.String("rh-" + n), Body: aws.String(strings.Repeat("b", 64)),
			Attributes: map[string]string{string(types.MessageSystemAttributeNameApproximateReceiveCount): "1"},
		}
	}
	s := &Subscription{
		api: &fakeReceives{out: out}, opts: Options{WaitTime: maxWait},
		q: &queue{info: QueueInfo{URL: "q", VisibilityTimeout: time.Minute}},
	}
	n := testing.AllocsPerRun(100, func() {
		if ds, err := s.Receive(context.Background(), maxBatch); err != nil || len(ds) != maxBatch {
			t.Fatalf("Receive = %d deliveries, %v", len(ds), err)
		}
	})
	t.Logf("%.1f allocations", n)
	if n > 16 {
		t.Errorf("%.0f allocations for a receive of %d messages, want 16", n, maxBatch)
	}
}
