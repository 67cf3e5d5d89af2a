package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/internal/childproc"
)

// pstestChildEnv marks this program (or its test binary) re-executed to
// serve pstest, until its standard input closes.
const pstestChildEnv = "DEDUPQ_BENCH_PSTEST"

// servePstest runs in the child: it serves pstest and prints its address.
func servePstest() {
	srv := pstest.NewServer()
	fmt.Println(srv.Addr)
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

// startPstest serves pstest from a child process, not in this one, so that
// the allocations counted are the client's and dedupq's alone (the real
// service is remote too), and so that pstest's own data races (v2.8.1:
// ModifyAckDeadline writes a message its StreamingPull is marshalling) stay
// out of a race-checked test.
func startPstest() (addr string, stop func(), err error) {
	return childproc.Start(pstestChildEnv + "=1")
}

// pubsubRows measure Pub/Sub on pstest. dedupq's Publisher runs with
// ConsumerDedupTTL declared, as Pub/Sub (no publish-side window) requires
// of a publisher that retries.
func pubsubRows(ctx context.Context, _ config) ([]row, func(), error) {
	addr, stop, err := startPstest()
	if err != nil {
		return nil, nil, fmt.Errorf("starting pstest: %w", err)
	}
	client, err := dpubsub.NewClient(ctx, "bench", addr)
	if err != nil {
		stop()
		return nil, nil, err
	}
	project := "projects/" + client.Project()
	cleanup := func() {
		client.Close()
		stop()
	}
	// Subscriptions dead-letter after 5 deliveries: a Guard refuses to
	// run on unbounded redelivery, which its TTL could not cover.
	dead := project + "/topics/" + randomName("bench-dead-")
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: dead}); err != nil {
		cleanup()
		return nil, nil, err
	}
	// fixture makes a fresh topic and its subscription.
	fixture := func(ctx context.Context) (topic, sub string, err error) {
		id := randomName("bench-")
		topic, sub = project+"/topics/"+id, project+"/subscriptions/"+id
		if _, err = client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
			return "", "", err
		}
		// A retention the Guard's TTL covers: Pub/Sub may redeliver a
		// message until it expires, whatever MaxDeliveryAttempts says.
		_, err = client.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
			Name: sub, Topic: topic, AckDeadlineSeconds: 10,
			DeadLetterPolicy:         &pb.DeadLetterPolicy{DeadLetterTopic: dead, MaxDeliveryAttempts: 5},
			MessageRetentionDuration: durationpb.New(10 * time.Minute),
		})
		return topic, sub, err
	}
	rawPublish := side{"Publisher.Publish", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		topic, _, err := fixture(ctx)
		if err != nil {
			return 0, err
		}
		return pubsubPublishAll(ctx, client, topic, n)
	}}
	dqPublish := side{"Publisher", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		topic, _, err := fixture(ctx)
		if err != nil {
			return 0, err
		}
		top, err := dpubsub.OpenTopic(ctx, client, topic, nil)
		if err != nil {
			return 0, err
		}
		pub, err := dedupq.NewPublisher(ctx, top, dedupq.PublisherOptions{ConsumerDedupTTL: 24 * time.Hour})
		if err != nil {
			top.Close()
			return 0, err
		}
		defer pub.Close(context.Background())
		return publishTimed(ctx, pub, "m", 0, n)
	}}
	filled := func(ctx context.Context, n int64) (string, error) {
		return untimed(ctx, func(ctx context.Context) (string, error) {
			topic, sub, err := fixture(ctx)
			if err == nil {
				_, err = pubsubPublishAll(ctx, client, topic, n)
			}
			return sub, err
		})
	}
	rawConsume := side{"Subscriber.Receive+Ack", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		name, err := filled(ctx, n)
		if err != nil {
			return 0, err
		}
		sub := client.Subscriber(name)
		sub.ReceiveSettings.NumGoroutines = 1 // as the adapter's
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		var mu sync.Mutex
		seen := make(map[string]bool, n)
		w := startWatch()
		err = sub.Receive(ctx, func(_ context.Context, m *gpubsub.Message) {
			m.Ack()
			mu.Lock()
			defer mu.Unlock()
			seen[m.ID] = true
			if int64(len(seen)) == n {
				cancel()
			}
		})
		d := w.stop()
		mu.Lock()
		got := int64(len(seen))
		mu.Unlock()
		if got < n {
			return 0, fmt.Errorf("consumed %d of %d messages (%v)", got, n, err)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			return 0, err
		}
		return d, nil
	}}
	dqConsume := func(name string, guarded bool) side {
		return side{name, func(ctx context.Context, _ int, n int64) (time.Duration, error) {
			subName, err := filled(ctx, n)
			if err != nil {
				return 0, err
			}
			sub, err := dpubsub.OpenSubscription(ctx, client, subName, nil)
			if err != nil {
				return 0, err
			}
			return consumeGuarded(ctx, sub, guarded, n)
		}}
	}
	// pstest hands a streaming pull one message per 10 ms tick (its
	// deliver loop; the stream's channel is unbuffered), about 100
	// messages/s per stream whatever the client does: the consume rows
	// are short, and their rates are pstest's.
	rows := []row{
		{name: "publish 1 KiB", conc: 1, n: 20_000, allocGoal: true, raw: rawPublish, dq: dqPublish},
		{name: "consume", conc: consumeConcurrency, n: 500, allocGoal: true, raw: rawConsume, dq: dqConsume("Consumer", false)},
		{name: "consume+guard", conc: consumeConcurrency, n: 500, raw: rawConsume, dq: dqConsume("Consumer+Guard(memstore)", true)},
	}
	return rows, cleanup, nil
}

// pubsubPublishAll publishes n messages through one client Publisher with
// the client's default settings and waits for every result, timed.
func pubsubPublishAll(ctx context.Context, client *gpubsub.Client, topic string, n int64) (time.Duration, error) {
	p := client.Publisher(topic)
	defer p.Stop()
	res := make([]*gpubsub.PublishResult, n)
	w := startWatch()
	for i := range res {
		res[i] = p.Publish(ctx, &gpubsub.Message{Data: payload, Attributes: map[string]string{"id": "m" + strconv.Itoa(i)}})
	}
	for i, r := range res {
		if _, err := r.Get(ctx); err != nil {
			return 0, fmt.Errorf("publishing message %d: %w", i, err)
		}
	}
	return w.stop(), nil
}
