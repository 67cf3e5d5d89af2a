package main

// Runs the example unchanged on the in-memory broker, on an embedded NATS
// server started in this process (the URL host "embedded"), on the local
// NATS server at 127.0.0.1:4222, and on an SQS FIFO queue in the fauxqs
// emulator (localstack/fauxqs) started, and installed from its lockfile if
// needed, by the test. The local server, and fauxqs when node or npm is
// missing, are skipped outside CI and fail the test under CI.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/localstack/fauxqs"
)

// deleteStream removes the example's stream from the shared local server.
func deleteStream(server, name string) {
	nc, err := nats.Connect(server)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteStream(ctx, name)
}

// sqsQueue starts fauxqs and creates a FIFO queue with a dead-letter
// queue (so the redelivery span is bounded), returning the sqs:// URL.
func sqsQueue(t *testing.T, name string) string {
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
	c := awssqs.New(awssqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(emu.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
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
	_, err = c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true", "VisibilityTimeout": "5", "RedrivePolicy": redrive}})
	if err != nil {
		t.Fatal(err)
	}
	return "sqs://" + name + ".fifo?region=us-east-1&endpoint=" + emu.Endpoint
}

func TestRunOnEveryBroker(t *testing.T) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	cases := []struct {
		name  string
		url   string
		local bool
		url2  func(t *testing.T) string // when set, makes the URL
	}{
		{"mem defaults", "mem://example-" + id, false, nil},
		{"mem with window", "mem://example-w-" + id + "?window=2m&maxdeliveries=5", false, nil},
		{"jetstream embedded", "jetstream://embedded/EX" + id + "?subject=ex" + id + "&durable=example&create=true&maxdeliver=5&storage=memory", false, nil},
		{"jetstream local", "jetstream://127.0.0.1:4222/EX" + id + "?subject=ex" + id + "&durable=example&create=true&maxdeliver=5&storage=memory", true, nil},
		{"sqs fauxqs", "", false, func(t *testing.T) string { return sqsQueue(t, "example-"+id) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.local {
				c, err := net.DialTimeout("tcp", "127.0.0.1:4222", 2*time.Second)
				switch {
				case err == nil:
					c.Close()
					t.Cleanup(func() { deleteStream("nats://127.0.0.1:4222", "EX"+id) })
				case os.Getenv("CI") != "":
					t.Fatalf("the local NATS server is unreachable under CI: %v", err)
				default:
					t.Skipf("the local NATS server at 127.0.0.1:4222 is unreachable (%v); skipping outside CI", err)
				}
			}
			url := tc.url
			if tc.url2 != nil {
				url = tc.url2(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := run(ctx, url); err != nil {
				t.Fatalf("run(%s): %v", url, err)
			}
		})
	}
}
