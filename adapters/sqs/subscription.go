package sqs

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// Subscription is a driver.Subscription that receives from one SQS FIFO
// queue. It is safe for concurrent use.
type Subscription struct {
	api  sqsAPI
	opts Options
	del  *deleter
	q    *queue

	mu     sync.Mutex
	closed bool
	dlqARN string // the dead-letter target dlqURL was resolved for
	dlqURL string
	dlqMax int         // the dead-letter queue's MaximumMessageSize; 0 until read
	conns  *ownedConns // the client's connections, when the URL opener made it
}

var (
	_ driver.Subscription = (*Subscription)(nil)
	_ driver.Provisioner  = (*Subscription)(nil)
	_ driver.GroupOrderer = (*Subscription)(nil)
)

// OpenSubscription opens the FIFO queue queueURL (a URL or a queue name)
// for consuming. It reads the queue's attributes and fails with an error
// matching ErrNotFIFO for a standard queue. With Options.Create a missing
// queue is created by Provision; until then QueueInfo, Window and
// Redelivery report it as it will be created. See OpenTopic for wrapping
// the client.
func OpenSubscription(ctx context.Context, client *awssqs.Client, queueURL string, opts *Options) (*Subscription, error) {
	return openSubscription(ctx, client, queueURL, opts)
}

func openSubscription(ctx context.Context, api sqsAPI, queueURL string, opts *Options) (*Subscription, error) {
	o := opts.orZero()
	if o.WaitTime < 0 || o.WaitTime > maxWait {
		return nil, fmt.Errorf("dedupq/sqs: WaitTime %s is outside SQS's 0–20s", o.WaitTime)
	}
	if o.WaitTime > 0 && o.WaitTime < minWait {
		return nil, fmt.Errorf("dedupq/sqs: WaitTime %s is under SQS's shortest long poll of 1s (a WaitTimeSeconds of 0 is left out of the request, and the queue's ReceiveMessageWaitTimeSeconds applies): use 1s to 20s, or 0 for 20s", o.WaitTime)
	}
	for _, d := range o.NackBackoff {
		if d < 0 || d > maxVisibility {
			return nil, fmt.Errorf("dedupq/sqs: NackBackoff %s is outside SQS's 0–12h", d)
		}
	}
	if o.WaitTime == 0 {
		o.WaitTime = maxWait
	}
	if o.DeleteLinger == 0 {
		o.DeleteLinger = 5 * time.Millisecond
	}
	q, err := openQueue(ctx, api, queueURL, o)
	if err != nil {
		return nil, err
	}
	s := &Subscription{api: api, opts: o, q: q}
	s.del = newDeleter(api, func() string { return q.current().URL }, max(o.DeleteLinger, 0))
	return s, nil
}

// QueueInfo is the queue's attributes as last read; with Options.Create,
// before Provision created the queue, the queue as it will be created
// (with an empty URL).
func (s *Subscription) QueueInfo() QueueInfo { return s.q.current() }

// Provision creates the queue and its dead-letter queue when Options.Create
// asks for them and they are missing; otherwise it does nothing. See
// Options.Create and driver.Provisioner.
func (s *Subscription) Provision(ctx context.Context) error { return s.q.create(ctx) }

// OrdersGroups reports nil: a FIFO queue hands out a message group's
// messages in order, none while an earlier one of the group is in flight,
// though one receive may return several of a group (driver.GroupOrderer).
func (s *Subscription) OrdersGroups(context.Context) error { return nil }

// Window reads the queue's attributes again and reports the 5-minute
// window with the queue's dedup scope.
func (s *Subscription) Window(ctx context.Context) (window.Window, error) {
	info, err := s.q.refresh(ctx)
	if err != nil {
		return window.Window{}, err
	}
	return info.Window(), nil
}

// Redelivery reads the queue's attributes again and reports its real
// redelivery policy: the visibility timeout (or Options.VisibilityTimeout)
// as AckWait, RedrivePolicy.maxReceiveCount as MaxDeliveries (unlimited
// without a redrive policy) and Options.NackBackoff.
func (s *Subscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	info, err := s.q.refresh(ctx)
	if err != nil {
		return window.RedeliveryPolicy{}, err
	}
	return window.RedeliveryPolicy{
		MaxDeliveries: info.MaxReceiveCount,
		AckWait:       s.lease(info),
		Backoff:       append([]time.Duration(nil), s.opts.NackBackoff...),
	}, nil
}

func (s *Subscription) lease(info QueueInfo) time.Duration {
	if s.opts.VisibilityTimeout > 0 {
		return s.opts.VisibilityTimeout
	}
	return info.VisibilityTimeout
}

// allAttributes asks a receive for every message attribute; the SDK only
// reads it.
var allAttributes = []string{"All"}

var systemAttributes = []types.MessageSystemAttributeName{
	types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameMessageDeduplicationId,
	types.MessageSystemAttributeNameMessageGroupId,
}

// Receive long-polls until at least one message arrives or ctx is done.
// Each poll sends its wait explicitly: Options.WaitTime in whole seconds,
// shortened so that the answer is due receiveSlack before ctx's deadline.
// A receive cut short after SQS has handed it messages would hide them
// for a visibility timeout and count a receive nobody saw, toward
// maxReceiveCount. With less than 1s (SQS's shortest long poll) plus
// receiveSlack left, Receive sends nothing and returns at the deadline: a
// wait of 0 cannot be sent (the SDK leaves a zero WaitTimeSeconds out, and
// the queue's ReceiveMessageWaitTimeSeconds, often 20s, applies).
func (s *Subscription) Receive(ctx context.Context, maxMessages int) ([]*driver.Delivery, error) {
	maxMessages = min(max(maxMessages, 1), maxBatch)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		// Used without dedupq.NewConsumer, which provisions first.
		info, err := s.q.ensure(ctx)
		if err != nil {
			return nil, err
		}
		wait := s.opts.WaitTime
		if dl, ok := ctx.Deadline(); ok {
			wait = min(wait, time.Until(dl)-receiveSlack)
		}
		if wait < minWait {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		in := &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(info.URL),
			MaxNumberOfMessages:         int32(maxMessages),
			WaitTimeSeconds:             int32(wait / time.Second),
			MessageSystemAttributeNames: systemAttributes,
			MessageAttributeNames:       allAttributes,
			// The SDK resends this same input when it retries, so a
			// response lost on the way returns the same messages.
			ReceiveRequestAttemptId: attemptID(),
		}
		if s.opts.VisibilityTimeout > 0 {
			in.VisibilityTimeout = int32(s.opts.VisibilityTimeout / time.Second)
		}
		out, err := s.api.ReceiveMessage(ctx, in)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		if len(out.Messages) > 0 {
			return s.deliveries(out.Messages, s.lease(info)), nil
		}
	}
}

// attemptID is a random ReceiveRequestAttemptId, made in two allocations:
// the string and the pointer the input takes. It needs to be unique, not
// secret: 128 bits of the runtime's generator (seeded by the OS) do, and
// unlike a crypto/rand.Read buffer they stay off the heap also under the
// race detector.
func attemptID() *string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	var h [2 * len(b)]byte
	hex.Encode(h[:], b[:])
	id := string(h[:])
	return &id
}

// deliveries turns the messages of one receive back into what was
// published. The Deliveries and their handles come in one block for the
// receive rather than two allocations per message; the block stays in
// memory until the last of them is settled (ten messages at most).
func (s *Subscription) deliveries(ms []types.Message, lease time.Duration) []*driver.Delivery {
	block := make([]struct {
		d driver.Delivery
		r received
	}, len(ms))
	ds := make([]*driver.Delivery, len(ms))
	for i, m := range ms {
		b := &block[i]
		b.d, b.r = s.delivery(m, lease), received{receipt: aws.ToString(m.ReceiptHandle), msg: m}
		b.d.Handle = &b.r
		ds[i] = &b.d
	}
	return ds
}

// delivery turns a received SQS message back into what was published,
// without its Handle.
func (s *Subscription) delivery(m types.Message, lease time.Duration) driver.Delivery {
	msg := driver.Message{
		ID:       m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)],
		GroupKey: m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)],
	}
	if msg.GroupKey == s.opts.DefaultGroup {
		msg.GroupKey = ""
	}
	var enc string
	for k, a := range m.MessageAttributes {
		switch {
		case k == AttrID:
			msg.ID = decodeAttr(a)
		case k == AttrBody:
			enc = decodeAttr(a)
		case strings.HasPrefix(k, ReservedAttrPrefix) && !driver.Portable(k):
		default:
			if msg.Attributes == nil {
				msg.Attributes = make(map[string]string, len(m.MessageAttributes))
			}
			msg.Attributes[k] = decodeAttr(a)
		}
	}
	msg.Body = decodeBody(aws.ToString(m.Body), enc)
	attempt, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	if err != nil || attempt < 1 {
		attempt = 1
	}
	return driver.Delivery{Message: msg, Attempt: attempt, BackendID: aws.ToString(m.MessageId), Lease: lease}
}

// received is a Delivery's Handle: the receipt handle that settles it, and
// the message as SQS delivered it, which Terminate forwards to the
// dead-letter queue unchanged.
type received struct {
	receipt string
	msg     types.Message
}

func handleOf(d *driver.Delivery) (*received, error) {
	r, ok := d.Handle.(*received)
	if !ok || r.receipt == "" {
		return nil, errors.New("dedupq/sqs: delivery has no SQS receipt handle")
	}
	return r, nil
}

func handle(d *driver.Delivery) (string, error) {
	r, err := handleOf(d)
	if err != nil {
		return "", err
	}
	return r.receipt, nil
}

// Ack deletes the message. Acks made within Options.DeleteLinger of each
// other share one DeleteMessageBatch; each Ack returns its own entry's
// result.
func (s *Subscription) Ack(ctx context.Context, d *driver.Delivery) error {
	r, err := handleOf(d)
	if err != nil {
		return err
	}
	return s.del.delete(ctx, &r.receipt)
}

// Nack makes the message visible again after delay, rounded up to whole
// seconds and capped at 12 hours.
func (s *Subscription) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	return s.setVisibility(ctx, d, delay)
}

// Extend sets the message's visibility timeout to by from now, rounded up
// to whole seconds and capped at 12 hours (SQS also caps the total at 12
// hours from the first receive).
func (s *Subscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	return s.setVisibility(ctx, d, max(by, time.Second))
}

// Terminate stops redelivery of the message. SQS has no call that
// dead-letters a message at once, and leaving it to the redrive policy
// would hand it to the handler again up to maxReceiveCount times; so on a
// queue with a RedrivePolicy the adapter moves the message itself: it
// sends it to the dead-letter queue unchanged (same body, attributes,
// group and MessageDeduplicationId, so that a repeated move within 5
// minutes is dropped as a duplicate) plus a ReasonAttr attribute, cut to
// the room the dead-letter queue's MaximumMessageSize leaves (left out
// when there is none), then deletes it. On a queue without one, or with
// Options.TerminateDeletes, it deletes the message.
//
// The move needs sqs:SendMessage on the dead-letter queue (and, on an
// SSE-KMS one, kms:GenerateDataKey and kms:Decrypt on its key), and a
// message that fits the dead-letter queue's MaximumMessageSize. Without
// either, Terminate fails with a *DeadLetterError, which no retry cures
// (IsRetryable: false) and the message stays, for SQS's redrive to move
// after maxReceiveCount receives. Other failures (the dead-letter queue
// unreachable) are returned as they are, the message staying likewise.
func (s *Subscription) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	r, err := handleOf(d)
	if err != nil {
		return err
	}
	info := s.QueueInfo()
	if info.DeadLetterTargetARN == "" || s.opts.TerminateDeletes {
		return s.del.delete(ctx, &r.receipt)
	}
	id := aws.ToString(r.msg.MessageId)
	dlq, maxBytes, err := s.deadLetter(ctx, info.DeadLetterTargetARN, id)
	if err != nil {
		return err
	}
	size := receivedSize(r.msg)
	if size > maxBytes {
		return &DeadLetterError{MessageID: id, Queue: dlq,
			Fix: fmt.Sprintf("raise the dead-letter queue's MaximumMessageSize to at least this queue's (%d bytes)", info.MaxMessageBytes),
			Err: fmt.Errorf("the message is %d bytes as SQS counts them (body plus attribute names, types and values), over that queue's MaximumMessageSize of %d: %w", size, maxBytes, ErrTooLarge)}
	}
	attrs := maps.Clone(r.msg.MessageAttributes)
	if attrs == nil {
		attrs = map[string]types.MessageAttributeValue{}
	}
	if reason != nil && len(attrs) < MaxAttributes {
		if text := fitReason(reason.Error(), maxBytes-size); text != "" {
			attrs[ReasonAttr] = encodeAttr(text)
		}
	}
	in := &awssqs.SendMessageInput{
		QueueUrl:          aws.String(dlq),
		MessageBody:       r.msg.Body,
		MessageAttributes: attrs,
	}
	if g := r.msg.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]; g != "" {
		in.MessageGroupId = aws.String(g)
	}
	if mid := r.msg.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]; mid != "" {
		in.MessageDeduplicationId = aws.String(mid)
	}
	if _, err := s.api.SendMessage(ctx, in); err != nil {
		if accessDenied(err) {
			return &DeadLetterError{MessageID: id, Queue: dlq,
				Fix: "give the consumer's credentials sqs:SendMessage on the dead-letter queue (and kms:GenerateDataKey and kms:Decrypt on its key if it is SSE-KMS encrypted), or set Options.TerminateDeletes (terminate=delete) to delete instead",
				Err: err}
		}
		return fmt.Errorf("dedupq/sqs: moving message %s to the dead-letter queue %s: %w", id, dlq, err)
	}
	return s.del.delete(ctx, &r.receipt)
}

// DeadLetterError is a Terminate that cannot move its message to the
// dead-letter queue, for a reason no retry cures: the credentials may not
// send there, or the message is too large for that queue. The message was
// neither moved nor deleted: it is received again after its visibility
// timeout, and SQS's redrive policy moves it after maxReceiveCount
// receives.
type DeadLetterError struct {
	MessageID string // the message's SQS MessageId
	Queue     string // the dead-letter queue's URL
	Fix       string // what to change
	Err       error  // SQS's answer, or ErrTooLarge
}

func (e *DeadLetterError) Error() string {
	return fmt.Sprintf("dedupq/sqs: cannot move message %s to the dead-letter queue %s: %v; %s", e.MessageID, e.Queue, e.Err, e.Fix)
}

func (e *DeadLetterError) Unwrap() error { return e.Err }

// accessDenied reports whether SQS refused a call for the caller's
// permissions: AccessDenied, or a KMS refusal such as KmsAccessDenied, or
// any 403.
func accessDenied(err error) bool {
	var api smithy.APIError
	if errors.As(err, &api) && strings.Contains(api.ErrorCode(), "AccessDenied") {
		return true
	}
	var status interface{ HTTPStatusCode() int }
	return errors.As(err, &status) && status.HTTPStatusCode() == http.StatusForbidden
}

// receivedSize is a received message's size as SQS counts it against
// MaximumMessageSize: the body plus every message attribute's name, data
// type and value.
func receivedSize(m types.Message) int {
	n := len(aws.ToString(m.Body))
	for k, a := range m.MessageAttributes {
		n += len(k) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue)) + len(a.BinaryValue)
	}
	return n
}

// maxReasonBytes bounds the ReasonAttr value.
const maxReasonBytes = 256

// fitReason is reason cut so that the ReasonAttr attribute takes at most
// room bytes, or "" when not even a part of it fits.
func fitReason(reason string, room int) string {
	text := truncate(reason, maxReasonBytes)
	for text != "" {
		over := valueWireSize(ReasonAttr, text) - room
		if over <= 0 {
			return text
		}
		text = truncate(text, max(len(text)-over, 0))
	}
	return ""
}

// deadLetter resolves the redrive policy's target ARN
// (arn:PARTITION:sqs:REGION:ACCOUNT:NAME) to a queue URL, once, and reads
// its MaximumMessageSize, until it has read it once. Without permission
// to read it, the source queue's is assumed: a dead-letter queue is
// normally made like its source.
func (s *Subscription) deadLetter(ctx context.Context, arn, msgID string) (url string, maxBytes int, err error) {
	s.mu.Lock()
	if s.dlqARN == arn && s.dlqURL != "" && s.dlqMax > 0 {
		defer s.mu.Unlock()
		return s.dlqURL, s.dlqMax, nil
	}
	url = s.dlqURL
	if s.dlqARN != arn {
		url = ""
	}
	s.mu.Unlock()
	if url == "" {
		parts := strings.Split(arn, ":")
		if len(parts) != 6 || parts[2] != "sqs" || parts[5] == "" {
			return "", 0, fmt.Errorf("dedupq/sqs: dead-letter target %q is not an SQS queue ARN", arn)
		}
		in := &awssqs.GetQueueUrlInput{QueueName: aws.String(parts[5])}
		if parts[4] != "" {
			in.QueueOwnerAWSAccountId = aws.String(parts[4])
		}
		out, err := s.api.GetQueueUrl(ctx, in)
		if err != nil {
			if accessDenied(err) {
				return "", 0, &DeadLetterError{MessageID: msgID, Queue: arn,
					Fix: "give the consumer's credentials sqs:GetQueueUrl and sqs:SendMessage on the dead-letter queue, or set Options.TerminateDeletes (terminate=delete) to delete instead",
					Err: err}
			}
			return "", 0, fmt.Errorf("dedupq/sqs: looking up the dead-letter queue %s: %w", arn, err)
		}
		url = aws.ToString(out.QueueUrl)
	}
	maxBytes = s.QueueInfo().MaxMessageBytes
	read := 0
	out, err := s.api.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameMaximumMessageSize},
	})
	if err == nil {
		if n, perr := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameMaximumMessageSize)]); perr == nil && n > 0 {
			maxBytes, read = n, n
		}
	}
	s.mu.Lock()
	s.dlqARN, s.dlqURL, s.dlqMax = arn, url, read
	s.mu.Unlock()
	return url, maxBytes, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func (s *Subscription) setVisibility(ctx context.Context, d *driver.Delivery, after time.Duration) error {
	h, err := handle(d)
	if err != nil {
		return err
	}
	_, err = s.api.ChangeMessageVisibility(ctx, &awssqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(s.QueueInfo().URL), ReceiptHandle: aws.String(h),
		VisibilityTimeout: visibilitySeconds(after),
	})
	return err
}

// visibilitySeconds rounds d up to whole seconds within SQS's 0–12h, so
// that a message is never made visible earlier than asked.
func visibilitySeconds(d time.Duration) int32 {
	d = min(max(d, 0), maxVisibility)
	return int32((d + time.Second - 1) / time.Second)
}

// IsRetryable reports whether an error from Receive or a settle call is
// transient; see Topic.IsRetryable.
func (s *Subscription) IsRetryable(err error) bool { return isRetryable(err) }

// Close sends the acks still waiting for a batch, then marks the
// subscription closed and, for one opened by URL, closes the keep-alive
// connections of the SDK client the opener made. Unsettled deliveries become visible again after
// their visibility timeout.
func (s *Subscription) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.del.close()
	s.conns.close()
	return nil
}

// deleter coalesces concurrent acks into DeleteMessageBatch requests of up
// to 10 entries: the first pending ack waits up to linger for others, and a
// full batch goes at once. The acks of a batch share one allocation: its
// entries, results and the channel that says they are in, so that an ack
// costs no allocation of its own beyond what waiting on its context costs.
type deleter struct {
	api    sqsAPI
	url    func() string // the queue exists before anything is acked
	linger time.Duration

	mu    sync.Mutex
	cur   *deleteBatch // the batch acks join; nil when none is pending
	timer *time.Timer  // sends cur after linger; made once, then Reset
	wg    sync.WaitGroup
}

// deleteBatch is one DeleteMessageBatch request and its acks.
type deleteBatch struct {
	n       int // entries; not changed once the batch is sent
	entries [maxBatch]types.DeleteMessageBatchRequestEntry
	results [maxBatch]error // each entry's, read once done is closed
	done    chan struct{}

	// The request's context lives as long as the longest-lived waiting
	// ack's, so that one ack giving up does not fail the others: the last
	// ack to give up cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	live   int // acks still waiting; guarded by deleter.mu
}

// entryIDs are the batch entries' Ids, their index, shared by every
// request rather than formatted per entry.
var entryIDs = [maxBatch]string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}

func newDeleter(api sqsAPI, url func() string, linger time.Duration) *deleter {
	return &deleter{api: api, url: url, linger: linger}
}

// delete queues one receipt handle, which must not change, and waits for
// its entry's result, or for ctx. An error means SQS may not have deleted
// the message.
func (dl *deleter) delete(ctx context.Context, h *string) error {
	dl.mu.Lock()
	b := dl.cur
	if b == nil {
		b = &deleteBatch{done: make(chan struct{})}
		b.ctx, b.cancel = context.WithCancel(context.Background())
		dl.cur = b
		if dl.linger > 0 {
			// A timer that fired while this batch's predecessor was being
			// sent may still flush this one early: a smaller batch, never
			// a later one.
			if dl.timer == nil {
				dl.timer = time.AfterFunc(dl.linger, dl.flush)
			} else {
				dl.timer.Reset(dl.linger)
			}
		}
	}
	i := b.n
	b.entries[i] = types.DeleteMessageBatchRequestEntry{Id: &entryIDs[i], ReceiptHandle: h}
	b.n++
	b.live++
	if b.n == maxBatch || dl.linger <= 0 {
		dl.flushLocked()
	}
	dl.mu.Unlock()
	select {
	case <-b.done:
		return b.results[i]
	case <-ctx.Done():
		dl.mu.Lock()
		if b.live--; b.live == 0 {
			if dl.cur == b {
				// Unsent, and nobody waits for it any more: drop it, so
				// that the next ack starts a batch of its own instead of
				// joining one whose request is cancelled.
				dl.cur = nil
				if dl.timer != nil {
					dl.timer.Stop()
				}
			}
			b.cancel()
		}
		dl.mu.Unlock()
		return ctx.Err()
	}
}

func (dl *deleter) flush() {
	dl.mu.Lock()
	defer dl.mu.Unlock()
	dl.flushLocked()
}

// flushLocked starts sending the pending batch; dl.mu is held.
func (dl *deleter) flushLocked() {
	b := dl.cur
	if b == nil {
		return
	}
	dl.cur = nil
	if dl.timer != nil {
		dl.timer.Stop()
	}
	dl.wg.Add(1)
	go dl.send(b)
}

// send deletes one batch and hands each ack its entry's result.
func (dl *deleter) send(b *deleteBatch) {
	defer dl.wg.Done()
	defer close(b.done)
	defer b.cancel()
	out, err := dl.api.DeleteMessageBatch(b.ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(dl.url()), Entries: b.entries[:b.n]})
	if err != nil {
		for i := range b.n {
			b.results[i] = err
		}
		return
	}
	var answered [maxBatch]bool
	for _, s := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && i >= 0 && i < b.n {
			answered[i] = true
		}
	}
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < b.n {
			b.results[i], answered[i] = &EntryError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), SenderFault: f.SenderFault}, true
		}
	}
	for i := range b.n {
		if !answered[i] {
			b.results[i] = errors.New("sqs: DeleteMessageBatch returned no result for this entry")
		}
	}
}

// close sends what is pending and waits for every batch in flight.
func (dl *deleter) close() {
	dl.flush()
	dl.wg.Wait()
}
