package sqs

// Several messages of one group in one receive, as SQS FIFO returns them
// (up to ten of a group at once; fauxqs returns one a receive, which hides
// the case), through the portable Consumer: talks to nothing, the SQS API
// is a fake that answers the first receive with a group's three messages.

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/internal/testutil"
)

// groupAPI is a FIFO queue whose first receive returns messages g-1, g-2
// and g-3 of group g; it records deletes.
type groupAPI struct {
	sqsAPI
	mu       sync.Mutex
	served   bool
	deleted  []string
	received chan struct{}
}

func (f *groupAPI) GetQueueAttributes(context.Context, *awssqs.GetQueueAttributesInput, ...func(*awssqs.Options)) (*awssqs.GetQueueAttributesOutput, error) {
	return &awssqs.GetQueueAttributesOutput{Attributes: map[string]string{
		"FifoQueue": "true", "VisibilityTimeout": "30",
		"RedrivePolicy": `{"maxReceiveCount":5,"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:dlq.fifo"}`,
	}}, nil
}

func (f *groupAPI) ReceiveMessage(ctx context.Context, _ *awssqs.ReceiveMessageInput, _ ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error) {
	f.mu.Lock()
	first := !f.served
	f.served = true
	f.mu.Unlock()
	if !first {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out := &awssqs.ReceiveMessageOutput{}
	for i := 1; i <= 3; i++ {
		n := "g-" + strconv.Itoa(i)
		out.Messages = append(out.Messages, types.Message{
			MessageId: aws.String("mid-" + n), ReceiptHandle: aws.String("rh-" + n), Body: aws.String(n),
			Attributes: map[string]string{
				string(types.MessageSystemAttributeNameMessageDeduplicationId):  n,
				string(types.MessageSystemAttributeNameMessageGroupId):          "g",
				string(types.MessageSystemAttributeNameApproximateReceiveCount): "1",
			},
		})
	}
	return out, nil
}

func (f *groupAPI) DeleteMessageBatch(_ context.Context, in *awssqs.DeleteMessageBatchInput, _ ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &awssqs.DeleteMessageBatchOutput{}
	for _, e := range in.Entries {
		f.deleted = append(f.deleted, aws.ToString(e.ReceiptHandle))
		out.Successful = append(out.Successful, types.DeleteMessageBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

func (f *groupAPI) ChangeMessageVisibility(context.Context, *awssqs.ChangeMessageVisibilityInput, ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityOutput, error) {
	return &awssqs.ChangeMessageVisibilityOutput{}, nil
}

func (f *groupAPI) deletes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// The three messages of one group that one receive returns run one after
// another, in order, though the Consumer has a slot for each.
func TestGroupOfOneReceiveRunsInOrder(t *testing.T) {
	api := &groupAPI{}
	sub, err := openSubscription(t.Context(), api, "https://sqs.us-east-1.amazonaws.com/000000000000/q.fifo", &Options{})
	if err != nil {
		t.Fatal(err)
	}
	con, err := dedupq.NewConsumer(t.Context(), sub, dedupq.ConsumerOptions{Concurrency: 3, Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	running := 0
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- con.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
			mu.Lock()
			running++
			events = append(events, "start "+d.Message.ID+" running "+strconv.Itoa(running))
			mu.Unlock()
			if d.Message.ID == "g-1" {
				// Give g-2 every chance to start beside g-1, as it did
				// before: a bounded look for what must not happen.
				for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
					mu.Lock()
					n := running
					mu.Unlock()
					if n > 1 {
						break
					}
					runtime.Gosched()
				}
			}
			mu.Lock()
			running--
			events = append(events, "end "+d.Message.ID)
			mu.Unlock()
			return nil
		})
	}()
	testutil.WaitFor(t, func() bool { return len(api.deletes()) == 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	con.Close(context.Background())
	want := []string{"start g-1 running 1", "end g-1", "start g-2 running 1", "end g-2", "start g-3 running 1", "end g-3"}
	if !slices.Equal(events, want) {
		t.Errorf("handlers ran %q, want %q", events, want)
	}
}
