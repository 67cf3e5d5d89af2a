package need

import (
	"errors"
	"os"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	dsqs "github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/localstack/fauxqs"
)

// Fauxqs starts the fauxqs emulator (localstack/fauxqs, installed from its
// lockfile if needed), sets static test credentials in the environment
// for the standard AWS chain, and returns the emulator's endpoint. It
// skips t outside CI when node or npm is missing, and fails it under CI.
func Fauxqs(t testing.TB) (endpoint string) {
	t.Helper()
	emu, err := fauxqs.Start()
	switch {
	case err == nil:
		t.Cleanup(func() { _ = emu.Stop() })
	case os.Getenv("CI") != "":
		t.Fatalf("fauxqs cannot run under CI: %v", err)
	case !errors.Is(err, fauxqs.ErrUnavailable):
		t.Fatalf("starting fauxqs: %v", err)
	default:
		t.Skipf("fauxqs cannot run here (%v); skipping outside CI", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	return emu.Endpoint
}

// SQSQueue starts fauxqs (see Fauxqs) and creates the FIFO queue
// name+".fifo" with a visibility timeout of 5s and a dead-letter queue
// after 5 receives, so that its redelivery is bounded. It returns a client
// for the emulator, the queue's URL, and the emulator's endpoint.
func SQSQueue(t testing.TB, name string) (client *awssqs.Client, queueURL, endpoint string) {
	t.Helper()
	endpoint = Fauxqs(t)
	c := awssqs.New(awssqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  dsqs.KeepRequestBody(awshttp.NewBuildableClient())})
	ctx := t.Context()
	dlq, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name + "-dlq.fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	arn, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: dlq.QueueUrl, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	redrive := `{"deadLetterTargetArn":"` + arn.Attributes["QueueArn"] + `","maxReceiveCount":5}`
	q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true", "VisibilityTimeout": "5", "RedrivePolicy": redrive}})
	if err != nil {
		t.Fatal(err)
	}
	return c, *q.QueueUrl, endpoint
}
