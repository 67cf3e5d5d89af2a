package sqs_test

// The test harness: TestMain starts fauxqs, an SQS emulator from npm
// (installed from localstack/fauxqs/package-lock.json with `npm ci`), on a free
// port (installing it first when node_modules is missing), polls it until
// it answers, and stops it after the tests.
//
// Tests that need it call needFauxqs. When it cannot run here (node, or npm
// for its install, is missing) they skip with the reason, unless the
// environment variable CI is set; any other failure to start it (a failed
// install, an emulator that does not answer) fails the whole run, as does
// CI: a run cannot pass on tests it skipped for a fixable reason.
// FAUXQS_ENDPOINT=http://host:port uses an emulator that is already
// running instead of starting one.
//
// Where fauxqs differs from AWS (and how the tests cope):
//   - ReceiveMessage returns at most one message per message group per call
//     (AWS may return several of a group): tests that need several
//     messages at once put them in different groups, and every test
//     receives in a loop until it has what it expects or a deadline passes.
//   - CreateQueue accepts a .fifo name without FifoQueue=true and makes it
//     FIFO (AWS refuses): the tests always pass FifoQueue=true, as on AWS.
//   - A long poll whose HTTP request the client abandoned (its context was
//     cancelled) stays registered until its WaitTimeSeconds ends and takes
//     the next message that arrives, which then reappears only after the
//     visibility timeout, with its receive count raised (AWS documents no
//     such thing): tests that cancel a receive and then publish again use
//     short long polls (Options.WaitTime) or a fresh queue.
//   - DeleteMessageBatch reports success for an unknown receipt handle
//     (AWS fails the entry with ReceiptHandleIsInvalid): no test relies
//     on either answer.
//   - It checks no signatures, so any static credentials work.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/localstack/fauxqs"
)

const testRegion = "us-east-1"

var (
	// fauxqsEndpoint is the emulator's base URL; empty when it is not
	// running, and then fauxqsMissing says why.
	fauxqsEndpoint string
	fauxqsMissing  string
)

func TestMain(m *testing.M) {
	// The SDK must never reach for real credentials or the EC2 metadata
	// service from a test: only loopback traffic is allowed here.
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_SESSION_TOKEN": "",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		os.Setenv(k, v)
	}
	stop, err := startFauxqs()
	if err != nil {
		fauxqsMissing = err.Error()
		switch {
		case os.Getenv("CI") != "":
			fmt.Fprintf(os.Stderr, "adapters/sqs: CI is set but fauxqs cannot run: %v\n", err)
			os.Exit(1)
		case !errors.Is(err, fauxqs.ErrUnavailable):
			fmt.Fprintf(os.Stderr, "adapters/sqs: starting fauxqs: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "adapters/sqs: fauxqs tests will be skipped: %v\n", err)
	}
	code := m.Run()
	if stop != nil {
		if err := stop(); err != nil {
			fmt.Fprintf(os.Stderr, "adapters/sqs: stopping fauxqs: %v\n", err)
		}
	}
	os.Exit(code)
}

// startFauxqs starts the emulator, or returns why it cannot.
func startFauxqs() (stop func() error, err error) {
	e, err := fauxqs.Start()
	if err != nil {
		return nil, err
	}
	fauxqsEndpoint = e.Endpoint
	return e.Stop, nil
}

// newClient is an SQS client for the emulator with static credentials.
func newClient(endpoint string) *awssqs.Client {
	return awssqs.New(awssqs.Options{
		Region:       testRegion,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   sqs.KeepRequestBody(awshttp.NewBuildableClient()),
	})
}

// needFauxqs skips the test when the emulator is not running (TestMain has
// already failed the run under CI), else returns a client for it.
func needFauxqs(t testing.TB) *awssqs.Client {
	t.Helper()
	if fauxqsEndpoint == "" {
		t.Skipf("fauxqs cannot run here: %s", fauxqsMissing)
	}
	return newClient(fauxqsEndpoint)
}

var queueSeq atomic.Int64

// newQueue creates a FIFO queue with a name unique to this run and extra
// attributes, and deletes it when the test ends. It returns the queue URL
// and name.
func newQueue(t testing.TB, c *awssqs.Client, attrs map[string]string) (url, name string) {
	t.Helper()
	return createQueue(t, c, true, attrs)
}

func createQueue(t testing.TB, c *awssqs.Client, fifo bool, attrs map[string]string) (url, name string) {
	t.Helper()
	base := regexp.MustCompile(`[^A-Za-z0-9_-]+`).ReplaceAllString(t.Name(), "-")
	if len(base) > 50 {
		base = base[len(base)-50:]
	}
	name = fmt.Sprintf("t%d-%s", queueSeq.Add(1), strings.Trim(base, "-"))
	a := map[string]string{}
	if fifo {
		name += ".fifo"
		a["FifoQueue"] = "true"
	}
	for k, v := range attrs {
		a[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		t.Fatalf("CreateQueue %s: %v", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url, name
}

// queueCounts reads how many messages are visible and in flight.
func queueCounts(t testing.TB, c *awssqs.Client, url string) (visible, inflight string) {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		t.Fatalf("GetQueueAttributes: %v", err)
	}
	return out.Attributes["ApproximateNumberOfMessages"], out.Attributes["ApproximateNumberOfMessagesNotVisible"]
}

func setQueueAttr(t testing.TB, c *awssqs.Client, url, k, v string) {
	t.Helper()
	_, err := c.SetQueueAttributes(context.Background(), &awssqs.SetQueueAttributesInput{
		QueueUrl: aws.String(url), Attributes: map[string]string{k: v},
	})
	if err != nil {
		t.Fatalf("SetQueueAttributes %s=%s: %v", k, v, err)
	}
}
