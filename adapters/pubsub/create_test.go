package pubsub_test

// create=true (Options.Create) against pstest and the official emulator:
// a publisher's topic, and an ordered consumer's topic and subscription,
// made once the startup checks passed; an existing subscription that lacks
// what the URL asks for refused.

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
)

func TestCreate(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			srv := s.srv(t)
			c := srv.client(t)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			topicID, subID := uniqueID("topic"), uniqueID("sub")
			topic, sub := "projects/"+c.Project()+"/topics/"+topicID, "projects/"+c.Project()+"/subscriptions/"+subID
			t.Cleanup(func() {
				bg := context.Background()
				_ = c.SubscriptionAdminClient.DeleteSubscription(bg, &pb.DeleteSubscriptionRequest{Subscription: sub})
				_ = c.TopicAdminClient.DeleteTopic(bg, &pb.DeleteTopicRequest{Topic: topic})
			})
			base := "pubsub://" + c.Project() + "/"
			q := "?emulator=" + srv.addr + "&create=true"
			con, err := dedupq.OpenConsumer(ctx, base+subID+q+"&topic="+topicID+"&ordering=true&exactly_once=true&retention=1h",
				dedupq.ConsumerOptions{Ordered: true})
			if err != nil {
				t.Fatalf("OpenConsumer with create=true: %v", err)
			}
			defer con.Close(context.Background())
			got, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
			if err != nil {
				t.Fatalf("the subscription was not created: %v", err)
			}
			if got.Topic != topic || !got.EnableMessageOrdering || !got.EnableExactlyOnceDelivery ||
				got.GetMessageRetentionDuration().AsDuration() != time.Hour || got.AckDeadlineSeconds != 10 {
				t.Errorf("created subscription %v; want on %s, ordered, exactly-once, retention 1h, ack deadline 10s", got, topic)
			}
			pub, err := dedupq.OpenPublisher(ctx, base+topicID+q, dedupq.PublisherOptions{ConsumerDedupTTL: time.Hour})
			if err != nil {
				t.Fatalf("OpenPublisher with create=true on the created topic: %v", err)
			}
			defer pub.Close(context.Background())
			if _, err := pub.Publish(ctx, &dedupq.Message{ID: "created", Body: []byte("x"), GroupKey: "g"}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			rctx, stop := context.WithCancel(ctx)
			var gotID string
			if err := con.Run(rctx, func(_ context.Context, d *dedupq.Delivery) error {
				gotID = d.Message.ID
				stop()
				return nil
			}); err != nil || gotID != "created" {
				t.Errorf("Run = %v, got %q; want the published message", err, gotID)
			}

			// A publisher's topic alone.
			other := uniqueID("topic")
			t.Cleanup(func() {
				_ = c.TopicAdminClient.DeleteTopic(context.Background(), &pb.DeleteTopicRequest{Topic: "projects/" + c.Project() + "/topics/" + other})
			})
			pub2, err := dedupq.OpenPublisher(ctx, base+other+q, dedupq.PublisherOptions{ConsumerDedupTTL: time.Hour})
			if err != nil {
				t.Fatalf("OpenPublisher with create=true on a missing topic: %v", err)
			}
			pub2.Close(context.Background())
			if _, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/" + c.Project() + "/topics/" + other}); err != nil {
				t.Errorf("the publisher's topic was not created: %v", err)
			}
		})
	}
}

// TestCreateRefusals: what create=true and ordering=true refuse, before
// anything is created.
func TestCreateRefusals(t *testing.T) {
	srv := pstestServer()
	c := srv.client(t)
	ctx := t.Context()
	f := srv.create(ctx, t, c, subConfig{})
	subID := f.sub[len("projects/"+c.Project()+"/subscriptions/"):]
	base := "pubsub://" + c.Project() + "/"
	emu := "?emulator=" + srv.addr
	_, err := dedupq.OpenConsumer(ctx, base+subID+emu+"&ordering=true", dedupq.ConsumerOptions{})
	if !errors.Is(err, dpubsub.ErrSubscriptionMismatch) {
		t.Errorf("ordering=true on a subscription without ordering: %v, want ErrSubscriptionMismatch", err)
	}
	_, err = dedupq.OpenConsumer(ctx, base+subID+emu+"&topic=elsewhere", dedupq.ConsumerOptions{})
	if !errors.Is(err, dpubsub.ErrSubscriptionMismatch) {
		t.Errorf("topic= naming another topic: %v, want ErrSubscriptionMismatch", err)
	}
	missing := uniqueID("sub")
	_, err = dedupq.OpenConsumer(ctx, base+missing+emu+"&create=true", dedupq.ConsumerOptions{})
	var pe *dedupq.ParamError
	if !errors.As(err, &pe) || pe.Param != "topic" {
		t.Errorf("create=true on a consumer URL without topic=: %v, want a ParamError for topic", err)
	}
	// Refused by the startup check: nothing is created.
	topicID := f.topic[len("projects/"+c.Project()+"/topics/"):]
	_, err = dedupq.OpenConsumer(ctx, base+missing+emu+"&create=true&topic="+topicID, dedupq.ConsumerOptions{Ordered: true})
	if !errors.Is(err, dedupq.ErrOrderingUnsupported) || !errors.Is(err, dpubsub.ErrNoMessageOrdering) {
		t.Errorf("an ordered consumer with create=true but not ordering=true: %v, want ErrOrderingUnsupported", err)
	}
	if _, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/" + c.Project() + "/subscriptions/" + missing,
	}); err == nil {
		t.Errorf("a refused open created the subscription")
	}
	u, _ := url.Parse(base + missing + "?create=true&topic=orders")
	if _, err := dpubsub.ParseURL(u); !errors.As(err, &pe) || pe.Param != "create" {
		t.Errorf("create=true without emulator=: %v, want a ParamError for create", err)
	}
}
