package sqs_test

// The adapter conformance suite (adapters/adaptertest) against fauxqs,
// started by TestMain (see fauxqs_test.go).
//
// Each subtest gets a fresh FIFO queue whose VisibilityTimeout is the
// suite's AckWait (whole seconds) and, when the suite asks for bounded
// deliveries, a fresh FIFO dead-letter queue and a RedrivePolicy with that
// maxReceiveCount. The window is SQS's fixed 5 minutes, not the suite's
// DedupWindow, so the "after the window" part of the dedup check is
// skipped (waiting 5 minutes is too long for a test).
//
// Where fauxqs differs from AWS, and how this copes:
//   - One message per group per ReceiveMessage: the suite's waits are
//     bounded by deliveries, not by receive calls, so it only slows down.
//   - A long poll whose HTTP request was abandoned (the consumer's context
//     was cancelled) still takes the next message that arrives, which
//     then reappears only after the visibility timeout. The harness uses
//     1-second long polls, so an abandoned poll is gone before the suite's
//     negative checks publish their marker after letting the redelivery
//     delay pass.
//
// The Restart check runs on a fauxqs of its own (the shared one is never
// stopped), which it stops and starts again on the same port. fauxqs keeps
// everything in memory, so the harness creates both queues again, by the
// same names and attributes, once it is back, and the check restarts only
// once everything published so far was handled (Restarter.Forgets). What
// it proves here is the outage: a publisher retrying through it within its
// policy and a consumer waiting it out and consuming what follows. That
// stored messages survive a restart is AWS's to keep, not something an
// in-memory emulator can show.

import (
	"context"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/localstack/fauxqs"
)

type harness struct{}

func (harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{OrdersGroups: true, WaitTimeout: 15 * time.Second}
}

func (harness) Open(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	c := needFauxqs(t)
	if cfg.Restartable {
		return openRestartable(ctx, t, cfg)
	}
	visibility := max(cfg.AckWait.Round(time.Second), time.Second)
	attrs := map[string]string{"VisibilityTimeout": strconv.Itoa(int(visibility / time.Second))}
	var dlq string
	if cfg.MaxDeliveries > 0 {
		dlq, _ = newQueue(t, c, nil)
		attrs["RedrivePolicy"] = `{"deadLetterTargetArn":"` + queueArn(t, c, dlq) + `","maxReceiveCount":` + strconv.Itoa(cfg.MaxDeliveries) + `}`
	}
	url, _ := newQueue(t, c, attrs)
	opts := &sqs.Options{WaitTime: time.Second}
	tp, err := sqs.OpenTopic(ctx, c, url, opts)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	sub, err := sqs.OpenSubscription(ctx, c, url, opts)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	ent := adaptertest.Entity{Topic: tp, Subscription: sub,
		AnotherSubscription: func(ctx context.Context) (driver.Subscription, error) {
			return sqs.OpenSubscription(ctx, c, url, opts)
		}}
	if dlq != "" {
		dead, err := sqs.OpenSubscription(ctx, c, dlq, nil)
		if err != nil {
			t.Fatalf("OpenSubscription on the DLQ: %v", err)
		}
		t.Cleanup(func() { dead.Close() })
		ent.DeadLetters = adaptertest.DeadLettersFrom(longPolls{dead})
	}
	return ent
}

// longPolls gives each Receive on the dead-letter queue the time of one
// long poll. The suite looks for dead letters with 200ms Receives, in
// which the adapter sends no request: the shortest wait it can send is
// 1s, and it leaves half a second for the answer.
type longPolls struct{ driver.Subscription }

func (l longPolls) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	return l.Subscription.Receive(ctx, n)
}

func TestConformance(t *testing.T) {
	needFauxqs(t)
	adaptertest.Run(t, harness{})
}

// openRestartable opens a queue and its dead-letter queue on a private
// fauxqs that the Restart check may stop and start. fauxqs forgets its
// queues when it stops; it is started again with an init file that
// creates both, with the attributes read from the first ones, before it
// answers any request, as a real SQS never loses a queue to a restart.
func openRestartable(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	p := startPrivateFauxqs(t)
	c := newClient(p.endpoint)
	base := fmt.Sprintf("t%d-restart", queueSeq.Add(1))
	visibility := max(cfg.AckWait.Round(time.Second), time.Second)
	dlq, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{
		QueueName: aws.String(base + "-dlq.fifo"), Attributes: map[string]string{"FifoQueue": "true"},
	})
	if err != nil {
		t.Fatalf("creating the dead-letter queue: %v", err)
	}
	attrs := map[string]string{
		"FifoQueue":         "true",
		"VisibilityTimeout": strconv.Itoa(int(visibility / time.Second)),
		"RedrivePolicy": `{"deadLetterTargetArn":"` + queueArn(t, c, aws.ToString(dlq.QueueUrl)) +
			`","maxReceiveCount":` + strconv.Itoa(max(cfg.MaxDeliveries, 1)) + `}`,
	}
	q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(base + ".fifo"), Attributes: attrs})
	if err != nil {
		t.Fatalf("creating the queue: %v", err)
	}
	url := aws.ToString(q.QueueUrl)
	init, err := json.Marshal(map[string]any{"queues": []map[string]any{
		{"name": base + "-dlq.fifo", "attributes": map[string]string{"FifoQueue": "true"}},
		{"name": base + ".fifo", "attributes": attrs},
	}})
	if err != nil {
		t.Fatal(err)
	}
	p.init = filepath.Join(t.TempDir(), "init.json")
	if err := os.WriteFile(p.init, init, 0o600); err != nil {
		t.Fatal(err)
	}
	p.check = func(ctx context.Context) error {
		// The queue must be back as it was: same URL, same redrive.
		out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
			QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
		})
		if err != nil {
			return fmt.Errorf("the queue did not come back with fauxqs: %w", err)
		}
		for _, k := range []string{"FifoQueue", "VisibilityTimeout", "RedrivePolicy"} {
			if out.Attributes[k] != attrs[k] {
				return fmt.Errorf("the queue came back with %s %q, not %q", k, out.Attributes[k], attrs[k])
			}
		}
		return nil
	}
	opts := &sqs.Options{WaitTime: time.Second}
	tp, err := sqs.OpenTopic(ctx, c, url, opts)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	sub, err := sqs.OpenSubscription(ctx, c, url, opts)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	return adaptertest.Entity{Topic: tp, Subscription: sub, Restart: &adaptertest.Restarter{
		Stop: p.stop, Start: p.start, Forgets: true,
	}}
}

// privateFauxqs is a fauxqs of one test's own, stopped at cleanup.
type privateFauxqs struct {
	port     int
	endpoint string
	init     string                          // the init file restarts use
	check    func(ctx context.Context) error // run after each restart

	mu  sync.Mutex
	emu *fauxqs.Emulator // nil while stopped
}

func startPrivateFauxqs(t *testing.T) *privateFauxqs {
	t.Helper()
	emu, err := fauxqs.StartWith(fauxqs.Options{})
	if err != nil {
		t.Fatalf("starting a private fauxqs: %v", err)
	}
	u, err := neturl.Parse(emu.Endpoint)
	if err == nil {
		var port int
		port, err = strconv.Atoi(u.Port())
		if err == nil {
			p := &privateFauxqs{port: port, endpoint: emu.Endpoint, emu: emu}
			t.Cleanup(func() { _ = p.stop(context.Background()) })
			return p
		}
	}
	emu.Stop()
	t.Fatalf("private fauxqs endpoint %s: %v", emu.Endpoint, err)
	return nil
}

func (p *privateFauxqs) stop(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.emu == nil {
		return nil
	}
	err := p.emu.Stop()
	p.emu = nil
	return err
}

func (p *privateFauxqs) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.emu != nil {
		return nil
	}
	emu, err := fauxqs.StartWith(fauxqs.Options{Port: p.port, Init: p.init})
	if err != nil {
		return err
	}
	p.emu = emu
	if emu.Endpoint != p.endpoint {
		return fmt.Errorf("fauxqs came back at %s, not %s", emu.Endpoint, p.endpoint)
	}
	if p.check != nil {
		return p.check(ctx)
	}
	return nil
}
