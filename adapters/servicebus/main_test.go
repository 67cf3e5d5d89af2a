package servicebus_test

// The test harness: TestMain starts the Service Bus test double
// (localstack/servicebus-double: an AMQP 1.0 broker written with the npm
// package rhea, installed from its package-lock.json with `npm ci`) on a
// free port, and stops it after the tests. The real azservicebus SDK talks
// to it through a UseDevelopmentEmulator=true connection string; the
// management API (HTTP/ATOM) is replaced by the adapter's Admin seam,
// answered from the properties each test gave the double's queue.
//
// TestMain installs the double from its lockfile first when node_modules is
// missing. Tests that need the double call needDouble. When it cannot run
// here (node, or npm for its install, is missing) they skip with the
// reason, unless the environment variable CI is set; any other failure to
// start it (a failed install, a double that does not answer) fails the
// whole run, as does CI: a run cannot pass on tests it skipped for a
// fixable reason.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
	servicebusdouble "github.com/dedupq/dedupq/localstack/servicebus-double"
)

var (
	// double is the running double; nil when it cannot run, and then
	// doubleMissing says why.
	double        *servicebusdouble.Double
	doubleMissing string
)

func TestMain(m *testing.M) {
	d, err := servicebusdouble.Start()
	if err != nil {
		doubleMissing = err.Error()
		switch {
		case os.Getenv("CI") != "":
			fmt.Fprintf(os.Stderr, "adapters/servicebus: CI is set but the servicebus double cannot run: %v\n", err)
			os.Exit(1)
		case !errors.Is(err, servicebusdouble.ErrUnavailable):
			fmt.Fprintf(os.Stderr, "adapters/servicebus: starting the servicebus double: %v\n", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "adapters/servicebus: double tests will be skipped: %v\n", err)
	}
	double = d
	code := m.Run()
	if d != nil {
		if err := d.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "adapters/servicebus: stopping the double: %v\n", err)
		}
	}
	os.Exit(code)
}

func needDouble(t testing.TB) *servicebusdouble.Double {
	t.Helper()
	if double == nil {
		t.Skipf("the servicebus double cannot run here: %s", doubleMissing)
	}
	return double
}

// fakeAdmin answers the Admin seam from properties the tests set, as the
// management API would from the entity; tests change them to model an
// entity whose window was changed after startup.
type fakeAdmin struct {
	mu    sync.Mutex
	props map[string]servicebus.EntityProperties
	calls atomic.Int64
	// d, when set, is where Create creates queues (newCreatingAdmin).
	d       *servicebusdouble.Double
	created atomic.Int64
}

// newCreatingAdmin is a fakeAdmin that also creates queues on d, as the
// management API would (Options.Create); the test deletes them at its end.
func newCreatingAdmin(t testing.TB, d *servicebusdouble.Double) *fakeAdmin {
	a := newFakeAdmin()
	a.d = d
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for q := range a.props {
			_ = d.DeleteQueue(context.Background(), q)
		}
	})
	return a
}

// Create creates e on the double unless it exists (the double has queues
// only).
func (a *fakeAdmin) Create(ctx context.Context, e servicebus.Entity, p servicebus.EntityProperties) error {
	if a.d == nil || e.Queue == "" {
		return fmt.Errorf("fake admin: cannot create %s", e)
	}
	a.mu.Lock()
	_, ok := a.props[strings.ToLower(e.Queue)]
	a.mu.Unlock()
	if ok {
		return nil
	}
	if err := a.d.CreateQueue(ctx, e.Queue, queueConfig(p)); err != nil {
		return err
	}
	a.set(e.Queue, p)
	a.created.Add(1)
	return nil
}

func newFakeAdmin() *fakeAdmin {
	return &fakeAdmin{props: map[string]servicebus.EntityProperties{}}
}

func (a *fakeAdmin) set(queue string, p servicebus.EntityProperties) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.props[strings.ToLower(queue)] = p
}

func (a *fakeAdmin) Properties(_ context.Context, e servicebus.Entity) (servicebus.EntityProperties, error) {
	a.calls.Add(1)
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.props[strings.ToLower(e.Queue)]
	if !ok {
		return p, fmt.Errorf("fake admin: %s: %w", e, servicebus.ErrEntityNotFound)
	}
	return p, nil
}

var queueSeq atomic.Int64

// newQueue creates a fresh queue on the double with p's properties,
// registers them with a, and deletes the queue when the test ends.
func newQueue(t testing.TB, d *servicebusdouble.Double, a *fakeAdmin, p servicebus.EntityProperties) string {
	t.Helper()
	return newQueueWith(t, d, a, p, queueConfig(p))
}

// newQueueWith is newQueue with the double told cfg, for what the entity
// properties do not say (the link's batch limit on Premium).
func newQueueWith(t testing.TB, d *servicebusdouble.Double, a *fakeAdmin, p servicebus.EntityProperties, cfg servicebusdouble.QueueConfig) string {
	t.Helper()
	name := fmt.Sprintf("q%d-%x", queueSeq.Add(1), time.Now().UnixNano()&0xffffff)
	err := d.CreateQueue(context.Background(), name, cfg)
	if err != nil {
		t.Fatalf("creating queue %s on the double: %v", name, err)
	}
	a.set(name, p)
	t.Cleanup(func() { _ = d.DeleteQueue(context.Background(), name) })
	return name
}

// queueConfig is what the double is told of a queue with properties p.
func queueConfig(p servicebus.EntityProperties) servicebusdouble.QueueConfig {
	return servicebusdouble.QueueConfig{
		RequiresDuplicateDetection: p.RequiresDuplicateDetection,
		DuplicateDetectionWindow:   p.DuplicateDetectionWindow,
		LockDuration:               p.LockDuration,
		MaxDeliveryCount:           p.MaxDeliveryCount,
		MaxMessageBytes:            p.MaxMessageBytes,
		EnablePartitioning:         p.EnablePartitioning,
		RequiresSession:            p.RequiresSession,
	}
}

// receiveN receives and completes n messages from sub, then makes sure
// nothing more arrives within a short wait, and returns them in arrival
// order.
func receiveN(t testing.TB, sub *servicebus.Subscription, n int) []driver.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got []driver.Message
	for len(got) < n {
		ds, err := sub.Receive(ctx, n-len(got))
		if err != nil {
			t.Fatalf("Receive after %d of %d messages: %v", len(got), n, err)
		}
		for _, dl := range ds {
			if err := sub.Ack(ctx, dl); err != nil {
				t.Fatalf("Ack %s: %v", dl.Message.ID, err)
			}
			got = append(got, dl.Message)
		}
	}
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	if ds, err := sub.Receive(short, 10); err == nil {
		for _, dl := range ds {
			t.Errorf("the entity holds %s beyond the %d messages expected", dl.Message.ID, n)
		}
	}
	return got
}

// newClient connects the SDK to the double with the options the URL opener
// uses (one SDK retry, which is what recovers a lost connection).
func newClient(t testing.TB, d *servicebusdouble.Double) *azservicebus.Client {
	t.Helper()
	c, err := azservicebus.NewClientFromConnectionString(d.ConnectionString(), servicebus.ClientOptions())
	if err != nil {
		t.Fatalf("NewClientFromConnectionString: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// openPair opens a Topic and a Subscription on queue through c.
func openPair(t testing.TB, c *azservicebus.Client, queue string, opts *servicebus.Options) (*servicebus.Topic, *servicebus.Subscription) {
	t.Helper()
	ctx := context.Background()
	tp := openTopic(t, c, queue, opts)
	r, err := c.NewReceiverForQueue(queue, nil)
	if err != nil {
		t.Fatalf("NewReceiverForQueue: %v", err)
	}
	sub, err := servicebus.OpenSubscription(ctx, r, servicebus.Entity{Queue: queue}, opts)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	return tp, sub
}

// openSessionPair opens a Topic and a session Subscription on the
// session queue through c.
func openSessionPair(t testing.TB, c *azservicebus.Client, queue string, opts *servicebus.Options) (*servicebus.Topic, *servicebus.Subscription) {
	t.Helper()
	tp := openTopic(t, c, queue, opts)
	sub, err := servicebus.OpenSessionSubscription(context.Background(), c, servicebus.Entity{Queue: queue}, opts)
	if err != nil {
		t.Fatalf("OpenSessionSubscription: %v", err)
	}
	return tp, sub
}

// openTopic opens a Topic on queue through c.
func openTopic(t testing.TB, c *azservicebus.Client, queue string, opts *servicebus.Options) *servicebus.Topic {
	t.Helper()
	s, err := c.NewSender(queue, nil)
	if err != nil {
		t.Fatalf("NewSender: %v", err)
	}
	tp, err := servicebus.OpenTopic(context.Background(), s, servicebus.Entity{Queue: queue}, opts)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	return tp
}
