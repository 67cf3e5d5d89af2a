// Package adaptertest is the conformance suite every dedupq adapter must
// pass. An adapter's test implements Harness (one method that creates a
// fresh queue or stream, one that states what the backend can do) and calls
// Run:
//
//	func TestConformance(t *testing.T) { adaptertest.Run(t, harness{…}) }
//
// The suite drives the backend through the portable API — dedupq.Publisher
// and dedupq.Consumer — because that is what users run; it calls the driver
// directly only where the driver's own contract is the point (Receive
// honouring its context).
//
// # Waiting
//
// The suite never sleeps to wait for a condition. Positive checks ("the
// message arrives") wait on the deliveries themselves, up to
// Capabilities.WaitTimeout of real time. Negative checks ("it is not
// delivered again") need a bound: the suite stops the consumer (so every
// delivery is settled), lets the redelivery delay pass — the subscription's
// reported AckWait plus its longest nack backoff plus a slack of
// max(AckWait/2, 250ms) — then publishes a marker and consumes until the
// marker arrives; any other delivery fails the test. On an Entity whose
// Clock is a *clock.Fake that delay is a clock advance and costs nothing;
// on a real broker it is a bounded real wait, which is why harnesses should
// honour Config.AckWait (the default config asks for 1s). The marker shares
// the group key of the message under test, so a backend that orders groups
// cannot deliver it first while that message is still due.
//
// Subtests run one after another, each on a fresh entity.
package adaptertest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
)

// Config is what the suite asks of a fresh entity. A backend that cannot set
// a field ignores it and reports its real value through Window and
// Redelivery, which the suite reads back and uses for its waits.
type Config struct {
	// DedupWindow is the publish-side dedup window to configure (JetStream
	// stream Duplicates, Service Bus duplicate detection window, the mem
	// broker's DedupWindow).
	DedupWindow time.Duration
	// AckWait is the lease on a delivery (ack wait, visibility timeout,
	// lock duration). Short values keep the suite's negative checks fast.
	AckWait time.Duration
	// MaxDeliveries bounds deliveries before dead-lettering (MaxDeliver,
	// maxReceiveCount); zero means unlimited.
	MaxDeliveries int
	// Restartable asks for an entity on a backend the suite may stop and
	// start again (Entity.Restart): a private server or emulator, never a
	// shared one, with durable storage where the backend has it. Only the
	// Restart check sets it.
	Restartable bool
}

// DefaultConfig is the configuration Run asks for: windows and leases short
// enough to wait out in real time on brokers that honour them (JetStream's
// Duplicates must be at least 100ms), long enough not to expire under a
// handler on a loaded machine.
func DefaultConfig() Config {
	return Config{DedupWindow: time.Second, AckWait: time.Second, MaxDeliveries: 5}
}

// Capabilities say what a backend does, so that the suite skips what it
// cannot check instead of failing. A skipped capability is fine; a skipped
// service is not (harnesses decide that).
type Capabilities struct {
	// OrdersGroups means messages with the same GroupKey are delivered in
	// publish order, and no later one while an earlier one is in flight or
	// waiting for redelivery (SQS FIFO message groups, the mem broker).
	OrdersGroups bool
	// ConfiguresWindow means Open applies Config.DedupWindow exactly, so
	// the window the backend reports must equal it.
	ConfiguresWindow bool
	// WaitTimeout bounds, in real time, each wait for an expected delivery
	// or dead letter; zero means 10s. The suite adds the reported ack wait
	// and nack backoff to it.
	WaitTimeout time.Duration
}

// Entity is one fresh queue or stream opened for one subtest. The suite
// hands Topic to a Publisher and Subscription to a Consumer, which close
// them; the harness deletes the entity itself, with t.Cleanup in Open.
type Entity struct {
	// Topic publishes to the entity.
	Topic driver.Topic
	// Subscription consumes from it, as the only consumer group.
	Subscription driver.Subscription
	// Clock is the clock the backend runs on, handed to the Publisher and
	// Consumer too. A *clock.Fake makes the suite advance it wherever time
	// must pass; nil means real time.
	Clock clock.Clock
	// WaitOutWindow, when set, returns once a dedup ID published before
	// the call is no longer remembered by the backend (after the window
	// plus whatever the broker's purge lags by). Set it only when that is
	// short enough for a test (JetStream with a short Duplicates); nil
	// skips the check, except on a *clock.Fake Clock, which the suite
	// advances by the reported window itself.
	WaitOutWindow func(ctx context.Context) error
	// DeadLetters, when set, returns the dedup IDs of the messages the
	// backend dead-lettered so far, for the check that a permanent error
	// dead-letters its message. Nil skips that part of the check.
	DeadLetters func(ctx context.Context) ([]string, error)
	// Restart, when set, takes down the backend this entity lives on; see
	// Restarter. Harnesses set it only when Config.Restartable asked for
	// it; nil skips the Restart check.
	Restart *Restarter
	// AnotherSubscription, when set, opens one more Subscription on the
	// same entity and consumer group, as a second process would, for the
	// check that two Consumers share the groups without breaking their
	// order. The suite closes it (through its Consumer). Nil skips that
	// check.
	AnotherSubscription func(ctx context.Context) (driver.Subscription, error)
}

// Harness connects the suite to one backend.
type Harness interface {
	// Capabilities says what the backend can do; it is called once.
	Capabilities() Capabilities
	// Open creates a fresh, empty entity configured as close to cfg as
	// the backend allows, and returns drivers on it. It fails the test
	// (t.Fatal) when it cannot, and skips it (t.Skip) only where the
	// harness's own policy says a missing service may be skipped.
	Open(ctx context.Context, t *testing.T, cfg Config) Entity
}

// Run runs the whole suite against h, one subtest per behaviour.
func Run(t *testing.T, h Harness) {
	caps := h.Capabilities()
	if caps.WaitTimeout <= 0 {
		caps.WaitTimeout = 10 * time.Second
	}
	tests := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"RoundTrip", testRoundTrip},
		{"TraceContext", testTraceContext},
		{"Batch", testBatch},
		{"Dedup", testDedup},
		{"Redelivery", testRedelivery},
		{"Window", testWindow},
		{"Provision", testProvision},
		{"Validation", testValidation},
		{"GroupOrdering", testGroupOrdering},
		{"GroupOrderingTwoConsumers", testGroupOrderingTwoConsumers},
		{"GracefulShutdown", testGracefulShutdown},
		{"ReceiveHonoursContext", testReceiveHonoursContext},
		{"Restart", testRestart},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, &suite{h: h, caps: caps}) })
	}
}

// suite is what every subtest starts from.
type suite struct {
	h    Harness
	caps Capabilities
}

// open asks the harness for a fresh entity and checks what it returned.
func (s *suite) open(t *testing.T, cfg Config) Entity {
	t.Helper()
	ent := s.h.Open(t.Context(), t, cfg)
	if ent.Topic == nil || ent.Subscription == nil {
		t.Fatalf("harness Open returned Topic %v and Subscription %v; both are required", ent.Topic, ent.Subscription)
	}
	return ent
}

// nonce keeps IDs unique across runs, in case a harness reuses an entity
// whose window still remembers an earlier run's IDs.
func nonce() string { return fmt.Sprintf("%x", time.Now().UnixNano()&0xffffffffff) }

// DeadLettersFrom makes an Entity.DeadLetters for a backend whose dead
// letters land on another entity that a driver can consume (an SQS
// dead-letter queue, a Pub/Sub dead-letter subscription). Each call takes
// what arrived since the last off dead (acking it) and returns every ID
// seen so far.
func DeadLettersFrom(dead driver.Subscription) func(ctx context.Context) ([]string, error) {
	var mu sync.Mutex
	var ids []string
	return func(ctx context.Context) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		ds, err := dead.Receive(rctx, 10)
		if err != nil && rctx.Err() == nil {
			return nil, err
		}
		for _, d := range ds {
			ids = append(ids, d.Message.ID)
			if err := dead.Ack(ctx, d); err != nil {
				return nil, err
			}
		}
		return append([]string(nil), ids...), nil
	}
}
