package servicebus_test

// The adapter conformance suite (adapters/adaptertest) against the Service
// Bus test double started by TestMain (main_test.go), through the real
// azservicebus SDK; entity properties come through the Admin seam.
//
// Each subtest gets a fresh queue whose duplicate detection window, lock
// duration and MaxDeliveryCount are the suite's Config. The double accepts
// a 1-second window, which Service Bus (20 s at least) would not: that is
// what lets the "after the window" half of the dedup check run here.
// The suite runs twice: on queues without sessions, where the group
// ordering check proves that an ordered Consumer is refused, and on
// session queues (TestConformanceSessions), where every message of the
// suite carries a GroupKey (its SessionId) and the check runs.
//
// The Restart check runs on a double of its own (the shared one is never
// stopped), which it stops and starts again on the same AMQP port, so that
// the SDK's connection drops and must be made again. The double keeps
// everything in memory: it comes back with the queue re-created from the
// same properties before it accepts a connection (as Service Bus never
// loses an entity), but with no messages and no dedup history, so the
// check restarts only once everything published so far was handled
// (Restarter.Forgets). What it proves here is the outage — a publisher
// retrying through it and a consumer waiting it out — not that Service Bus
// keeps stored messages across a restart.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
	servicebusdouble "github.com/dedupq/dedupq/localstack/servicebus-double"
)

type harness struct {
	sessions bool // session queues (RequiresSession)
}

func (h harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{ConfiguresWindow: true, WaitTimeout: 15 * time.Second, OrdersGroups: h.sessions}
}

func (h harness) Open(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	d := needDouble(t)
	var private *privateDouble
	if cfg.Restartable {
		private = startPrivateDouble(t)
		d = private.current()
	}
	a := newFakeAdmin()
	maxDeliveries := cfg.MaxDeliveries
	if maxDeliveries <= 0 {
		// Service Bus always dead-letters at some count; this is its
		// highest.
		maxDeliveries = 2000
	}
	p := servicebus.EntityProperties{
		RequiresDuplicateDetection: cfg.DedupWindow > 0,
		DuplicateDetectionWindow:   cfg.DedupWindow,
		LockDuration:               cfg.AckWait,
		MaxDeliveryCount:           maxDeliveries,
		MaxMessageBytes:            servicebus.DefaultMaxMessageBytes,
		RequiresSession:            h.sessions,
	}
	q := newQueue(t, d, a, p)
	c := newClient(t, d)
	open := openPair
	if h.sessions {
		open = openSessionPair
	}
	tp, sub := open(t, c, q, servicebus.WithAdmin(servicebus.Options{}, a))
	var restart *adaptertest.Restarter
	if private != nil {
		private.queues = map[string]servicebusdouble.QueueConfig{q: queueConfig(p)}
		restart = &adaptertest.Restarter{Stop: private.stop, Start: private.start, Forgets: true}
	}
	var another func(ctx context.Context) (driver.Subscription, error)
	if h.sessions {
		another = func(ctx context.Context) (driver.Subscription, error) {
			// A client of its own, as a second process would have.
			return servicebus.OpenSessionSubscription(ctx, newClient(t, d), servicebus.Entity{Queue: q}, servicebus.WithAdmin(servicebus.Options{}, a))
		}
	}
	return adaptertest.Entity{
		Topic: tp, Subscription: sub, Restart: restart, AnotherSubscription: another,
		WaitOutWindow: func(ctx context.Context) error {
			timer := time.NewTimer(cfg.DedupWindow + 100*time.Millisecond)
			defer timer.Stop()
			select {
			case <-timer.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		DeadLetters: func(ctx context.Context) ([]string, error) {
			if private != nil {
				d = private.current()
			}
			dl, err := d.DeadLetters(ctx, q)
			if err != nil {
				return nil, err
			}
			ids := make([]string, len(dl))
			for i, x := range dl {
				ids[i] = x.MessageID
			}
			return ids, nil
		},
	}
}

func TestConformance(t *testing.T) {
	needDouble(t)
	adaptertest.Run(t, harness{})
}

func TestConformanceSessions(t *testing.T) {
	needDouble(t)
	adaptertest.Run(t, harness{sessions: true})
}

// privateDouble is a double of one test's own, which the test may stop and
// start again on the same AMQP port; it is stopped at cleanup.
type privateDouble struct {
	port   int
	queues map[string]servicebusdouble.QueueConfig // created at each start

	mu sync.Mutex
	d  *servicebusdouble.Double // the last one started
	up bool
}

func startPrivateDouble(t *testing.T) *privateDouble {
	t.Helper()
	d, err := servicebusdouble.StartWith(servicebusdouble.Options{})
	if err != nil {
		t.Fatalf("starting a private servicebus double: %v", err)
	}
	p := &privateDouble{port: d.Port, d: d, up: true}
	t.Cleanup(func() { _ = p.stop(context.Background()) })
	return p
}

// current is the running double (its control port changes on a restart).
func (p *privateDouble) current() *servicebusdouble.Double {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.d
}

func (p *privateDouble) stop(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.up {
		return nil
	}
	p.up = false
	return p.d.Stop()
}

func (p *privateDouble) start(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up {
		return nil
	}
	d, err := servicebusdouble.StartWith(servicebusdouble.Options{Port: p.port, Queues: p.queues})
	if err != nil {
		return err
	}
	p.d, p.up = d, true
	if d.Port != p.port {
		return fmt.Errorf("the double came back on port %d, not %d", d.Port, p.port)
	}
	return nil
}
