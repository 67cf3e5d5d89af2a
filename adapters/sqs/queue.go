package sqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// DefaultCreateVisibilityTimeout is the VisibilityTimeout of a queue that
// Options.Create makes when Options.VisibilityTimeout is zero: SQS's own
// default.
const DefaultCreateVisibilityTimeout = 30 * time.Second

// DefaultMaxReceiveCount is the redrive policy's maxReceiveCount of a queue
// that Options.Create makes when Options.MaxReceiveCount is zero. With
// DefaultCreateVisibilityTimeout it bounds redelivery to 5 × 30s = 2m30s,
// which a dedup Guard's TTL of minutes or more covers.
const DefaultMaxReceiveCount = 5

// maxMaxReceiveCount is the largest maxReceiveCount SQS accepts.
const maxMaxReceiveCount = 1000

// createAPI is what Options.Create needs of the client beyond sqsAPI;
// *sqs.Client implements it, test wrappers may not. ListQueueTags tells whether a queue is one
// this process created, and DeleteQueue removes a dead-letter queue it
// created for a queue it then failed to create.
type createAPI interface {
	sqsAPI
	CreateQueue(ctx context.Context, in *awssqs.CreateQueueInput, optFns ...func(*awssqs.Options)) (*awssqs.CreateQueueOutput, error)
	DeleteQueue(ctx context.Context, in *awssqs.DeleteQueueInput, optFns ...func(*awssqs.Options)) (*awssqs.DeleteQueueOutput, error)
	ListQueueTags(ctx context.Context, in *awssqs.ListQueueTagsInput, optFns ...func(*awssqs.Options)) (*awssqs.ListQueueTagsOutput, error)
}

// DeadLetterName is the name of the dead-letter queue Options.Create makes
// for the FIFO queue named queue: "orders.fifo" → "orders-dlq.fifo", the
// name localstack/localstack-init uses too.
func DeadLetterName(queue string) string {
	return strings.TrimSuffix(queue, ".fifo") + "-dlq.fifo"
}

// createRefusal says why Options.Create cannot make the queue nameOrURL
// through endpoint (the client's base endpoint; "" is AWS's own), or ""
// when it can. It quotes neither, so that a URL error can show it.
func createRefusal(nameOrURL, endpoint string) string {
	switch {
	case strings.Contains(nameOrURL, "://"):
		return "create=true takes a queue name (sqs://orders.fifo), not a queue URL: the URL of a queue yet to be created is the emulator's to choose"
	case !strings.HasSuffix(nameOrURL, ".fifo"):
		return "create=true makes a FIFO queue, whose name must end in .fifo"
	case !queueNameRE.MatchString(DeadLetterName(nameOrURL)) || len(DeadLetterName(nameOrURL)) > 80:
		return "the queue name is too long for create=true to name its dead-letter queue QUEUE-dlq.fifo within SQS's 80 characters"
	case endpoint == "" || isAWSEndpoint(endpoint):
		what := "this endpoint is AWS's"
		if endpoint == "" {
			what = "without endpoint= the client talks to AWS"
		}
		return "create=true is for emulators only (fauxqs, LocalStack) and needs endpoint= naming one; " + what +
			". On AWS, create the queues with infrastructure as code and drop create=true: a FIFO dead-letter queue (FifoQueue=true, name ending in .fifo)" +
			" and the FIFO queue (FifoQueue=true, VisibilityTimeout, RedrivePolicy {deadLetterTargetArn: the dead-letter queue's ARN, maxReceiveCount})"
	}
	return ""
}

// isAWSEndpoint reports whether endpoint's host is one of AWS's domains
// (regional, FIPS, dual-stack, VPC endpoints, China and ISO partitions).
// An alias of an AWS host under another name cannot be told apart.
func isAWSEndpoint(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil {
		return true // not an emulator's address either
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	for _, domain := range []string{"amazonaws.com", "amazonaws.com.cn", "api.aws", "c2s.ic.gov", "sc2s.sgov.gov"} {
		if host == domain || strings.HasSuffix(host, "."+domain) {
			return true
		}
	}
	return false
}

// clientEndpoint is the base endpoint of a client that reports its
// options, as *sqs.Client does; known is false for other clients.
func clientEndpoint(api sqsAPI) (endpoint string, known bool) {
	c, ok := api.(interface{ Options() awssqs.Options })
	if !ok {
		return "", false
	}
	return aws.ToString(c.Options().BaseEndpoint), true
}

// queue is the SQS queue a Topic or Subscription uses. With Options.Create
// it may not exist yet: then info is the queue as Provision will create it
// (with an empty URL) until Provision, which dedupq.NewPublisher and
// dedupq.NewConsumer call once the startup check has passed (see
// driver.Provisioner), creates it.
type queue struct {
	api  sqsAPI
	name string // as given: a queue name, or a queue URL
	opts Options

	provision sync.Mutex // serializes create
	mu        sync.Mutex
	info      QueueInfo
}

// openQueue reads the queue and checks it fits opts. It creates nothing:
// with opts.Create a missing queue is reported as planned, once what can
// be checked before creating it (the name, the endpoint, an existing
// dead-letter queue) has been.
func openQueue(ctx context.Context, api sqsAPI, nameOrURL string, o Options) (*queue, error) {
	switch {
	case o.VisibilityTimeout < 0 || o.VisibilityTimeout > maxVisibility:
		return nil, fmt.Errorf("dedupq/sqs: VisibilityTimeout %s is outside SQS's 0–12h", o.VisibilityTimeout)
	case o.VisibilityTimeout%time.Second != 0:
		return nil, fmt.Errorf("dedupq/sqs: VisibilityTimeout %s is not a whole number of seconds, which is all SQS takes", o.VisibilityTimeout)
	case o.MaxReceiveCount < 0 || o.MaxReceiveCount > maxMaxReceiveCount:
		return nil, fmt.Errorf("dedupq/sqs: MaxReceiveCount %d is outside SQS's 1–%d", o.MaxReceiveCount, maxMaxReceiveCount)
	}
	q := &queue{api: api, name: nameOrURL, opts: o}
	if !o.Create {
		url, err := resolveQueueURL(ctx, api, nameOrURL)
		if err != nil {
			return nil, err
		}
		return q, q.read(ctx, url)
	}
	if _, ok := api.(createAPI); !ok {
		return nil, errors.New("dedupq/sqs: Options.Create needs a client that can also create, tag and delete queues (as *sqs.Client can)")
	}
	if endpoint, known := clientEndpoint(api); known {
		if why := createRefusal(nameOrURL, endpoint); why != "" {
			return nil, errors.New("dedupq/sqs: " + why)
		}
	} else if why := createRefusal(nameOrURL, "http://emulator"); why != "" {
		// A wrapped client does not say where it goes: the caller vouches
		// for it, and only the name is checked.
		return nil, errors.New("dedupq/sqs: " + why)
	}
	url, err := q.lookup(ctx, nameOrURL)
	if err != nil {
		return nil, err
	}
	if url != "" {
		return q, q.read(ctx, url)
	}
	if err := q.checkDeadLetter(ctx); err != nil {
		return nil, err
	}
	q.set(q.planned())
	return q, nil
}

// planned is the queue as create makes it, as readQueue will then report
// it. MaxMessageBytes is the conservative default until it is read.
func (q *queue) planned() QueueInfo {
	return QueueInfo{
		FIFO: true, DeduplicationScope: "queue", FifoThroughputLimit: "perQueue",
		MaxMessageBytes:   defaultMaxMessageBytes,
		VisibilityTimeout: orDefault(q.opts.VisibilityTimeout, DefaultCreateVisibilityTimeout),
		MaxReceiveCount:   orDefault(q.opts.MaxReceiveCount, DefaultMaxReceiveCount),
	}
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

func (q *queue) current() QueueInfo {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.info
}

func (q *queue) set(info QueueInfo) {
	q.mu.Lock()
	q.info = info
	q.mu.Unlock()
}

// read reads the queue at url, checks that it fits the options, and
// records it.
func (q *queue) read(ctx context.Context, url string) error {
	info, err := readQueue(ctx, q.api, url)
	if err != nil {
		return err
	}
	if err := q.fits(info); err != nil {
		return err
	}
	q.set(info)
	return nil
}

// fits checks an existing queue against the options. The adapter never
// changes a queue that exists, so a mismatch is an error that says what
// to change.
func (q *queue) fits(info QueueInfo) error {
	switch {
	case q.opts.Create && info.MaxReceiveCount == 0:
		return fmt.Errorf("dedupq/sqs: queue %s exists without a RedrivePolicy, and create=true never changes an existing queue: give it one (a FIFO dead-letter queue and a maxReceiveCount), or delete it so that create=true makes it", info.URL)
	case q.opts.MaxReceiveCount > 0 && info.MaxReceiveCount == 0:
		return fmt.Errorf("dedupq/sqs: queue %s has no RedrivePolicy, not the maxReceiveCount %d asked (max_deliveries / Options.MaxReceiveCount); an existing queue is never changed: give it one, or stop asking", info.URL, q.opts.MaxReceiveCount)
	case q.opts.MaxReceiveCount > 0 && info.MaxReceiveCount != q.opts.MaxReceiveCount:
		return fmt.Errorf("dedupq/sqs: queue %s has a RedrivePolicy maxReceiveCount of %d, not the %d asked (max_deliveries / Options.MaxReceiveCount); an existing queue is never changed: change one of them", info.URL, info.MaxReceiveCount, q.opts.MaxReceiveCount)
	}
	return nil
}

// lookup returns the URL of the queue named name, or "" when there is no
// such queue.
func (q *queue) lookup(ctx context.Context, name string) (string, error) {
	return lookupQueue(ctx, q.api, name)
}

func lookupQueue(ctx context.Context, api sqsAPI, name string) (string, error) {
	out, err := api.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	var missing *types.QueueDoesNotExist
	switch {
	case errors.As(err, &missing):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("dedupq/sqs: looking up queue %q: %w", name, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// checkDeadLetter checks the dead-letter queue create would use, if it
// exists already: a FIFO queue's dead-letter queue must be FIFO too.
func (q *queue) checkDeadLetter(ctx context.Context) error {
	name := DeadLetterName(q.name)
	url, err := q.lookup(ctx, name)
	if err != nil || url == "" {
		return err
	}
	_, err = deadLetterARN(ctx, q.api, url)
	return err
}

// deadLetterARN reads the ARN of the dead-letter queue at url, checking
// that it is FIFO.
func deadLetterARN(ctx context.Context, api sqsAPI, url string) (string, error) {
	out, err := api.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn, types.QueueAttributeNameFifoQueue},
	})
	if err != nil {
		return "", fmt.Errorf("dedupq/sqs: reading the dead-letter queue %s: %w", url, err)
	}
	if out.Attributes["FifoQueue"] != "true" {
		return "", fmt.Errorf("dedupq/sqs: the dead-letter queue %s exists and is %w: a FIFO queue's dead-letter queue must be FIFO; delete it so that create=true makes it", url, ErrNotFIFO)
	}
	arn := out.Attributes["QueueArn"]
	if arn == "" {
		return "", fmt.Errorf("dedupq/sqs: the dead-letter queue %s reports no QueueArn", url)
	}
	return arn, nil
}

// refresh reads the queue again. While it is not created yet it looks for
// one another process created meanwhile, which is then used as an open
// would use it; if there is none it reports the plan.
func (q *queue) refresh(ctx context.Context) (QueueInfo, error) {
	url := q.current().URL
	if url == "" {
		found, err := q.lookup(ctx, q.name)
		if err != nil || found == "" {
			return q.current(), err
		}
		url = found
	}
	if err := q.read(ctx, url); err != nil {
		return QueueInfo{}, err
	}
	return q.current(), nil
}

// ensure provisions the queue if it is still missing, for a driver used
// without dedupq.NewPublisher or NewConsumer, and returns it.
func (q *queue) ensure(ctx context.Context) (QueueInfo, error) {
	if info := q.current(); info.URL != "" {
		return info, nil
	}
	if err := q.create(ctx); err != nil {
		return QueueInfo{}, err
	}
	return q.current(), nil
}

// creatorTag is the tag under which create leaves a token of its own on
// the queues it creates: SQS answers the create of a queue that exists
// with the same attributes as if it had made it, and only the token tells
// whether this process did, and so may remove it.
const creatorTag = "dedupq-creator"

// create makes what is missing: the dead-letter queue, then the queue with
// a RedrivePolicy to it. A queue another process created meanwhile is
// used when it fits, as at open. When the queue cannot be made, or one
// another process made does not fit, a dead-letter queue made for it
// moments ago is removed, unless something uses it already.
func (q *queue) create(ctx context.Context) error {
	q.provision.Lock()
	defer q.provision.Unlock()
	if q.current().URL != "" || !q.opts.Create {
		return nil
	}
	api := q.api.(createAPI) // checked by openQueue
	if url, err := q.lookup(ctx, q.name); err != nil || url != "" {
		if err != nil {
			return err
		}
		return q.read(ctx, url)
	}
	var tok [8]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	dlqURL, dlqOurs, err := createQueue(ctx, api, DeadLetterName(q.name), nil, token)
	if err != nil {
		return err
	}
	arn, err := deadLetterARN(ctx, api, dlqURL)
	if err != nil {
		return errors.Join(err, q.removeDeadLetter(ctx, api, dlqURL, arn, dlqOurs))
	}
	plan := q.planned()
	redrive, _ := json.Marshal(map[string]any{"deadLetterTargetArn": arn, "maxReceiveCount": plan.MaxReceiveCount})
	url, _, err := createQueue(ctx, api, q.name, map[string]string{
		string(types.QueueAttributeNameVisibilityTimeout): strconv.Itoa(int(plan.VisibilityTimeout / time.Second)),
		string(types.QueueAttributeNameRedrivePolicy):     string(redrive),
	}, token)
	if err != nil {
		return errors.Join(err, q.removeDeadLetter(ctx, api, dlqURL, arn, dlqOurs))
	}
	// Only a queue another process created first can fail this (ours
	// fits), and that one is theirs to keep; the dead-letter queue made
	// for ours is not, unless theirs uses it.
	if err := q.read(ctx, url); err != nil {
		return errors.Join(err, q.removeDeadLetter(ctx, api, dlqURL, arn, dlqOurs))
	}
	return nil
}

// createQueue creates the FIFO queue name with attrs and a creator tag of
// token. ours is true only when the queue is provably this call's. A queue
// of that name with other attributes is returned as it is, for the caller
// to check.
func createQueue(ctx context.Context, api createAPI, name string, attrs map[string]string, token string) (url string, ours bool, err error) {
	a := map[string]string{string(types.QueueAttributeNameFifoQueue): "true"}
	for k, v := range attrs {
		a[k] = v
	}
	out, err := api.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName: aws.String(name), Attributes: a, Tags: map[string]string{creatorTag: token},
	})
	var exists *types.QueueNameExists
	if errors.As(err, &exists) {
		if url, err = lookupQueue(ctx, api, name); err == nil && url == "" {
			err = fmt.Errorf("dedupq/sqs: queue %q exists with other attributes, and then not at all: %w", name, exists)
		}
		return url, false, err
	}
	if err != nil {
		return "", false, fmt.Errorf("dedupq/sqs: creating queue %q: %w", name, err)
	}
	url = aws.ToString(out.QueueUrl)
	tags, err := api.ListQueueTags(ctx, &awssqs.ListQueueTagsInput{QueueUrl: aws.String(url)})
	// Unreadable tags prove nothing: the queue is then not ours to remove.
	return url, err == nil && tags.Tags[creatorTag] == token, nil
}

// removeDeadLetter deletes the dead-letter queue at url that create made
// (ours) for a queue it then failed to create, unless it holds messages or
// the queue exists after all with it as its dead-letter target (another
// process created both meanwhile): then it stays, and the error says so.
// ctx may be the one that ran out; the removal gets its own bound.
func (q *queue) removeDeadLetter(ctx context.Context, api createAPI, url, arn string, ours bool) error {
	if !ours {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	kept := func(why string, err error) error {
		if err != nil {
			return fmt.Errorf("dedupq/sqs: the dead-letter queue %s, created for this open, is left in place: %s: %w", url, why, err)
		}
		return fmt.Errorf("dedupq/sqs: the dead-letter queue %s, created for this open, is left in place: %s", url, why)
	}
	if main, err := q.lookup(ctx, q.name); err != nil {
		return kept("looking for its queue", err)
	} else if main != "" {
		info, err := readQueue(ctx, api, main)
		if err != nil || info.DeadLetterTargetARN == arn {
			return kept("its queue exists and may use it", err)
		}
	}
	out, err := api.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		return kept("reading it", err)
	}
	for _, n := range out.Attributes {
		if n != "0" {
			return kept("it holds messages", nil)
		}
	}
	if _, err := api.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
		return kept("deleting it", err)
	}
	return nil
}
