package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	dsqs "github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/localstack/fauxqs"
)

// Redelivery settings of both brokers: a lease long enough for a handler
// on a loaded machine, and a delivery bound the dedup TTL covers.
const (
	ackWait     = 10 * time.Second
	maxDeliver  = 20
	streamName  = "CHAOS"
	durableName = "workers"
)

// jetstreamBroker prepares the stream and durable on the NATS server at
// addr, with a 10s dedup window so that the resends of a restarted
// publisher outlive it and reach the consumers' dedup, and watches the
// server's advisories for messages it gives up on.
func jetstreamBroker(ctx context.Context, addr string) (*broker, error) {
	url := fmt.Sprintf("jetstream://%s/%s?subject=chaos&durable=%s&create=true&window=10s&ack_wait=%s&max_deliveries=%d",
		addr, streamName, durableName, ackWait, maxDeliver)
	con, err := dedupq.OpenConsumer(ctx, url, dedupq.ConsumerOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the stream and durable: %w", err)
	}
	con.Close(ctx)
	nc, err := nats.Connect("nats://"+addr, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	var mu sync.Mutex
	dead := map[uint64]bool{}
	advisory := func(m *nats.Msg) {
		var a struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &a) == nil {
			mu.Lock()
			dead[a.StreamSeq] = true
			mu.Unlock()
		}
	}
	for _, kind := range []string{"MAX_DELIVERIES", "MSG_TERMINATED"} {
		if _, err := nc.Subscribe(fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.%s.%s.%s", kind, streamName, durableName), advisory); err != nil {
			nc.Close()
			return nil, err
		}
	}
	return &broker{
		url: url,
		settled: func(ctx context.Context) (bool, string) {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			cons, err := js.Consumer(ctx, streamName, durableName)
			if err != nil {
				return false, err.Error()
			}
			info, err := cons.Info(ctx)
			if err != nil {
				return false, err.Error()
			}
			return info.NumPending == 0 && info.NumAckPending == 0,
				fmt.Sprintf("%d pending, %d awaiting ack", info.NumPending, info.NumAckPending)
		},
		deadLettered: func(context.Context) int {
			_ = nc.Flush()
			mu.Lock()
			defer mu.Unlock()
			return len(dead)
		},
		close: nc.Close,
	}, nil
}

// sqsBroker starts a fauxqs of its own and creates a FIFO queue with a
// dead-letter queue after maxDeliver receives. fauxqs keeps everything in
// memory, so it is not restarted: the children reach it through a
// cutProxy, whose fault cuts them off from it as a restart would.
func sqsBroker(ctx context.Context) (*broker, error) {
	emu, err := fauxqs.StartWith(fauxqs.Options{})
	if err != nil {
		return nil, fmt.Errorf("starting fauxqs: %w", err)
	}
	cut, err := startCutProxy(strings.TrimPrefix(emu.Endpoint, "http://"))
	if err != nil {
		_ = emu.Stop()
		return nil, err
	}
	c := awssqs.New(awssqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(emu.Endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  dsqs.KeepRequestBody(awshttp.NewBuildableClient())})
	stop := func() {
		cut.close()
		_ = emu.Stop()
	}
	fail := func(err error) (*broker, error) {
		stop()
		return nil, err
	}
	dlq, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String("chaos-dlq.fifo"), Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		return fail(err)
	}
	arn, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: dlq.QueueUrl, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	if err != nil {
		return fail(err)
	}
	redrive := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":%d}`, arn.Attributes["QueueArn"], maxDeliver)
	q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String("chaos.fifo"), Attributes: map[string]string{
		"FifoQueue": "true", "VisibilityTimeout": strconv.Itoa(int(ackWait / time.Second)), "RedrivePolicy": redrive,
	}})
	if err != nil {
		return fail(err)
	}
	count := func(ctx context.Context, url *string) (visible, inFlight, delayed int, err error) {
		out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: url, AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		}})
		if err != nil {
			return 0, 0, 0, err
		}
		n := func(k types.QueueAttributeName) int { v, _ := strconv.Atoi(out.Attributes[string(k)]); return v }
		return n(types.QueueAttributeNameApproximateNumberOfMessages), n(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible),
			n(types.QueueAttributeNameApproximateNumberOfMessagesDelayed), nil
	}
	return &broker{
		url:     fmt.Sprintf("sqs://chaos.fifo?region=us-east-1&endpoint=http://%s&wait_time=2s", cut.addr),
		env:     []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true"},
		grouped: true,
		settled: func(ctx context.Context) (bool, string) {
			v, f, d, err := count(ctx, q.QueueUrl)
			if err != nil {
				return false, err.Error()
			}
			return v+f+d == 0, fmt.Sprintf("%d visible, %d in flight, %d delayed", v, f, d)
		},
		deadLettered: func(ctx context.Context) int {
			v, f, d, _ := count(ctx, dlq.QueueUrl)
			return v + f + d
		},
		cut:   cut,
		close: stop,
	}, nil
}
