package sqs

// Terminate's move to the dead-letter queue when SQS refuses it (issue 29),
// against a driver-level fake of the sqsAPI interface that enforces SQS's
// documented rules. No emulator, no AWS.
//
// The rules the fake enforces:
//   - Sending needs sqs:SendMessage on the queue sent to (SQS Developer
//     Guide, "Amazon SQS API permissions: Actions and resource reference");
//     without it SQS answers 403 AccessDenied. On an SSE-KMS queue the
//     sender also needs kms:GenerateDataKey and kms:Decrypt on its key
//     (SQS Developer Guide, "Key management", "Configuring AWS KMS
//     permissions"), else KmsAccessDenied.
//   - A message may not exceed the queue's MaximumMessageSize (SQS API
//     reference, SetQueueAttributes: "the limit of how many bytes a
//     message can contain before Amazon SQS rejects it"), and "all parts of
//     the message attribute, including Name, Type, and Value, are part of
//     the message size restriction" (SQS API reference,
//     MessageAttributeValue): the body plus every attribute's name, data
//     type and value.

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

const (
	dlSourceURL = "https://sqs.us-east-1.amazonaws.com/123456789012/q.fifo"
	dlQueueURL  = "https://sqs.us-east-1.amazonaws.com/123456789012/q-dlq.fifo"
)

// deadLetterQueues is a FIFO queue (MaximumMessageSize 256 KiB) with a
// RedrivePolicy to a dead-letter queue whose MaximumMessageSize is dlqMax.
type deadLetterQueues struct {
	sqsAPI
	dlqMax int
	denied bool // the caller lacks sqs:SendMessage on the dead-letter queue

	mu      sync.Mutex
	sends   int
	moved   []*awssqs.SendMessageInput
	deletes int
}

func (f *deadLetterQueues) GetQueueAttributes(_ context.Context, in *awssqs.GetQueueAttributesInput, _ ...func(*awssqs.Options)) (*awssqs.GetQueueAttributesOutput, error) {
	a := map[string]string{"FifoQueue": "true", "VisibilityTimeout": "30", "MaximumMessageSize": "262144"}
	if aws.ToString(in.QueueUrl) == dlQueueURL {
		a["MaximumMessageSize"] = strconv.Itoa(f.dlqMax)
	} else {
		a["RedrivePolicy"] = `{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:q-dlq.fifo","maxReceiveCount":3}`
	}
	return &awssqs.GetQueueAttributesOutput{Attributes: a}, nil
}

func (f *deadLetterQueues) GetQueueUrl(context.Context, *awssqs.GetQueueUrlInput, ...func(*awssqs.Options)) (*awssqs.GetQueueUrlOutput, error) {
	return &awssqs.GetQueueUrlOutput{QueueUrl: aws.String(dlQueueURL)}, nil
}

// sqsError is an error as the SDK returns an unmodelled SQS refusal.
func sqsError(status int, code, msg string) error {
	return &smithy.OperationError{ServiceID: "SQS", OperationName: "SendMessage", Err: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
		Err:      &smithy.GenericAPIError{Code: code, Message: msg, Fault: smithy.FaultClient},
	}}
}

func (f *deadLetterQueues) SendMessage(_ context.Context, in *awssqs.SendMessageInput, _ ...func(*awssqs.Options)) (*awssqs.SendMessageOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends++
	if f.denied {
		return nil, sqsError(403, "AccessDenied", "User: arn:aws:iam::123456789012:role/worker is not authorized to perform: sqs:sendmessage on resource: arn:aws:sqs:us-east-1:123456789012:q-dlq.fifo")
	}
	if n := sizeAsSQSCounts(in); n > f.dlqMax {
		return nil, sqsError(400, "InvalidParameterValue", "One or more parameters are invalid. Reason: Message must be shorter than "+strconv.Itoa(f.dlqMax)+" bytes.")
	}
	f.moved = append(f.moved, in)
	return &awssqs.SendMessageOutput{MessageId: aws.String("dlq-1")}, nil
}

func (f *deadLetterQueues) DeleteMessageBatch(_ context.Context, in *awssqs.DeleteMessageBatchInput, _ ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deletes += len(in.Entries)
	out := &awssqs.DeleteMessageBatchOutput{}
	for _, e := range in.Entries {
		out.Successful = append(out.Successful, types.DeleteMessageBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

// sizeAsSQSCounts is the documented rule: the body plus each attribute's
// name, data type and value.
func sizeAsSQSCounts(in *awssqs.SendMessageInput) int {
	n := len(aws.ToString(in.MessageBody))
	for k, v := range in.MessageAttributes {
		n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

func TestTerminateWhenTheDeadLetterQueueRefuses(t *testing.T) {
	reason := errors.New(strings.Repeat("the handler gave up on this message for good; ", 6))
	for _, tc := range []struct {
		name   string
		f      *deadLetterQueues
		body   int // bytes of the message's body
		attrs  map[string]types.MessageAttributeValue
		moved  bool   // moved and deleted; else a *DeadLetterError, nothing deleted
		want   string // what that error must say
		sends  int    // SendMessage calls Terminate may make
		reason bool   // the moved message carries (part of) the reason
	}{
		{name: "room for the reason", f: &deadLetterQueues{dlqMax: 262144}, body: 100, moved: true, sends: 1, reason: true},
		{name: "the reason would push it past the dead-letter queue's size",
			f: &deadLetterQueues{dlqMax: 262144}, body: 262144 - 60, moved: true, sends: 1, reason: true},
		{name: "a user attribute leaves no room at all",
			f: &deadLetterQueues{dlqMax: 262144}, body: 262144 - 50,
			attrs: map[string]types.MessageAttributeValue{"k": {DataType: aws.String("String"), StringValue: aws.String("0123456789012345678901234567890123")}},
			moved: true, sends: 1},
		{name: "too large for the dead-letter queue even without the reason",
			f: &deadLetterQueues{dlqMax: 1024}, body: 2000,
			want: "MaximumMessageSize", sends: 0},
		{name: "no sqs:SendMessage on the dead-letter queue",
			f: &deadLetterQueues{dlqMax: 262144, denied: true}, body: 100,
			want: "sqs:SendMessage", sends: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := openSubscription(t.Context(), tc.f, dlSourceURL, &Options{DeleteLinger: -1})
			if err != nil {
				t.Fatal(err)
			}
			d := s.deliveries([]types.Message{{
				MessageId: aws.String("m1"), ReceiptHandle: aws.String("rh1"), Body: aws.String(strings.Repeat("b", tc.body)),
				Attributes: map[string]string{
					"MessageGroupId": "g", "MessageDeduplicationId": "id-1", "ApproximateReceiveCount": "1",
				},
				MessageAttributes: tc.attrs,
			}}, 30*time.Second)[0]
			err = s.Terminate(t.Context(), d, reason)
			tc.f.mu.Lock()
			defer tc.f.mu.Unlock()
			if tc.f.sends > tc.sends {
				t.Errorf("Terminate made %d SendMessage calls, want at most %d", tc.f.sends, tc.sends)
			}
			if tc.moved {
				if err != nil || len(tc.f.moved) != 1 || tc.f.deletes != 1 {
					t.Fatalf("Terminate: %v; %d moved, %d deleted; want the message moved and deleted", err, len(tc.f.moved), tc.f.deletes)
				}
				if n := sizeAsSQSCounts(tc.f.moved[0]); n > tc.f.dlqMax {
					t.Errorf("moved %d bytes to a dead-letter queue that takes %d", n, tc.f.dlqMax)
				}
				got := decodeAttr(tc.f.moved[0].MessageAttributes[ReasonAttr])
				if tc.reason && (got == "" || !strings.HasPrefix(reason.Error(), got)) {
					t.Errorf("reason attribute %q, want a prefix of the reason", got)
				}
				return
			}
			var dle *DeadLetterError
			if !errors.As(err, &dle) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Terminate: %v; want a *DeadLetterError saying %q", err, tc.want)
			}
			if s.IsRetryable(err) {
				t.Errorf("IsRetryable(%v) = true: the Consumer would resend it until SettleTimeout", err)
			}
			if tc.f.deletes != 0 {
				t.Errorf("the message was deleted though not moved")
			}
			if tc.want == "MaximumMessageSize" && !errors.Is(err, ErrTooLarge) {
				t.Errorf("Terminate: %v, want it to match ErrTooLarge", err)
			}
		})
	}
}
