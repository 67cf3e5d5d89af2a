package pubsub_test

// The adapter conformance suite (adapters/adaptertest) against two servers:
//   - pstest, the client library's in-process fake (always runs);
//   - the official Pub/Sub emulator, started by TestMain (see main_test.go).
//
// Each subtest gets a fresh topic and subscription (ack deadline: the suite's
// AckWait, raised to what the server accepts) and, when the suite asks for
// bounded deliveries, a dead-letter topic, a subscription on it that
// DeadLetters reads, and a dead-letter policy with that MaxDeliveryAttempts
// (which also makes Pub/Sub fill in DeliveryAttempt). The drivers use the
// shortest AckExtension the server takes (2 s on pstest, Pub/Sub's 10 s on
// the emulator) so that the suite's negative checks, which wait out the
// lease, stay short.
//
// Known gaps of the servers, and how this copes:
//   - Pub/Sub has no publish-side dedup, so the suite's Dedup check skips
//     itself (the window is KindNone).
//   - Pub/Sub's ordering keys do not give the suite's OrdersGroups guarantee
//     (a nacked message comes back with every later message of its key), so
//     GroupOrdering is skipped.
//   - pstest accepts an ack with a stale ack ID and reports every ack result
//     as Success, even on exactly-once subscriptions; the real service (and
//     the emulator, tested in exactlyonce_test.go) refuses it. Ack results
//     are therefore only tested against the emulator.
//   - pstest accepts ack deadlines and lease extensions below Pub/Sub's 10 s
//     after SetMinAckDeadline; the emulator, like the service, does not.
//
// The Restart check runs under "pstest" on a pstest child of its own (the
// shared one is never stopped), serving on a fixed port, which it kills
// and starts again on that port. pstest keeps everything in memory: the
// new child creates the same topics and subscriptions before it accepts a
// connection (as Pub/Sub never loses a subscription to a restart), but has
// no messages, so the check restarts only once everything published so
// far was handled (Restarter.Forgets). What it proves is the outage: a
// publisher retrying through it and a consumer waiting it out. Under
// "emulator" the check is skipped: the Java emulator takes seconds to
// start and loses its state the same way, so it would prove nothing more.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
)

// server is one Pub/Sub server the tests talk to.
type server struct {
	name string
	addr string
	// minAckDeadline is the shortest subscription ack deadline it accepts.
	minAckDeadline time.Duration
}

func pstestServer() server {
	return server{name: "pstest", addr: pstestAddr, minAckDeadline: time.Second}
}

func emulatorServer(t testing.TB) server {
	return server{name: "emulator", addr: needEmulator(t), minAckDeadline: 10 * time.Second}
}

// client opens a client on the server for the test's lifetime.
func (s server) client(t testing.TB) *gpubsub.Client {
	t.Helper()
	c, err := dpubsub.NewClient(context.Background(), "dedupq-test", s.addr)
	if err != nil {
		t.Fatalf("NewClient(%s): %v", s.name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// subConfig is what a test asks of a fresh subscription.
type subConfig struct {
	ackDeadline   time.Duration
	maxDeliveries int // > 0: add a dead-letter policy
	exactlyOnce   bool
	ordering      bool
	retryPolicy   *pb.RetryPolicy
	retention     time.Duration // MessageRetentionDuration; zero: the server's default
}

// fixture is a fresh topic and subscription, and the dead-letter
// subscription when there is a dead-letter policy.
type fixture struct {
	topic, sub, deadSub string
}

// create makes the fixture on the server and deletes it when the test ends.
func (s server) create(ctx context.Context, t testing.TB, c *gpubsub.Client, cfg subConfig) fixture {
	t.Helper()
	project := "projects/" + c.Project()
	f := fixture{topic: project + "/topics/" + uniqueID("topic"), sub: project + "/subscriptions/" + uniqueID("sub")}
	createTopic(ctx, t, c, f.topic)
	req := &pb.Subscription{
		Name: f.sub, Topic: f.topic,
		AckDeadlineSeconds:        int32(max(cfg.ackDeadline, s.minAckDeadline).Round(time.Second) / time.Second),
		EnableExactlyOnceDelivery: cfg.exactlyOnce,
		EnableMessageOrdering:     cfg.ordering,
		RetryPolicy:               cfg.retryPolicy,
	}
	if cfg.retention > 0 {
		req.MessageRetentionDuration = durationpb.New(cfg.retention)
	}
	if cfg.maxDeliveries > 0 {
		dlt := project + "/topics/" + uniqueID("dead")
		createTopic(ctx, t, c, dlt)
		f.deadSub = project + "/subscriptions/" + uniqueID("deadsub")
		createSub(ctx, t, c, &pb.Subscription{Name: f.deadSub, Topic: dlt, AckDeadlineSeconds: 10})
		req.DeadLetterPolicy = &pb.DeadLetterPolicy{DeadLetterTopic: dlt, MaxDeliveryAttempts: int32(cfg.maxDeliveries)}
	}
	createSub(ctx, t, c, req)
	return f
}

func createTopic(ctx context.Context, t testing.TB, c *gpubsub.Client, name string) {
	t.Helper()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: name}); err != nil {
		t.Fatalf("CreateTopic(%s): %v", name, err)
	}
	t.Cleanup(func() {
		_ = c.TopicAdminClient.DeleteTopic(context.Background(), &pb.DeleteTopicRequest{Topic: name})
	})
}

func createSub(ctx context.Context, t testing.TB, c *gpubsub.Client, s *pb.Subscription) {
	t.Helper()
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, s); err != nil {
		t.Fatalf("CreateSubscription(%s): %v", s.Name, err)
	}
	t.Cleanup(func() {
		_ = c.SubscriptionAdminClient.DeleteSubscription(context.Background(), &pb.DeleteSubscriptionRequest{Subscription: s.Name})
	})
}

// options keep leases as short as the server allows (see the file
// comment).
func (s server) options() *dpubsub.Options {
	return &dpubsub.Options{AckExtension: max(s.minAckDeadline, 2*time.Second), PublishTimeout: 10 * time.Second}
}

type harness struct{ srv server }

func (harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{WaitTimeout: 15 * time.Second}
}

func (h harness) Open(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	if cfg.Restartable && h.srv.name == "pstest" {
		return openRestartable(ctx, t, cfg)
	}
	c := h.srv.client(t)
	f := h.srv.create(ctx, t, c, subConfig{ackDeadline: cfg.AckWait, maxDeliveries: cfg.MaxDeliveries})
	tp, err := dpubsub.OpenTopic(ctx, c, f.topic, h.srv.options())
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	sub, err := dpubsub.OpenSubscription(ctx, c, f.sub, h.srv.options())
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	ent := adaptertest.Entity{Topic: tp, Subscription: sub}
	if f.deadSub != "" {
		dead, err := dpubsub.OpenSubscription(ctx, c, f.deadSub, h.srv.options())
		if err != nil {
			t.Fatalf("OpenSubscription on the dead-letter subscription: %v", err)
		}
		t.Cleanup(func() { dead.Close() })
		ent.DeadLetters = adaptertest.DeadLettersFrom(dead)
	}
	return ent
}

func TestConformance(t *testing.T) {
	tests := []struct {
		name string
		srv  func(testing.TB) server
	}{
		{"pstest", func(testing.TB) server { return pstestServer() }},
		{"emulator", emulatorServer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			adaptertest.Run(t, harness{srv: tc.srv(t)})
		})
	}
}

// openRestartable opens a topic and a subscription with a dead-letter
// policy on a private pstest child that the Restart check may stop and
// start again.
func openRestartable(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	project := "projects/dedupq-test"
	topic, dlt := project+"/topics/"+uniqueID("topic"), project+"/topics/"+uniqueID("dead")
	subName := project + "/subscriptions/" + uniqueID("sub")
	setup := pstestSetup{Topics: []string{topic, dlt}}
	for _, sub := range []*pb.Subscription{
		{Name: project + "/subscriptions/" + uniqueID("deadsub"), Topic: dlt, AckDeadlineSeconds: 10},
		{
			Name: subName, Topic: topic,
			AckDeadlineSeconds: int32(max(cfg.AckWait, time.Second).Round(time.Second) / time.Second),
			DeadLetterPolicy:   &pb.DeadLetterPolicy{DeadLetterTopic: dlt, MaxDeliveryAttempts: int32(max(cfg.MaxDeliveries, 5))},
			// Redelivery is bounded by the retention, not by the
			// attempts: the shortest Pub/Sub takes keeps the span within
			// the check's dedup TTL.
			MessageRetentionDuration: durationpb.New(10 * time.Minute),
		},
	} {
		b, err := protojson.Marshal(sub)
		if err != nil {
			t.Fatal(err)
		}
		setup.Subscriptions = append(setup.Subscriptions, b)
	}
	spec, err := json.Marshal(setup)
	if err != nil {
		t.Fatal(err)
	}
	p := &privatePstest{env: []string{childPortEnv + "=" + strconv.Itoa(port), childSetupEnv + "=" + string(spec)}}
	if err := p.start(ctx); err != nil {
		t.Fatalf("starting a private pstest: %v", err)
	}
	t.Cleanup(func() { _ = p.stop(context.Background()) })
	srv := server{name: "private pstest", addr: p.addr, minAckDeadline: time.Second}
	c := srv.client(t)
	tp, err := dpubsub.OpenTopic(ctx, c, topic, srv.options())
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	sub, err := dpubsub.OpenSubscription(ctx, c, subName, srv.options())
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	return adaptertest.Entity{Topic: tp, Subscription: sub, Restart: &adaptertest.Restarter{
		Stop: p.stop, Start: p.start, Forgets: true,
	}}
}

// privatePstest is a pstest child of one test's own, on a fixed port.
type privatePstest struct {
	env []string

	mu   sync.Mutex
	addr string
	kill func() // nil while stopped
}

func (p *privatePstest) start(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kill != nil {
		return nil
	}
	addr, stop, err := startPstestChild(p.env)
	if err != nil {
		return err
	}
	if p.addr != "" && addr != p.addr {
		stop()
		return fmt.Errorf("pstest came back at %s, not %s", addr, p.addr)
	}
	p.addr, p.kill = addr, stop
	return nil
}

// stop ends the child (closing its standard input makes it exit), which
// drops every connection to it.
func (p *privatePstest) stop(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kill != nil {
		p.kill()
		p.kill = nil
	}
	return nil
}
