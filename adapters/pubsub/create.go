package pubsub

import (
	"context"
	"errors"
	"fmt"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupq/dedupq/driver"
)

var (
	_ driver.Provisioner = (*Topic)(nil)
	_ driver.Provisioner = (*Subscription)(nil)
)

// ErrSubscriptionMismatch is matched by the error for an existing
// subscription that lacks what Options asks of it (its topic, message
// ordering, exactly-once delivery), none of which can be changed on an
// existing subscription.
var ErrSubscriptionMismatch = errors.New("the subscription is not what the options ask for")

// Provision creates the topic when Options.Create asked for it and it was
// missing at open; otherwise it does nothing. See driver.Provisioner.
func (t *Topic) Provision(ctx context.Context) error {
	t.mu.Lock()
	pending := t.pending
	t.mu.Unlock()
	if !pending {
		return nil
	}
	if err := createTopic(ctx, t.client, t.name); err != nil {
		return err
	}
	t.mu.Lock()
	t.pending = false
	t.mu.Unlock()
	return nil
}

// createTopic creates topic unless it exists.
func createTopic(ctx context.Context, c *gpubsub.Client, topic string) error {
	_, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("dedupq/pubsub: creating topic %s: %w", topic, err)
	}
	return nil
}

// Provision creates the subscription, and its topic when that is missing,
// when Options.Create asked for it and the subscription was missing at
// open; otherwise it does nothing. A subscription another process created
// meanwhile is used if it matches the options. See driver.Provisioner.
func (s *Subscription) Provision(ctx context.Context) error {
	s.mu.Lock()
	pending := s.pending
	s.mu.Unlock()
	if !pending {
		return nil
	}
	if _, err := s.client.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: s.topic}); status.Code(err) == codes.NotFound {
		if err := createTopic(ctx, s.client, s.topic); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("dedupq/pubsub: reading topic %s: %w", s.topic, err)
	}
	_, err := s.client.SubscriptionAdminClient.CreateSubscription(ctx, s.planned().proto())
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("dedupq/pubsub: creating subscription %s: %w", s.name, err)
	}
	info, err := readSubscription(ctx, s.client, s.name)
	if err != nil {
		return err
	}
	if err := s.matches(info); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending, s.info = false, info
	// Another process may have made it with another ack deadline; nothing
	// has been received yet (NewConsumer provisions before Run).
	s.lease = lease(info, s.opts)
	s.sub.ReceiveSettings.MaxDurationPerAckExtension = s.lease
	s.sub.ReceiveSettings.MinDurationPerAckExtension = s.lease
	return nil
}

// planned is the subscription Options.Create will make.
func (s *Subscription) planned() SubscriptionInfo {
	ack := minAckExtension
	if s.opts.AckExtension > 0 {
		ack = s.opts.AckExtension.Round(time.Second)
	}
	return SubscriptionInfo{
		Name: s.name, Topic: s.topic, ExactlyOnce: s.opts.ExactlyOnce, Ordering: s.opts.MessageOrdering,
		AckDeadline: max(ack, time.Second), Retention: s.opts.Retention,
	}
}

// proto is the request that creates the subscription i describes.
func (i SubscriptionInfo) proto() *pb.Subscription {
	sub := &pb.Subscription{
		Name: i.Name, Topic: i.Topic,
		AckDeadlineSeconds:        int32(i.AckDeadline / time.Second),
		EnableMessageOrdering:     i.Ordering,
		EnableExactlyOnceDelivery: i.ExactlyOnce,
	}
	if i.Retention > 0 {
		sub.MessageRetentionDuration = durationpb.New(i.Retention)
	}
	return sub
}

// matches checks an existing subscription against what the options ask:
// its topic, message ordering and exactly-once delivery, none of which can
// be changed on an existing subscription.
func (s *Subscription) matches(info SubscriptionInfo) error {
	var why string
	switch {
	case s.topic != "" && info.Topic != s.topic:
		why = fmt.Sprintf("it receives from %s, not from %s", info.Topic, s.topic)
	case s.opts.MessageOrdering && !info.Ordering:
		why = "it has no message ordering (EnableMessageOrdering), which cannot be turned on for an existing subscription"
	case s.opts.ExactlyOnce && !info.ExactlyOnce:
		why = "it has no exactly-once delivery (EnableExactlyOnceDelivery)"
	default:
		return nil
	}
	return fmt.Errorf("dedupq/pubsub: subscription %s: %w: %s; consume from a new subscription created so (Options.Create, URL parameter create)",
		s.name, ErrSubscriptionMismatch, why)
}
