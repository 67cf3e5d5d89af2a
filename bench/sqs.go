package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/localstack/fauxqs"
)

// textPayload is the 1 KiB body of SQS messages: text, which SQS carries as
// it is (the zero bytes of payload are characters SQS refuses, which the
// adapter would encode and a raw send could not send at all).
var (
	textBody    = bytes.Repeat([]byte("x"), 1024)
	textPayload = string(textBody)
)

// sqsBatch is SQS's batch limit, for sends and deletes.
const sqsBatch = 10

// sqsRows measure SQS FIFO on fauxqs (FAUXQS_ENDPOINT, or one started
// here). Messages are spread over consumeConcurrency message groups: fauxqs
// returns at most one message per group per ReceiveMessage, so with one
// group every receive would carry a single message. The emulator, a Node.js
// process, is what bounds both sides' rates here, not the SDK: these rows
// show the adapter's overhead on top of an HTTP round trip per batch, not
// SQS's throughput.
//
// A ReceiveMessage that the SDK retries after fauxqs served it hides that
// attempt's messages for the queue's VisibilityTimeout (30 s) and locks
// their groups: fauxqs ignores ReceiveRequestAttemptId, which on SQS
// returns the same messages to the retry. One such retry made the raw
// consume rows read 160 msgs/s (5,000 messages in 31 s, 28 one-second
// empty polls at the end). The SDK retried on "deserialization failed,
// read tcp …: use of closed network connection" reading a 200 response,
// on a loaded machine in 11 of about 260 raw consume sides and 3 of about
// 260 dedupq ones: the transport closed the connection after a request
// write failed with io.EOF, read from a body the SDK had closed early
// (aws-sdk-go-v2 issues 1825 and 2935 report the same error). Every
// client here goes through sqs.KeepRequestBody, which ends that (see
// newSQSClient). sqsSide still abandons a run whose ReceiveMessage attempt
// failed and runs the side again, on a fresh client and queue, and the run
// lists each such sample after the table, should anything else spoil one.
func sqsRows(ctx context.Context, _ config) ([]row, func(), error) {
	emu, err := fauxqs.Start()
	if errors.Is(err, fauxqs.ErrUnavailable) {
		return nil, nil, fmt.Errorf("fauxqs %w: %w", errUnavailable, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("starting fauxqs: %w", err)
	}
	// client makes and fills queues, outside the timed parts.
	client, clientConns := newSQSClient(emu.Endpoint, nil)
	var queues []string
	create := func(ctx context.Context, attrs map[string]string) (string, error) {
		attrs["FifoQueue"] = "true"
		out, err := client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(randomName("bench-") + ".fifo"), Attributes: attrs})
		if err != nil {
			return "", err
		}
		queues = append(queues, *out.QueueUrl)
		return *out.QueueUrl, nil
	}
	cleanup := func() {
		// fauxqs keeps queues in memory: only one found through
		// FAUXQS_ENDPOINT outlives this run.
		for _, url := range queues {
			_, _ = client.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
		}
		clientConns.CloseIdleConnections()
		_ = emu.Stop()
	}
	// Every queue dead-letters after 5 receives: a Guard refuses to run
	// on unbounded redelivery, which its TTL could not cover.
	dlq, err := create(ctx, map[string]string{})
	var arn *awssqs.GetQueueAttributesOutput
	if err == nil {
		arn, err = client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(dlq), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn}})
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	redrive := fmt.Sprintf(`{"deadLetterTargetArn":%q,"maxReceiveCount":5}`, arn.Attributes[string(types.QueueAttributeNameQueueArn)])
	queue := func(ctx context.Context) (string, error) {
		return create(ctx, map[string]string{"RedrivePolicy": redrive})
	}
	onClient := func(name string, run func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error)) side {
		return sqsSide(emu.Endpoint, name, run)
	}
	rawPublish := onClient("SendMessageBatch", func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
		url, err := queue(ctx)
		if err != nil {
			return 0, err
		}
		return sqsSendAll(ctx, client, url, n)
	})
	// publisher is a Publisher on a fresh queue.
	publisher := func(ctx context.Context, client *awssqs.Client) (*dedupq.Publisher, error) {
		url, err := queue(ctx)
		if err != nil {
			return nil, err
		}
		top, err := sqs.OpenTopic(ctx, client, url, nil)
		if err != nil {
			return nil, err
		}
		pub, err := dedupq.NewPublisher(ctx, top, dedupq.PublisherOptions{})
		if err != nil {
			top.Close()
		}
		return pub, err
	}
	dqPublish := onClient("Publisher", func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
		pub, err := publisher(ctx, client)
		if err != nil {
			return 0, err
		}
		defer pub.Close(context.Background())
		msgs := make([]*dedupq.Message, n)
		w := startWatch()
		for i := range msgs {
			msgs[i] = &dedupq.Message{ID: "m" + strconv.Itoa(i), Body: textBody, GroupKey: groupKey(int64(i), consumeConcurrency)}
		}
		_, err = pub.PublishBatch(ctx, msgs)
		return w.stop(), err
	})
	filled := func(ctx context.Context, n int64) (string, error) {
		return untimed(ctx, func(ctx context.Context) (string, error) {
			url, err := queue(ctx)
			if err == nil {
				_, err = sqsSendAll(ctx, client, url, n)
			}
			return url, err
		})
	}
	// One message a call from 64 goroutines, each waiting for its own
	// answer: how users write a publisher without batching by hand.
	rawCalls := onClient("SendMessage×64 goroutines", func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
		url, err := queue(ctx)
		if err != nil {
			return 0, err
		}
		w := startWatch()
		err = concurrently(n, func(i int64) error {
			id := "m" + strconv.FormatInt(i, 10)
			_, err := client.SendMessage(ctx, &awssqs.SendMessageInput{
				QueueUrl: aws.String(url), MessageBody: aws.String(string(textBody)),
				MessageDeduplicationId: aws.String(id), MessageGroupId: aws.String(groupKey(i, consumeConcurrency)),
			})
			return err
		})
		return w.stop(), err
	})
	dqCalls := onClient("Publish×64 goroutines", func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
		pub, err := publisher(ctx, client)
		if err != nil {
			return 0, err
		}
		defer pub.Close(context.Background())
		w := startWatch()
		err = concurrently(n, func(i int64) error {
			_, err := pub.Publish(ctx, &dedupq.Message{ID: "m" + strconv.FormatInt(i, 10), Body: textBody, GroupKey: groupKey(i, consumeConcurrency)})
			return err
		})
		return w.stop(), err
	})
	rawConsume := onClient("ReceiveMessage+DeleteMessageBatch", func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
		url, err := filled(ctx, n)
		if err != nil {
			return 0, err
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		seen := make(map[string]bool, n)
		w := startWatch()
		for int64(len(seen)) < n {
			out, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{
				QueueUrl: aws.String(url), MaxNumberOfMessages: sqsBatch, WaitTimeSeconds: 1,
				MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageDeduplicationId},
				// As the adapter does: on SQS an SDK retry of a lost
				// response then returns the same messages.
				ReceiveRequestAttemptId: aws.String(randomName("")),
			})
			if err != nil {
				return 0, fmt.Errorf("after %d of %d messages: %w", len(seen), n, err)
			}
			if len(out.Messages) == 0 {
				continue
			}
			entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
			for i, m := range out.Messages {
				seen[m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]] = true
				entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
			}
			del, err := client.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err != nil {
				return 0, err
			}
			if len(del.Failed) > 0 {
				return 0, fmt.Errorf("deleting: %s", aws.ToString(del.Failed[0].Message))
			}
		}
		return w.stop(), nil
	})
	dqConsume := func(name string, guarded bool) side {
		return onClient(name, func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error) {
			url, err := filled(ctx, n)
			if err != nil {
				return 0, err
			}
			// A short long poll: the consumer's last receive, abandoned
			// when it stops, holds fauxqs no longer than that.
			sub, err := sqs.OpenSubscription(ctx, client, url, &sqs.Options{WaitTime: time.Second})
			if err != nil {
				return 0, err
			}
			return consumeGuarded(ctx, sub, guarded, n)
		})
	}
	n := int64(5_000)
	rows := []row{
		{name: "publish 1 KiB", conc: 1, n: n, allocGoal: true, raw: rawPublish, dq: dqPublish},
		{name: "publish calls", conc: consumeConcurrency, n: n, raw: rawCalls, dq: dqCalls},
		{name: "consume", conc: consumeConcurrency, n: n, allocGoal: true, raw: rawConsume, dq: dqConsume("Consumer", false)},
		{name: "consume+guard", conc: consumeConcurrency, n: n, raw: rawConsume, dq: dqConsume("Consumer+Guard(memstore)", true)},
	}
	return rows, cleanup, nil
}

// sqsSendAll sends n text messages to the FIFO queue at url in batches of
// 10, spread over consumeConcurrency groups, timed.
func sqsSendAll(ctx context.Context, client *awssqs.Client, url string, n int64) (time.Duration, error) {
	entries := make([]types.SendMessageBatchRequestEntry, 0, sqsBatch)
	w := startWatch()
	for i := int64(0); i < n; {
		entries = entries[:0]
		for ; i < n && len(entries) < sqsBatch; i++ {
			entries = append(entries, types.SendMessageBatchRequestEntry{
				Id:                     aws.String(strconv.Itoa(len(entries))),
				MessageBody:            aws.String(textPayload),
				MessageDeduplicationId: aws.String("m" + strconv.FormatInt(i, 10)),
				MessageGroupId:         aws.String(groupKey(i, consumeConcurrency)),
			})
		}
		out, err := client.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			return 0, err
		}
		if len(out.Failed) > 0 {
			return 0, fmt.Errorf("sending: %s", aws.ToString(out.Failed[0].Message))
		}
	}
	return w.stop(), nil
}

// newSQSClient makes an SQS client for fauxqs at endpoint on an HTTP
// transport of its own, configured as the SDK's default and wrapped in
// sqs.KeepRequestBody, as the adapter's URL opener wraps its clients (the
// raw side too: without it a busy client's request fails now and then after
// the server served it), and counts its ReceiveMessage attempts in rc when
// rc is not nil.
func newSQSClient(endpoint string, rc *receiveCounter) (*awssqs.Client, *http.Transport) {
	tr := awshttp.NewBuildableClient().GetTransport()
	o := awssqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  sqs.KeepRequestBody(&http.Client{Transport: tr}),
	}
	if rc != nil {
		o.APIOptions = append(o.APIOptions, rc.install)
	}
	return awssqs.New(o), tr
}

// sqsTries bounds how often sqsSide runs a side whose ReceiveMessage
// attempts fail; the last run is kept, stalled or not, with a note.
const sqsTries = 3

// errSpoiled cancels a side's run once a ReceiveMessage attempt failed.
var errSpoiled = errors.New("a ReceiveMessage attempt failed: fauxqs hides what it had served for the VisibilityTimeout")

// sqsSide is a side that runs on a fresh SQS client, whose connections it
// closes when done. When a ReceiveMessage attempt fails in a run (which
// the SDK retries, see sqsRows), it abandons the run at once and runs the
// side again, and notes it: a sample that would wait out fauxqs's
// VisibilityTimeout measures neither side. Both sides of a row go through
// it alike.
func sqsSide(endpoint, name string, run func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error)) side {
	return side{name, func(ctx context.Context, round int, n int64) (time.Duration, error) {
		for try := 1; ; try++ {
			d, why, err := sqsTry(ctx, endpoint, run, n, try < sqsTries)
			if why == "" {
				return d, err
			}
			if try == sqsTries {
				addNote(fmt.Sprintf("sqs %s round %d: a ReceiveMessage attempt failed in each of %d runs (last: %s); the last run's sample is kept, with fauxqs's VisibilityTimeout in it", name, round+1, try, why))
				return d, err
			}
			addNote(fmt.Sprintf("sqs %s round %d: a ReceiveMessage attempt failed (%s), which the SDK retries and fauxqs then hides the messages it had served for the VisibilityTimeout; run abandoned and made again", name, round+1, why))
		}
	}}
}

// sqsTry runs a side once on a client of its own; why is the error of a
// failed ReceiveMessage attempt, if one failed, and the run is cancelled
// on it when abandon is set.
func sqsTry(ctx context.Context, endpoint string, run func(ctx context.Context, client *awssqs.Client, n int64) (time.Duration, error), n int64, abandon bool) (d time.Duration, why string, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rc := receiveCounter{}
	if abandon {
		rc.failed = func() { cancel(errSpoiled) }
	}
	client, tr := newSQSClient(endpoint, &rc)
	defer tr.CloseIdleConnections()
	d, err = run(ctx, client, n)
	return d, rc.failure(), err
}

// receiveCounter watches a client's ReceiveMessage attempts (each one the
// SDK makes, retries included) and keeps the first error one failed with
// while its context was live.
type receiveCounter struct {
	failed func() // called on that first failure, if set

	mu      sync.Mutex
	lastErr error
}

func (rc *receiveCounter) install(st *middleware.Stack) error {
	// After the SDK's Retry step: once per attempt.
	return st.Finalize.Insert(middleware.FinalizeMiddlewareFunc("benchReceiveAttempts", func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
		out, md, err := next.HandleFinalize(ctx, in)
		if err != nil && ctx.Err() == nil && middleware.GetOperationName(ctx) == "ReceiveMessage" {
			rc.mu.Lock()
			first := rc.lastErr == nil
			if first {
				rc.lastErr = err
			}
			rc.mu.Unlock()
			if first && rc.failed != nil {
				rc.failed()
			}
		}
		return out, md, err
	}), "Retry", middleware.After)
}

// failure is the first failed attempt's error, or "".
func (rc *receiveCounter) failure() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.lastErr == nil {
		return ""
	}
	return rc.lastErr.Error()
}
