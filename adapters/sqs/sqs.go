package sqs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/recent"
	"github.com/dedupq/dedupq/window"
)

// Backend is the name the adapter gives in windows and errors.
const Backend = "sqs"

// DedupWindow is how long SQS FIFO remembers a MessageDeduplicationId.
const DedupWindow = 5 * time.Minute

const (
	// maxBatch is SQS's limit on entries per batch request.
	maxBatch = 10
	// maxBatchBytes is SQS's limit on the sum of a batch's message sizes.
	maxBatchBytes = 1 << 20
	// maxVisibility is SQS's longest visibility timeout, 12 hours.
	maxVisibility = 12 * time.Hour
	// maxWait is SQS's longest long-poll wait.
	maxWait = 20 * time.Second
	// minWait is SQS's shortest long-poll wait ("1 second minimum": SQS
	// Developer Guide, "Setting-up long polling").
	minWait = time.Second
	// receiveSlack is the time a receive leaves between the end of its
	// wait and its context's deadline, for SQS's answer to arrive: the
	// SDK's documentation asks for a response timeout longer than
	// WaitTimeSeconds.
	receiveSlack = 500 * time.Millisecond
	// defaultMaxMessageBytes is used only if the queue does not report
	// MaximumMessageSize: the limit before August 2025.
	defaultMaxMessageBytes = 256 << 10
)

// sqsAPI is the part of *sqs.Client the adapter uses, a seam for the tests'
// wrappers (export_test.go). SendMessage serves only Terminate's move to
// the dead-letter queue.
type sqsAPI interface {
	SendMessageBatch(ctx context.Context, in *awssqs.SendMessageBatchInput, optFns ...func(*awssqs.Options)) (*awssqs.SendMessageBatchOutput, error)
	ReceiveMessage(ctx context.Context, in *awssqs.ReceiveMessageInput, optFns ...func(*awssqs.Options)) (*awssqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, optFns ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *awssqs.ChangeMessageVisibilityInput, optFns ...func(*awssqs.Options)) (*awssqs.ChangeMessageVisibilityOutput, error)
	GetQueueAttributes(ctx context.Context, in *awssqs.GetQueueAttributesInput, optFns ...func(*awssqs.Options)) (*awssqs.GetQueueAttributesOutput, error)
	GetQueueUrl(ctx context.Context, in *awssqs.GetQueueUrlInput, optFns ...func(*awssqs.Options)) (*awssqs.GetQueueUrlOutput, error)
	SendMessage(ctx context.Context, in *awssqs.SendMessageInput, optFns ...func(*awssqs.Options)) (*awssqs.SendMessageOutput, error)
}

// Options configure a Topic or Subscription. The zero value is usable.
type Options struct {
	// DefaultGroup is the MessageGroupId of messages published without a
	// GroupKey. Empty means such messages are refused before sending, as
	// SQS FIFO would refuse them. Consumers given the same DefaultGroup
	// report messages of that group with an empty GroupKey.
	DefaultGroup string
	// HashLongIDs sends IDs that SQS cannot take (longer than 128
	// characters, or with other characters) as HashID(ID) instead of
	// refusing them. See the package doc.
	HashLongIDs bool
	// VisibilityTimeout overrides the queue's visibility timeout for
	// messages this subscription receives. Zero means the queue's. It is
	// also the VisibilityTimeout of a queue Create makes (zero:
	// DefaultCreateVisibilityTimeout).
	VisibilityTimeout time.Duration
	// WaitTime is the long-poll wait of each ReceiveMessage call, from 1 s
	// (SQS's shortest long poll) to 20 s, in whole seconds (rounded down).
	// Zero means 20 s. A Receive shortens it to end before its context's
	// deadline.
	WaitTime time.Duration
	// NackBackoff holds the delays before the 2nd, 3rd, … delivery after a
	// failed handler (the last repeats); it becomes the redelivery
	// policy's Backoff. Empty means a failed message is visible again at
	// once.
	NackBackoff []time.Duration
	// TerminateDeletes makes Terminate delete the message even when the
	// queue has a RedrivePolicy, instead of moving it to the dead-letter
	// queue.
	TerminateDeletes bool
	// DeleteLinger is how long an Ack waits for others to share its
	// DeleteMessageBatch. Zero means 5 ms; negative means no waiting.
	DeleteLinger time.Duration
	// Create, for emulators only, makes a queue that does not exist: a FIFO
	// dead-letter queue named DeadLetterName(queue), then the FIFO queue
	// with VisibilityTimeout and a RedrivePolicy of MaxReceiveCount to it.
	// Nothing is created while opening, only by Provision, once the startup
	// check passed (see driver.Provisioner). A queue that exists is never
	// changed: it must have a RedrivePolicy. The queue must be given by
	// name; a client without a BaseEndpoint, or with one of AWS's, is
	// refused: on AWS, queues are made with infrastructure as code. See
	// the package doc.
	Create bool
	// MaxReceiveCount is the RedrivePolicy maxReceiveCount (1–1000) of a
	// queue Create makes; zero means DefaultMaxReceiveCount. On a queue
	// that exists, a non-zero value must equal its maxReceiveCount.
	MaxReceiveCount int
}

func (o *Options) orZero() Options {
	if o == nil {
		return Options{}
	}
	return *o
}

// ErrClosed is returned by a Topic or Subscription used after Close.
var ErrClosed = errors.New("dedupq/sqs: closed")

// ErrNotFIFO is matched by the error for a queue that is not a FIFO queue.
var ErrNotFIFO = errors.New("not a FIFO queue")

// QueueInfo is what the adapter read from the queue's attributes.
type QueueInfo struct {
	// URL is the queue URL; empty for a queue Options.Create has yet to
	// create.
	URL string
	// FIFO is the FifoQueue attribute.
	FIFO bool
	// ContentBasedDeduplication is the attribute of that name. dedupq
	// always sends an explicit MessageDeduplicationId, which overrides it.
	ContentBasedDeduplication bool
	// DeduplicationScope is "queue" or "messageGroup".
	DeduplicationScope string
	// FifoThroughputLimit is "perQueue" or "perMessageGroupId".
	FifoThroughputLimit string
	// MaxMessageBytes is MaximumMessageSize.
	MaxMessageBytes int
	// VisibilityTimeout is the queue's default visibility timeout.
	VisibilityTimeout time.Duration
	// MaxReceiveCount is RedrivePolicy.maxReceiveCount; zero when the queue
	// has no redrive policy.
	MaxReceiveCount int
	// DeadLetterTargetARN is RedrivePolicy.deadLetterTargetArn.
	DeadLetterTargetARN string
}

// Window is the dedup window this queue gives. Its Source is
// SourceDiscovered because what shapes it (FifoQueue, DeduplicationScope)
// was read from the queue; the 5-minute length itself is SQS's documented
// constant, which no attribute exposes. A queue Options.Create has yet to
// make (no URL) was read from nowhere: SourceDocumented, "to be created".
func (q QueueInfo) Window() window.Window {
	scope := "queue"
	if q.DeduplicationScope == "messageGroup" {
		scope = "message group"
	}
	src := window.SourceDiscovered
	if q.URL == "" {
		src, scope = window.SourceDocumented, scope+", to be created"
	}
	return window.Window{
		Backend: Backend, Duration: DedupWindow, Kind: window.KindFixed,
		Source: src, Scope: scope,
		// The window is fixed by AWS: no setting changes it.
		Settings: window.Settings{
			AckWait:       "the visibility timeout (the queue's VisibilityTimeout, or Options.VisibilityTimeout, URL parameter ack_wait, which overrides it)",
			MaxDeliveries: "the maxReceiveCount of the queue's redrive policy (URL parameter max_deliveries when create=true makes the queue)",
			Backoff:       "Options.NackBackoff (URL parameter backoff)",
		},
	}
}

var queueAttributeNames = []types.QueueAttributeName{
	types.QueueAttributeNameFifoQueue,
	types.QueueAttributeNameContentBasedDeduplication,
	types.QueueAttributeNameDeduplicationScope,
	types.QueueAttributeNameFifoThroughputLimit,
	types.QueueAttributeNameMaximumMessageSize,
	types.QueueAttributeNameVisibilityTimeout,
	types.QueueAttributeNameRedrivePolicy,
}

// readQueue reads and checks the queue's attributes. It fails with an error
// matching ErrNotFIFO for a standard queue, which does not deduplicate.
func readQueue(ctx context.Context, api sqsAPI, url string) (QueueInfo, error) {
	out, err := api.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: queueAttributeNames,
	})
	if err != nil {
		return QueueInfo{}, fmt.Errorf("dedupq/sqs: reading the attributes of %s: %w", url, err)
	}
	return parseQueueInfo(url, out.Attributes)
}

func parseQueueInfo(url string, a map[string]string) (QueueInfo, error) {
	q := QueueInfo{
		URL:                       url,
		FIFO:                      a["FifoQueue"] == "true",
		ContentBasedDeduplication: a["ContentBasedDeduplication"] == "true",
		DeduplicationScope:        a["DeduplicationScope"],
		FifoThroughputLimit:       a["FifoThroughputLimit"],
		MaxMessageBytes:           defaultMaxMessageBytes,
	}
	if !q.FIFO {
		return q, fmt.Errorf("dedupq/sqs: queue %s is %w (FifoQueue is %q): a standard queue does not deduplicate, so every resend would be delivered again; use a FIFO queue (name ending in .fifo, created with FifoQueue=true)",
			url, ErrNotFIFO, a["FifoQueue"])
	}
	if q.DeduplicationScope == "" {
		q.DeduplicationScope = "queue"
	}
	if v, ok := a["MaximumMessageSize"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return q, fmt.Errorf("dedupq/sqs: queue %s: MaximumMessageSize %q is not a positive number", url, v)
		}
		q.MaxMessageBytes = n
	}
	if v, ok := a["VisibilityTimeout"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return q, fmt.Errorf("dedupq/sqs: queue %s: VisibilityTimeout %q is not a number of seconds", url, v)
		}
		q.VisibilityTimeout = time.Duration(n) * time.Second
	}
	if v := a["RedrivePolicy"]; v != "" {
		// maxReceiveCount is a number in AWS's JSON and a string in some
		// tools' output: accept both.
		var rp struct {
			MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
			DeadLetterTargetArn string          `json:"deadLetterTargetArn"`
		}
		if err := json.Unmarshal([]byte(v), &rp); err != nil {
			return q, fmt.Errorf("dedupq/sqs: queue %s: RedrivePolicy is not JSON: %w", url, err)
		}
		n, err := strconv.Atoi(strings.Trim(string(rp.MaxReceiveCount), `"`))
		if err != nil || n <= 0 {
			return q, fmt.Errorf("dedupq/sqs: queue %s: RedrivePolicy maxReceiveCount %s is not a positive number", url, rp.MaxReceiveCount)
		}
		q.MaxReceiveCount, q.DeadLetterTargetARN = n, rp.DeadLetterTargetArn
	}
	return q, nil
}

// resolveQueueURL returns nameOrURL if it is a queue URL, else asks SQS for
// the URL of the queue with that name.
func resolveQueueURL(ctx context.Context, api sqsAPI, nameOrURL string) (string, error) {
	if strings.Contains(nameOrURL, "://") {
		return nameOrURL, nil
	}
	out, err := api.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(nameOrURL)})
	if err != nil {
		return "", fmt.Errorf("dedupq/sqs: looking up queue %q: %w", nameOrURL, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// limits are what the portable layer validates against.
func limits(o Options, q QueueInfo) driver.Limits {
	l := driver.Limits{
		MaxIDLength:     MaxIDLength,
		IDAllowed:       validIDChar,
		MaxMessageBytes: q.MaxMessageBytes,
		// One slot each for the markers the adapter may add.
		MaxAttributes:        MaxAttributes - 1,
		GroupKeyRequired:     o.DefaultGroup == "",
		MaxGroupKeyLength:    MaxIDLength,
		GroupKeyAllowed:      validIDChar,
		AttributeNameAllowed: validAttrName,
	}
	if o.HashLongIDs {
		l.MaxIDLength, l.IDAllowed = 0, nil
		l.MaxAttributes--
	}
	return l
}

// Topic is a driver.Topic that sends to one SQS FIFO queue. It is safe for
// concurrent use.
type Topic struct {
	api  sqsAPI
	opts Options
	seen recent.IDs
	q    *queue

	mu     sync.Mutex
	closed bool
	conns  *ownedConns // the client's connections, when the URL opener made it
}

var (
	_ driver.Topic       = (*Topic)(nil)
	_ driver.Provisioner = (*Topic)(nil)
)

// OpenTopic opens the FIFO queue queueURL (a URL or a queue name) for
// publishing. It reads the queue's attributes and fails with an error
// matching ErrNotFIFO for a standard queue. With Options.Create a missing
// queue is created by Provision; until then QueueInfo and Window report it
// as it will be created. To trace or otherwise wrap the client's requests,
// give it the SDK's own middleware (sqs.Options.APIOptions).
func OpenTopic(ctx context.Context, client *awssqs.Client, queueURL string, opts *Options) (*Topic, error) {
	return openTopic(ctx, client, queueURL, opts)
}

func openTopic(ctx context.Context, api sqsAPI, queueURL string, opts *Options) (*Topic, error) {
	o := opts.orZero()
	if o.DefaultGroup != "" && !validID(o.DefaultGroup) {
		return nil, fmt.Errorf("dedupq/sqs: DefaultGroup %q is not a valid MessageGroupId (at most %d ASCII letters, digits and punctuation)", o.DefaultGroup, MaxIDLength)
	}
	q, err := openQueue(ctx, api, queueURL, o)
	if err != nil {
		return nil, err
	}
	return &Topic{api: api, opts: o, q: q}, nil
}

// QueueInfo is the queue's attributes as last read; with Options.Create,
// before Provision created the queue, the queue as it will be created
// (with an empty URL).
func (t *Topic) QueueInfo() QueueInfo { return t.q.current() }

// Provision creates the queue and its dead-letter queue when Options.Create
// asks for them and they are missing; otherwise it does nothing. See
// Options.Create and driver.Provisioner.
func (t *Topic) Provision(ctx context.Context) error { return t.q.create(ctx) }

// MaxBatch is SQS's limit of 10 entries per SendMessageBatch.
func (t *Topic) MaxBatch() int { return maxBatch }

// Limits are SQS's rules for IDs, group keys and attribute names, and the
// queue's MaximumMessageSize as last read.
func (t *Topic) Limits() driver.Limits {
	info := t.QueueInfo()
	l := limits(t.opts, info)
	// The wire size (encoded body, attribute names and types) depends on
	// the encoding: measure it as SendBatch will send it, so that an
	// oversize message is refused before its batch is sent.
	l.Check = func(m *driver.Message) (string, error) {
		_, err := t.measure(m, info.MaxMessageBytes)
		if errors.Is(err, ErrTooLarge) {
			return "Body", err
		}
		return "Message", err
	}
	return l
}

// Window reads the queue's attributes again and reports the 5-minute
// window with the queue's dedup scope.
func (t *Topic) Window(ctx context.Context) (window.Window, error) {
	info, err := t.q.refresh(ctx)
	if err != nil {
		return window.Window{}, err
	}
	return info.Window(), nil
}

// HiddenRetrySpan is zero: SendMessageBatch is made with the SDK's retries
// turned off, so the SDK never resends a message inside one SendBatch.
func (t *Topic) HiddenRetrySpan() time.Duration { return 0 }

// noSDKRetries makes one SendMessageBatch exactly one HTTP request, so
// that every resend is the Publisher's and counted in its span. It
// replaces the per-call Retryer whatever the client was built with (the
// SDK re-wraps a per-call Retryer only when the call also changes
// RetryMaxAttempts, which this leaves alone).
func noSDKRetries(o *awssqs.Options) { o.Retryer = aws.NopRetryer{} }

// EntryError is SQS's answer for one failed entry of a SendMessageBatch or
// DeleteMessageBatch.
type EntryError struct {
	// Code is SQS's error code, such as "InvalidParameterValue".
	Code string
	// Message is SQS's explanation.
	Message string
	// SenderFault is true when SQS blames the request: resending it
	// unchanged fails again.
	SenderFault bool
}

// Error names the code and whose fault SQS says it was, which decides
// whether a resend can help.
func (e *EntryError) Error() string {
	who := "service"
	if e.SenderFault {
		who = "sender"
	}
	return fmt.Sprintf("sqs: %s: %s (%s fault)", e.Code, e.Message, who)
}

// ErrTooLarge is matched by the error for a message that is larger than the
// queue's MaximumMessageSize once encoded for SQS (with its attribute data
// types and the adapter's markers). It is not sent.
var ErrTooLarge = errors.New("message too large for the queue")

// refused is an error the adapter raises before sending: the message was
// not sent, and resending cannot help.
type refused struct{ err error }

func (e *refused) Error() string { return e.err.Error() }
func (e *refused) Unwrap() error { return e.err }

// SendBatch sends msgs with SendMessageBatch, one request per 10 entries
// and 1 MiB, and returns SQS's answer for each. Failures are reported per
// message, never for the call as a whole, because with more than one
// request some messages may be known stored while others failed. The one
// exception is a queue Options.Create asks for that cannot be created
// (see Provision): then nothing was sent.
//
// SQS answers a send it dropped as a duplicate with the MessageId of the
// message it kept, and says nothing more; so SendResult.Duplicate is true
// when the MessageId is one this Topic was already given within the last
// 5 minutes (for up to recent.DefaultMax messages). A duplicate of a message another
// process or Topic sent is reported as a plain success.
func (t *Topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	// Used without dedupq.NewPublisher, which provisions first.
	info, err := t.q.ensure(ctx)
	if err != nil {
		return nil, err
	}
	results := make([]driver.SendResult, len(msgs))
	var chunk []types.SendMessageBatchRequestEntry
	var index []int // chunk entry → message index
	chunkBytes := 0
	flush := func() {
		if len(chunk) > 0 {
			t.send(ctx, info.URL, chunk, index, results)
		}
		chunk, index, chunkBytes = nil, nil, 0
	}
	// The entries' string fields point into one array, not each into a
	// string of its own.
	strs := make([]string, entryStrings*len(msgs))
	for i, m := range msgs {
		e, size, err := t.entry(i, m, info.MaxMessageBytes, strs[entryStrings*i:entryStrings*(i+1)])
		if err != nil {
			results[i].Err = &refused{err}
			continue
		}
		if len(chunk) == maxBatch || chunkBytes+size > maxBatchBytes {
			flush()
		}
		if chunk == nil {
			n := min(maxBatch, len(msgs)-i)
			chunk, index = make([]types.SendMessageBatchRequestEntry, 0, n), make([]int, 0, n)
		}
		chunk, index, chunkBytes = append(chunk, e), append(index, i), chunkBytes+size
	}
	flush()
	return results, nil
}

// wireMessage is what entry sends for a message, as measure found it.
type wireMessage struct {
	group, id string
	hashed    bool   // id is HashID of the message's ID
	enc       string // the body's AttrBody marker; "" for a text body
	size      int    // as SQS counts it
}

// entryStrings is the number of strings entry points its entry's fields
// at.
const entryStrings = 4

// measure checks message m and sizes it as SQS counts it once encoded
// (what entry builds), without building it: Limits.Check runs it on every
// message, and SendBatch again through entry.
func (t *Topic) measure(m *driver.Message, maxBytes int) (wireMessage, error) {
	w := wireMessage{group: m.GroupKey}
	if w.group == "" {
		w.group = t.opts.DefaultGroup
	}
	if !validID(w.group) {
		return w, fmt.Errorf("dedupq/sqs: message %q: MessageGroupId %q is not valid (SQS FIFO requires one of at most %d ASCII letters, digits and punctuation; set a GroupKey or Options.DefaultGroup)", m.ID, w.group, MaxIDLength)
	}
	w.id, w.hashed = wireID(m.ID, t.opts.HashLongIDs)
	if !validID(w.id) {
		return w, fmt.Errorf("dedupq/sqs: message %q: not a valid MessageDeduplicationId (at most %d ASCII letters, digits and punctuation; Options.HashLongIDs maps other IDs to a hash)", m.ID, MaxIDLength)
	}
	n := len(m.Attributes)
	for k, v := range m.Attributes {
		if !validAttrName(k) {
			return w, fmt.Errorf("dedupq/sqs: message %q: attribute name %q is not accepted by SQS or is reserved", m.ID, k)
		}
		w.size += valueWireSize(k, v)
	}
	var bodySize int
	bodySize, w.enc = bodyWireSize(m.Body)
	w.size += bodySize
	if w.enc != "" {
		n++
		w.size += valueWireSize(AttrBody, w.enc)
	}
	if w.hashed {
		n++
		w.size += valueWireSize(AttrID, m.ID)
	}
	if n > MaxAttributes {
		return w, fmt.Errorf("dedupq/sqs: message %q: %d message attributes with the adapter's own, SQS accepts at most %d", m.ID, n, MaxAttributes)
	}
	if w.size > maxBytes {
		return w, fmt.Errorf("dedupq/sqs: message %q is %d bytes as SQS counts it (encoded body plus attribute names, types and values), the queue's MaximumMessageSize is %d: %w",
			m.ID, w.size, maxBytes, ErrTooLarge)
	}
	return w, nil
}

// entry builds the batch entry for message i and reports its size as SQS
// counts it. The entry's string fields point into strs (entryStrings
// long), which must outlive it.
func (t *Topic) entry(i int, m *driver.Message, maxBytes int, strs []string) (types.SendMessageBatchRequestEntry, int, error) {
	w, err := t.measure(m, maxBytes)
	if err != nil {
		return types.SendMessageBatchRequestEntry{}, 0, err
	}
	enc := w.enc
	strs[0], strs[1], strs[2], strs[3] = strconv.Itoa(i), encodeBodyAs(m.Body, enc), w.id, w.group
	e := types.SendMessageBatchRequestEntry{
		Id:                     &strs[0],
		MessageBody:            &strs[1],
		MessageDeduplicationId: &strs[2],
		MessageGroupId:         &strs[3],
	}
	if len(m.Attributes) > 0 || enc != "" || w.hashed {
		attrs := make(map[string]types.MessageAttributeValue, len(m.Attributes)+2)
		for k, v := range m.Attributes {
			attrs[k] = encodeAttr(v)
		}
		if enc != "" {
			attrs[AttrBody] = encodeAttr(enc)
		}
		if w.hashed {
			attrs[AttrID] = encodeAttr(m.ID)
		}
		e.MessageAttributes = attrs
	}
	return e, w.size, nil
}

// send makes one SendMessageBatch request and records each entry's result.
func (t *Topic) send(ctx context.Context, url string, entries []types.SendMessageBatchRequestEntry, index []int, results []driver.SendResult) {
	out, err := t.api.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}, noSDKRetries)
	if err != nil {
		for _, i := range index {
			results[i].Err = err
		}
		return
	}
	answered := make([]bool, len(entries))
	now := time.Now()
	// Keyed by the MessageId SQS answers with, which repeats only when SQS
	// kept an earlier message for this dedup ID (in its group, for a
	// messageGroup-scoped queue): every FIFO queue deduplicates, with or
	// without content-based deduplication, since the adapter always sets
	// MessageDeduplicationId.
	w := t.QueueInfo().Window()
	for _, s := range out.Successful {
		if j, ok := entryIndex(s.Id, index); ok {
			i := index[j]
			results[i].BackendID = aws.ToString(s.MessageId)
			results[i].Duplicate = t.seen.Observe(results[i].BackendID, now, w)
			answered[j] = true
		}
	}
	for _, f := range out.Failed {
		if j, ok := entryIndex(f.Id, index); ok {
			results[index[j]].Err = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}
			answered[j] = true
		}
	}
	for j := range entries {
		if !answered[j] {
			// Without an answer the message may or may not be stored:
			// a resend with the same ID is the safe choice.
			results[index[j]].Err = errors.New("sqs: SendMessageBatch returned no result for this entry")
		}
	}
}

// entryIndex maps a batch entry Id (the message's index) back to the
// entry's position in this request, checking that it was in it.
func entryIndex(id *string, index []int) (int, bool) {
	i, err := strconv.Atoi(aws.ToString(id))
	if err != nil {
		return 0, false
	}
	for j, k := range index {
		if k == i {
			return j, true
		}
	}
	return 0, false
}

// IsRetryable reports whether a send error may succeed on a resend. Only
// answers in which SQS refused the request (a client fault other than
// throttling, a sender-fault entry) and the adapter's own refusals are
// final; transport errors, timeouts and server faults are retryable, since
// the message may have been stored.
func (t *Topic) IsRetryable(err error) bool { return isRetryable(err) }

// Close marks the topic closed and, for a topic opened by URL, closes the
// keep-alive connections of the SDK client the opener made; a client given
// to OpenTopic is the caller's.
func (t *Topic) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.conns.close()
	return nil
}

// throttling lists the codes SQS uses for "slow down": client faults, yet
// retryable.
var throttling = map[string]bool{
	"RequestThrottled": true, "ThrottlingException": true, "Throttling": true,
	"KmsThrottled": true, "SlowDown": true, "TooManyRequestsException": true,
}

func isRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var r *refused
	var dl *DeadLetterError
	if errors.As(err, &r) || errors.As(err, &dl) || errors.Is(err, ErrClosed) {
		return false
	}
	var ee *EntryError
	if errors.As(err, &ee) {
		return !ee.SenderFault || throttling[ee.Code]
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch {
		case throttling[api.ErrorCode()]:
			return true
		case api.ErrorFault() == smithy.FaultClient:
			return false
		case api.ErrorFault() == smithy.FaultServer:
			return true
		}
	}
	// Unmodeled errors carry no fault: SQS answers a refused request with
	// a 4xx status.
	var status interface{ HTTPStatusCode() int }
	if errors.As(err, &status) {
		code := status.HTTPStatusCode()
		return !(code >= 400 && code < 500 && code != 408 && code != 429)
	}
	return true
}
