package pubsub

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	gpubsub "cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// Backend is the name the adapter gives in windows and errors.
const Backend = "pubsub"

const (
	// AttrID is the message attribute that carries the dedup ID.
	AttrID = "dedupq-id"
	// ReservedAttrPrefix starts every attribute name the adapter reserves
	// for itself; user attributes may not start with it.
	ReservedAttrPrefix = "dedupq-"
)

// Pub/Sub's limits, as documented.
const (
	maxAttributes          = 100
	maxAttributeKeyBytes   = 256
	maxAttributeValueBytes = 1024
	maxOrderingKeyBytes    = 1024
	maxMessageBytes        = 10_000_000
	// maxRequestMessages is the most messages one Publish request takes.
	maxRequestMessages = gpubsub.MaxPublishRequestCount
	// maxRequestBytes is the most bytes one Publish request takes.
	maxRequestBytes = int(gpubsub.MaxPublishRequestBytes)
)

// Client defaults the adapter relies on.
const (
	defaultPublishTimeout = 60 * time.Second
	defaultMaxExtension   = 60 * time.Minute
	minAckExtension       = 10 * time.Second
	maxAckExtension       = 600 * time.Second
	// exactlyOnceAckExtension is the client's own floor for lease
	// extensions on exactly-once subscriptions.
	exactlyOnceAckExtension = 60 * time.Second
)

// Options configure a Topic or Subscription. The zero value is usable.
type Options struct {
	// PublishTimeout bounds one SendBatch's publish RPCs when its context
	// has no deadline; with a deadline, the deadline bounds them. Zero
	// means 60 s, the client's default.
	PublishTimeout time.Duration
	// AckExtension is the ack deadline the client sets on a message it
	// holds, on receipt and on each extension; it is also the lease the
	// Subscription reports (Delivery.Lease, RedeliveryPolicy.AckWait), the
	// longest a message waits before redelivery when its holder dies. Zero
	// means the subscription's AckDeadlineSeconds, raised to the client's
	// floor of 10 s (60 s on an exactly-once subscription). Pub/Sub and its
	// emulator take 10–600 s; shorter values work only on pstest, for fast
	// tests.
	AckExtension time.Duration
	// MaxExtension is how long after receipt the client stops extending a
	// message's lease (ReceiveSettings.MaxExtension). Zero means 60 min.
	MaxExtension time.Duration
	// MaxOutstandingMessages bounds the messages the client holds
	// unsettled, including those waiting to be handed to Receive. Zero
	// means 1000, the client's default.
	MaxOutstandingMessages int
}

func (o *Options) withDefaults() (Options, error) {
	var v Options
	if o != nil {
		v = *o
	}
	switch {
	case v.PublishTimeout < 0:
		return v, fmt.Errorf("dedupq/pubsub: PublishTimeout %s is negative", v.PublishTimeout)
	case v.AckExtension < 0 || v.AckExtension > maxAckExtension:
		return v, fmt.Errorf("dedupq/pubsub: AckExtension %s is outside Pub/Sub's 0–600s", v.AckExtension)
	case v.MaxExtension < 0:
		return v, fmt.Errorf("dedupq/pubsub: MaxExtension %s is negative", v.MaxExtension)
	case v.MaxOutstandingMessages < 0:
		return v, fmt.Errorf("dedupq/pubsub: MaxOutstandingMessages %d is negative", v.MaxOutstandingMessages)
	}
	if v.PublishTimeout == 0 {
		v.PublishTimeout = defaultPublishTimeout
	}
	if v.MaxExtension == 0 {
		v.MaxExtension = defaultMaxExtension
	}
	if v.MaxOutstandingMessages == 0 {
		v.MaxOutstandingMessages = gpubsub.DefaultReceiveSettings.MaxOutstandingMessages
	}
	return v, nil
}

// ErrClosed is returned by a Topic or Subscription used after Close.
var ErrClosed = errors.New("dedupq/pubsub: closed")

// ErrEarlierFailed is matched by the error of a message that was not sent
// because an earlier message with the same ordering key failed in the same
// attempt; sending it would have broken the key's order. It is retryable.
var ErrEarlierFailed = errors.New("not sent: an earlier message with the same ordering key failed")

// noRetry is a gax.Retryer that never retries, so that one Publish call is
// one RPC.
type noRetry struct{}

func (noRetry) Retry(error) (time.Duration, bool) { return 0, false }

// NewClient makes a Pub/Sub client for the adapter: the client's own
// retries of Publish are off (see the package doc), everything else is the
// client's default. With emulator set (host:port) it connects there without
// TLS or credentials; otherwise the client honours PUBSUB_EMULATOR_HOST and
// the standard Google credentials chain, and opts are passed on.
func NewClient(ctx context.Context, project, emulator string, opts ...option.ClientOption) (*gpubsub.Client, error) {
	if emulator != "" {
		opts = append([]option.ClientOption{
			option.WithEndpoint(emulator),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			option.WithoutAuthentication(),
			option.WithTelemetryDisabled(),
		}, opts...)
	}
	cfg := &gpubsub.ClientConfig{TopicAdminCallOptions: &vkit.TopicAdminCallOptions{
		Publish: []gax.CallOption{gax.WithRetry(func() gax.Retryer { return noRetry{} })},
	}}
	c, err := gpubsub.NewClientWithConfig(ctx, project, cfg, opts...)
	if err != nil {
		return nil, fmt.Errorf("dedupq/pubsub: creating a client for project %q: %w", project, err)
	}
	return c, nil
}

// publishRetries reports whether the client's Publish calls retry on
// Unavailable, the code every retry policy of the client includes.
func publishRetries(c *gpubsub.Client) bool {
	var s gax.CallSettings
	for _, o := range c.TopicAdminClient.CallOptions.Publish {
		o.Resolve(&s)
	}
	if s.Retry == nil {
		return false
	}
	r := s.Retry()
	if r == nil {
		return false
	}
	_, retry := r.Retry(status.Error(codes.Unavailable, "probe"))
	return retry
}

// limits are Pub/Sub's limits less what the adapter reserves; topic is the
// full topic name, which counts against the request size.
func limits(topic string) driver.Limits {
	return driver.Limits{
		MaxIDLength:            maxAttributeValueBytes,
		MaxMessageBytes:        maxMessageBytes,
		MaxAttributes:          maxAttributes - 1,
		MaxAttributeValueBytes: maxAttributeValueBytes,
		MaxGroupKeyLength:      maxOrderingKeyBytes,
		AttributeNameAllowed:   attributeNameAllowed,
		Check: func(m *driver.Message) (string, error) {
			for k, v := range m.Attributes {
				if !utf8.ValidString(v) {
					return "Attributes", fmt.Errorf("attribute %q is not valid UTF-8, which Pub/Sub requires", k)
				}
			}
			if n, limit := messageSize(m), bundleLimit(topic); n > limit {
				return "Body", fmt.Errorf("message is %d bytes as Pub/Sub encodes it (with the %s attribute), more than the %d a publish request takes", n, AttrID, limit)
			}
			return "", nil
		},
	}
}

func attributeNameAllowed(name string) bool {
	return name != "" && len(name) <= maxAttributeKeyBytes && utf8.ValidString(name) &&
		!strings.HasPrefix(name, "goog") && !strings.HasPrefix(name, ReservedAttrPrefix)
}

// toMessage is m as the client will send it, with its dedup ID as the
// AttrID attribute.
func toMessage(m *driver.Message) *gpubsub.Message {
	attrs := make(map[string]string, len(m.Attributes)+1)
	for k, v := range m.Attributes {
		attrs[k] = v
	}
	attrs[AttrID] = m.ID
	return &gpubsub.Message{Data: m.Body, Attributes: attrs, OrderingKey: m.GroupKey}
}

// messageSize is the size the client's bundler counts for toMessage(m):
// the protobuf encoding of its PubsubMessage (proto.Size), computed from
// the fields, so that Limits.Check builds no message to measure one.
func messageSize(m *driver.Message) int {
	n := 0
	if len(m.Body) > 0 {
		n += 1 + protowire.SizeBytes(len(m.Body)) // data = 1
	}
	// attributes = 2: one map entry per attribute, key and value always
	// encoded, even when empty.
	entry := func(k, v string) int {
		e := 1 + protowire.SizeBytes(len(k)) + 1 + protowire.SizeBytes(len(v))
		return 1 + protowire.SizeBytes(e)
	}
	for k, v := range m.Attributes {
		if k != AttrID { // toMessage writes the ID over it
			n += entry(k, v)
		}
	}
	n += entry(AttrID, m.ID)
	if m.GroupKey != "" {
		n += 1 + protowire.SizeBytes(len(m.GroupKey)) // ordering_key = 5
	}
	return n
}

// bundleLimit is the client's cap on one bundle (one Publish request) for
// topic: the request limit less the topic name and framing.
func bundleLimit(topic string) int {
	return maxRequestBytes - proto.Size(&pb.PublishRequest{Topic: topic}) - 5
}

// isRetryable reports whether an error from this package's drivers may
// succeed when tried again. A gRPC status that says the service refused
// the request (InvalidArgument, NotFound, PermissionDenied, …) is not; a
// transient status, a lost answer, a paused ordering key or an unknown
// error is, because the message may have been stored or was never sent.
func isRetryable(err error) bool {
	var paused gpubsub.ErrPublishingPaused
	var ackErr *AckError
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrClosed), errors.As(err, &ackErr), errors.Is(err, gpubsub.ErrOversizedMessage),
		errors.Is(err, gpubsub.ErrPublisherStopped), errors.Is(err, errSettled):
		return false
	case errors.Is(err, ErrEarlierFailed), errors.As(err, &paused),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return true
	}
	switch st.Code() {
	case codes.Internal:
		// The client refuses to retry this one: the request can never be
		// encoded.
		return !strings.Contains(st.Message(), "invalid UTF-8")
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted,
		codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

// noWindow is the publish-side window of topic: none, and no setting
// gives one. Its Settings name where a subscription's redelivery is set;
// the backoff is not named, because it follows from the lease and the
// retry policy together.
func noWindow(topic string) window.Window {
	return window.Window{
		Backend: Backend, Kind: window.KindNone, Source: window.SourceDocumented,
		Scope: "topic " + topic,
		Settings: window.Settings{
			AckWait:       "the ack deadline (the subscription's, or Options.AckExtension, URL parameter ack_wait, which overrides it)",
			MaxDeliveries: "the max_delivery_attempts of the subscription's dead-letter policy",
		},
	}
}

// fullName turns an ID into a full resource name in project, and checks a
// full name's kind ("topics" or "subscriptions").
func fullName(project, kind, nameOrID string) (string, error) {
	parts := strings.Split(nameOrID, "/")
	switch {
	case len(parts) == 1 && nameOrID != "":
		return "projects/" + project + "/" + kind + "/" + nameOrID, nil
	case len(parts) == 4 && parts[0] == "projects" && parts[1] != "" && parts[2] == kind && parts[3] != "":
		return nameOrID, nil
	}
	return "", fmt.Errorf("dedupq/pubsub: %q is neither a %s ID nor projects/PROJECT/%s/ID", nameOrID, strings.TrimSuffix(kind, "s"), kind)
}
