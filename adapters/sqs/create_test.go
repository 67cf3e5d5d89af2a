package sqs_test

// Tests of create=true (Options.Create) against fauxqs, started by TestMain
// (see fauxqs_test.go): the queue and its dead-letter queue are created
// only once the startup check passed, an existing queue is used and never
// changed, messages past max_deliveries reach the dead-letter queue by the
// redrive policy the adapter set, and an AWS endpoint is refused before
// any request. TestCreateRemovesItsDeadLetterQueue wraps the real client
// in one whose CreateQueue fails for the main queue, a failure fauxqs has
// no way to produce on demand. The fauxqs differences listed in
// fauxqs_test.go do not matter here: every wait is a loop with a deadline.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// freshName is a FIFO queue name no queue has yet. The queue and its
// dead-letter queue are deleted when the test ends, if they exist.
func freshName(t *testing.T, c *awssqs.Client) string {
	t.Helper()
	name := fmt.Sprintf("t%d-create.fifo", queueSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range []string{name, sqs.DeadLetterName(name)} {
			if out, err := c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(n)}); err == nil {
				_, _ = c.DeleteQueue(ctx, &awssqs.DeleteQueueInput{QueueUrl: out.QueueUrl})
			}
		}
	})
	return name
}

// createURL is an sqs:// URL with create=true for the queue name on the
// shared fauxqs, with extra parameters.
func createURL(name, extra string) string {
	return "sqs://" + name + "?region=" + testRegion + "&endpoint=" + fauxqsEndpoint + "&create=true" + extra
}

// queueURLOf returns the URL of the queue named name, or "" when fauxqs
// has no such queue.
func queueURLOf(t *testing.T, c *awssqs.Client, name string) string {
	t.Helper()
	out, err := c.GetQueueUrl(ctxFor(t, 10*time.Second), &awssqs.GetQueueUrlInput{QueueName: aws.String(name)})
	var missing *types.QueueDoesNotExist
	switch {
	case errors.As(err, &missing):
		return ""
	case err != nil:
		t.Fatalf("GetQueueUrl %s: %v", name, err)
	}
	return aws.ToString(out.QueueUrl)
}

// wantNothingCreated fails unless neither the queue nor its dead-letter
// queue exists.
func wantNothingCreated(t *testing.T, c *awssqs.Client, name string) {
	t.Helper()
	for _, n := range []string{name, sqs.DeadLetterName(name)} {
		if u := queueURLOf(t, c, n); u != "" {
			t.Errorf("queue %s exists after a refused open", n)
		}
	}
}

// createdAttrs reads the attributes of the queue and of its dead-letter
// queue, failing unless both exist.
func createdAttrs(t *testing.T, c *awssqs.Client, name string) (queue, dlq map[string]string) {
	t.Helper()
	read := func(n string) map[string]string {
		u := queueURLOf(t, c, n)
		if u == "" {
			t.Fatalf("queue %s was not created", n)
		}
		out, err := c.GetQueueAttributes(ctxFor(t, 10*time.Second), &awssqs.GetQueueAttributesInput{
			QueueUrl: aws.String(u), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
		})
		if err != nil {
			t.Fatalf("GetQueueAttributes %s: %v", n, err)
		}
		return out.Attributes
	}
	return read(name), read(sqs.DeadLetterName(name))
}

// redrive parses a RedrivePolicy attribute.
func redrive(t *testing.T, attr string) (target string, maxReceive int) {
	t.Helper()
	var rp struct {
		Target string          `json:"deadLetterTargetArn"`
		Max    json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(attr), &rp); err != nil {
		t.Fatalf("RedrivePolicy %q: %v", attr, err)
	}
	if _, err := fmt.Sscan(strings.Trim(string(rp.Max), `"`), &maxReceive); err != nil {
		t.Fatalf("RedrivePolicy maxReceiveCount %s: %v", rp.Max, err)
	}
	return rp.Target, maxReceive
}

func newGuard(t *testing.T, ttl time.Duration) *dedup.Guard {
	t.Helper()
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestCreateByURL: one URL makes the FIFO queue, its FIFO dead-letter
// queue and the redrive policy between them, with the URL's visibility
// timeout and max_deliveries or the documented defaults; a second open
// uses what the first made, and the flow runs on it.
func TestCreateByURL(t *testing.T) {
	c := needFauxqs(t)
	for _, tc := range []struct {
		name        string
		extra       string
		visibility  string
		maxReceive  int
		wantRedeliv window.RedeliveryPolicy
	}{
		{"defaults", "", "30", sqs.DefaultMaxReceiveCount, window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * time.Second}},
		{"from the URL", "&ack_wait=7s&max_deliveries=3", "7", 3, window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 7 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := freshName(t, c)
			raw := createURL(name, tc.extra)
			// The consumer opens first, with a dedup Guard whose TTL must
			// cover the redelivery of the queue it is about to create.
			con, err := dedupq.OpenConsumer(ctxFor(t, 20*time.Second), raw, dedupq.ConsumerOptions{Dedup: newGuard(t, time.Hour)})
			if err != nil {
				t.Fatalf("OpenConsumer: %v", err)
			}
			defer con.Close(t.Context())
			if r := con.Redelivery(); r.MaxDeliveries != tc.wantRedeliv.MaxDeliveries || r.AckWait != tc.wantRedeliv.AckWait {
				t.Errorf("Redelivery = %v, want %v", r, tc.wantRedeliv)
			}
			q, dlq := createdAttrs(t, c, name)
			if q["FifoQueue"] != "true" || dlq["FifoQueue"] != "true" {
				t.Errorf("FifoQueue: queue %q, dead-letter queue %q; want both true", q["FifoQueue"], dlq["FifoQueue"])
			}
			if q["VisibilityTimeout"] != tc.visibility {
				t.Errorf("VisibilityTimeout %q, want %q", q["VisibilityTimeout"], tc.visibility)
			}
			target, maxReceive := redrive(t, q["RedrivePolicy"])
			if target != dlq["QueueArn"] || maxReceive != tc.maxReceive {
				t.Errorf("RedrivePolicy %s, want target %s and maxReceiveCount %d", q["RedrivePolicy"], dlq["QueueArn"], tc.maxReceive)
			}
			if _, ok := dlq["RedrivePolicy"]; ok {
				t.Errorf("the dead-letter queue has a RedrivePolicy of its own: %s", dlq["RedrivePolicy"])
			}

			// A second open (a publisher now) uses the same queue; fauxqs
			// holds no other queue of that name, and nothing changed.
			pub, err := dedupq.OpenPublisher(ctxFor(t, 20*time.Second), raw+"&group=g", dedupq.PublisherOptions{})
			if err != nil {
				t.Fatalf("second open: %v", err)
			}
			defer pub.Close(context.Background())
			if q2, _ := createdAttrs(t, c, name); q2["RedrivePolicy"] != q["RedrivePolicy"] || q2["QueueArn"] != q["QueueArn"] || q2["CreatedTimestamp"] != q["CreatedTimestamp"] {
				t.Errorf("the second open changed the queue: %v, then %v", q, q2)
			}
			list, err := c.ListQueues(ctxFor(t, 10*time.Second), &awssqs.ListQueuesInput{QueueNamePrefix: aws.String(strings.TrimSuffix(name, ".fifo"))})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.QueueUrls) != 2 {
				t.Errorf("queues named after %s: %v, want the queue and its dead-letter queue", name, list.QueueUrls)
			}

			// The flow runs on what was created.
			if _, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: "m1", Body: []byte("b")}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			var got []string
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			// Run returns once the delivery is settled: the queue outlives
			// the ack.
			err = con.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
				got = append(got, d.Message.ID)
				cancel()
				return nil
			})
			if err != nil {
				t.Errorf("Run: %v", err)
			}
			if len(got) != 1 || got[0] != "m1" {
				t.Errorf("delivered %q within 20s, want m1", got)
			}
		})
	}
}

// TestCreateRefusedCheckLeavesNothing: when the startup check refuses the
// open, neither the queue nor its dead-letter queue is created; the same
// open with the policy fixed then creates both.
func TestCreateRefusedCheckLeavesNothing(t *testing.T) {
	c := needFauxqs(t)
	name := freshName(t, c)
	hour := window.RetryPolicy{MaxAttempts: 20, InitialBackoff: time.Second, MaxBackoff: 5 * time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}
	for _, tc := range []struct {
		name string
		open func() error
	}{
		{"publisher retries outlive the window", func() error {
			_, err := dedupq.OpenPublisher(ctxFor(t, 20*time.Second), createURL(name, ""), dedupq.PublisherOptions{Retry: &hour})
			return err
		}},
		// 1000 deliveries of 12h each: no Guard of an hour covers that.
		{"redelivery outlives the dedup TTL", func() error {
			_, err := dedupq.OpenConsumer(ctxFor(t, 20*time.Second), createURL(name, "&max_deliveries=1000&ack_wait=12h"),
				dedupq.ConsumerOptions{Dedup: newGuard(t, time.Hour)})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.open()
			if !errors.Is(err, window.ErrUnsafeRetry) {
				t.Fatalf("open: %v, want ErrUnsafeRetry", err)
			}
			wantNothingCreated(t, c, name)
		})
	}
	con, err := dedupq.OpenConsumer(ctxFor(t, 20*time.Second), createURL(name, ""), dedupq.ConsumerOptions{Dedup: newGuard(t, time.Hour)})
	if err != nil {
		t.Fatalf("the open with the policy fixed: %v", err)
	}
	con.Close(t.Context())
	createdAttrs(t, c, name)
}

// TestCreatePlanIsWhatIsCreated: before Provision, a Subscription reports
// the queue as it will be created (the startup check runs on that), and
// after it the same, read from fauxqs; Provision is idempotent, and a
// Topic opened meanwhile finds the queue and creates nothing.
func TestCreatePlanIsWhatIsCreated(t *testing.T) {
	c := needFauxqs(t)
	name := freshName(t, c)
	ctx := ctxFor(t, 20*time.Second)
	opts := &sqs.Options{Create: true, MaxReceiveCount: 4, VisibilityTimeout: 9 * time.Second, WaitTime: time.Second}
	sub, err := sqs.OpenSubscription(ctx, c, name, opts)
	if err != nil {
		t.Fatalf("OpenSubscription: %v", err)
	}
	defer sub.Close()
	tp, err := sqs.OpenTopic(ctx, c, name, opts)
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	defer tp.Close()
	wantNothingCreated(t, c, name)
	plannedR, err := sub.Redelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	plannedW, err := tp.Window(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Provision(ctx); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	if err := sub.Provision(ctx); err != nil {
		t.Fatalf("Provision again: %v", err)
	}
	liveR, err := sub.Redelivery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	liveW, err := tp.Window(ctx) // the Topic finds the queue the Subscription made
	if err != nil {
		t.Fatal(err)
	}
	if plannedR.String() != liveR.String() || plannedR.MaxDeliveries != 4 || plannedR.AckWait != 9*time.Second {
		t.Errorf("redelivery planned %v, live %v; want both 4 deliveries of 9s", plannedR, liveR)
	}
	if plannedW.Duration != liveW.Duration || plannedW.Kind != liveW.Kind ||
		plannedW.Source != window.SourceDocumented || !strings.HasSuffix(plannedW.Scope, ", to be created") ||
		liveW.Source != window.SourceDiscovered || plannedW.Scope != liveW.Scope+", to be created" {
		t.Errorf("window planned %v, live %v; want the same window, documented and to be created before, discovered after", plannedW, liveW)
	}
	if tp.QueueInfo().URL == "" || tp.QueueInfo().URL != sub.QueueInfo().URL {
		t.Errorf("the Topic uses %q, the Subscription %q", tp.QueueInfo().URL, sub.QueueInfo().URL)
	}
	if err := tp.Provision(ctx); err != nil {
		t.Fatalf("Topic.Provision on the existing queue: %v", err)
	}
}

// TestCreateWithoutPortableLayer: a Topic used on its own creates the
// queue on its first SendBatch.
func TestCreateWithoutPortableLayer(t *testing.T) {
	c := needFauxqs(t)
	name := freshName(t, c)
	ctx := ctxFor(t, 20*time.Second)
	tp, err := sqs.OpenTopic(ctx, c, name, &sqs.Options{Create: true, DefaultGroup: "g"})
	if err != nil {
		t.Fatalf("OpenTopic: %v", err)
	}
	defer tp.Close()
	res, err := tp.SendBatch(ctx, []*driver.Message{{ID: "m1", Body: []byte("b")}})
	if err != nil || res[0].Err != nil {
		t.Fatalf("SendBatch: %v %+v", err, res)
	}
	createdAttrs(t, c, name)
}

// TestCreatePastMaxDeliveries: a message whose handler keeps failing is
// handled max_deliveries times, then SQS's redrive moves it to the
// dead-letter queue create=true made.
func TestCreatePastMaxDeliveries(t *testing.T) {
	c := needFauxqs(t)
	name := freshName(t, c)
	raw := createURL(name, "&max_deliveries=2&group=g&wait_time=1s")
	con, err := dedupq.OpenConsumer(ctxFor(t, 20*time.Second), raw, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	defer con.Close(t.Context())
	pub, err := dedupq.OpenPublisher(ctxFor(t, 20*time.Second), raw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("OpenPublisher: %v", err)
	}
	defer pub.Close(context.Background())
	if _, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: "poison", Body: []byte("never handled")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	var handled atomic.Int32
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- con.Run(ctx, func(context.Context, *dedupq.Delivery) error {
			handled.Add(1)
			return errors.New("transient, as far as the consumer knows") // nacked: visible again at once
		})
	}()
	dlq := queueURLOf(t, c, sqs.DeadLetterName(name))
	var dead *types.Message
	deadline := time.Now().Add(30 * time.Second)
	for dead == nil && time.Now().Before(deadline) {
		out, err := c.ReceiveMessage(ctxFor(t, 10*time.Second), &awssqs.ReceiveMessageInput{
			QueueUrl: aws.String(dlq), WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageDeduplicationId},
		})
		if err != nil {
			t.Fatalf("ReceiveMessage on the dead-letter queue: %v", err)
		}
		if len(out.Messages) > 0 {
			dead = &out.Messages[0]
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if dead == nil {
		t.Fatalf("the message did not reach the dead-letter queue within 30s (handled %d times)", handled.Load())
	}
	if got := aws.ToString(dead.Body); got != "never handled" || dead.Attributes["MessageDeduplicationId"] != "poison" {
		t.Errorf("dead-lettered body %q, dedup ID %q", got, dead.Attributes["MessageDeduplicationId"])
	}
	if n := handled.Load(); n != 2 {
		t.Errorf("handled %d times, want max_deliveries = 2", n)
	}
}

// TestCreateUsesExistingQueueUnchanged: an existing queue is used when it
// fits and refused, unchanged, when it does not.
func TestCreateUsesExistingQueueUnchanged(t *testing.T) {
	c := needFauxqs(t)
	dlqURL, _ := newQueue(t, c, nil)
	withRedrive := `{"deadLetterTargetArn":"` + queueArn(t, c, dlqURL) + `","maxReceiveCount":5}`
	for _, tc := range []struct {
		name    string
		attrs   map[string]string
		extra   string
		wantErr string // empty: opens
	}{
		{"fits", map[string]string{"RedrivePolicy": withRedrive, "VisibilityTimeout": "12"}, "", ""},
		{"fits max_deliveries", map[string]string{"RedrivePolicy": withRedrive}, "&max_deliveries=5", ""},
		{"no redrive policy", nil, "", "exists without a RedrivePolicy"},
		{"other maxReceiveCount", map[string]string{"RedrivePolicy": withRedrive}, "&max_deliveries=3", "maxReceiveCount of 5, not the 3 asked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, name := newQueue(t, c, tc.attrs)
			before := readAll(t, c, url)
			con, err := dedupq.OpenConsumer(ctxFor(t, 20*time.Second), createURL(name, tc.extra), dedupq.ConsumerOptions{})
			if err == nil {
				con.Close(t.Context())
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("open: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("open: %v, want an error saying %q", err, tc.wantErr)
			}
			t.Log(err)
			after := readAll(t, c, url)
			for _, k := range []string{"VisibilityTimeout", "RedrivePolicy", "LastModifiedTimestamp"} {
				if before[k] != after[k] {
					t.Errorf("%s changed from %q to %q", k, before[k], after[k])
				}
			}
			if u := queueURLOf(t, c, sqs.DeadLetterName(name)); u != "" {
				t.Errorf("a dead-letter queue %s was created for an existing queue", sqs.DeadLetterName(name))
			}
		})
	}
}

// readAll reads every attribute of the queue at url.
func readAll(t *testing.T, c *awssqs.Client, url string) map[string]string {
	t.Helper()
	out, err := c.GetQueueAttributes(ctxFor(t, 10*time.Second), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	})
	if err != nil {
		t.Fatalf("GetQueueAttributes: %v", err)
	}
	return out.Attributes
}

// failingCreate is the fauxqs client with a CreateQueue that fails for
// one queue name, as a create can fail on a real emulator (it went away,
// the name was taken meanwhile with other attributes).
type failingCreate struct {
	*awssqs.Client
	name string
}

func (f failingCreate) CreateQueue(ctx context.Context, in *awssqs.CreateQueueInput, opts ...func(*awssqs.Options)) (*awssqs.CreateQueueOutput, error) {
	if aws.ToString(in.QueueName) == f.name {
		return nil, errors.New("injected: CreateQueue failed")
	}
	return f.Client.CreateQueue(ctx, in, opts...)
}

// TestCreateRemovesItsDeadLetterQueue: when the queue cannot be created,
// the dead-letter queue created for it moments ago is removed, and one
// that existed before is left alone.
func TestCreateRemovesItsDeadLetterQueue(t *testing.T) {
	c := needFauxqs(t)
	for _, existed := range []bool{false, true} {
		t.Run(fmt.Sprintf("dead-letter queue existed %v", existed), func(t *testing.T) {
			name := freshName(t, c)
			if existed {
				if _, err := c.CreateQueue(ctxFor(t, 10*time.Second), &awssqs.CreateQueueInput{
					QueueName: aws.String(sqs.DeadLetterName(name)), Attributes: map[string]string{"FifoQueue": "true"},
				}); err != nil {
					t.Fatal(err)
				}
			}
			api := failingCreate{Client: c, name: name}
			tp, err := sqs.OpenTopicAPI(ctxFor(t, 10*time.Second), api, name, &sqs.Options{Create: true})
			if err != nil {
				t.Fatalf("OpenTopic: %v", err)
			}
			defer tp.Close()
			if err := tp.Provision(ctxFor(t, 10*time.Second)); err == nil || !strings.Contains(err.Error(), "injected") {
				t.Fatalf("Provision: %v, want the injected failure", err)
			}
			if got := queueURLOf(t, c, sqs.DeadLetterName(name)) != ""; got != existed {
				t.Errorf("dead-letter queue exists after the failed create: %v, want %v", got, existed)
			}
		})
	}
}

// TestCreateRefusedForAWS: create=true is refused, before any request,
// without an emulator endpoint, with one of AWS's, and for what it cannot
// create; the reason names the attributes to set up on AWS instead.
func TestCreateRefusedForAWS(t *testing.T) {
	for _, raw := range []string{
		"sqs://orders.fifo?region=us-east-1&create=true",
		"sqs://orders.fifo?region=us-east-1&create=true&endpoint=https://sqs.us-east-1.amazonaws.com",
		"sqs://orders.fifo?create=true&endpoint=https://sqs.us-east-1.api.aws",
		"sqs://orders.fifo?create=true&endpoint=https://vpce-0a1b-abcd.sqs.us-east-1.vpce.amazonaws.com",
		"sqs://orders.fifo?create=true&endpoint=https://sqs.cn-north-1.amazonaws.com.cn",
		"sqs://orders.fifo?create=true&endpoint=https://SQS.US-EAST-1.AMAZONAWS.COM.",
		"sqs://sqs.us-east-1.amazonaws.com/123456789012/orders.fifo?create=true",
		"sqs://127.0.0.1:4566/000000000000/orders.fifo?create=true&endpoint=http://127.0.0.1:4566",
		"sqs://orders?create=true&endpoint=http://127.0.0.1:4566",
		"sqs://" + strings.Repeat("a", 72) + ".fifo?create=true&endpoint=http://127.0.0.1:4566",
	} {
		t.Run(raw, func(t *testing.T) {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, _, err = sqs.ParseURL(u)
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != "create" {
				t.Fatalf("err = %v, want a ParamError on create", err)
			}
			t.Log(err)
		})
	}
	u, _ := url.Parse("sqs://orders.fifo?create=true&endpoint=https://sqs.us-east-1.amazonaws.com")
	_, _, _, _, err := sqs.ParseURL(u)
	for _, want := range []string{"emulators only", "infrastructure as code", "FifoQueue=true", "VisibilityTimeout", "RedrivePolicy", "deadLetterTargetArn", "maxReceiveCount"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not mention %q: %v", want, err)
		}
	}

	// The same through the Go API, for a client bound for AWS. The client
	// points at no reachable address: the refusal must come first.
	for _, endpoint := range []string{"", "https://sqs.eu-west-1.amazonaws.com"} {
		c := awssqs.New(awssqs.Options{Region: "eu-west-1", BaseEndpoint: aws.String(endpoint)})
		if endpoint == "" {
			c = awssqs.New(awssqs.Options{Region: "eu-west-1"})
		}
		ctx := ctxFor(t, 5*time.Second)
		if _, err := sqs.OpenTopic(ctx, c, "orders.fifo", &sqs.Options{Create: true}); err == nil || !strings.Contains(err.Error(), "emulators only") {
			t.Errorf("OpenTopic with Create through %q: %v, want the refusal", endpoint, err)
		}
		if _, err := sqs.OpenSubscription(ctx, c, "orders.fifo", &sqs.Options{Create: true}); err == nil || !strings.Contains(err.Error(), "emulators only") {
			t.Errorf("OpenSubscription with Create through %q: %v, want the refusal", endpoint, err)
		}
	}
}

// racingCreate is the fauxqs client with a CreateQueue that lets another
// party create the queue named name first, with attrs, as a process
// racing this one would.
type racingCreate struct {
	*awssqs.Client
	name  string
	attrs map[string]string
}

func (r racingCreate) CreateQueue(ctx context.Context, in *awssqs.CreateQueueInput, opts ...func(*awssqs.Options)) (*awssqs.CreateQueueOutput, error) {
	if aws.ToString(in.QueueName) == r.name {
		if _, err := r.Client.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: in.QueueName, Attributes: r.attrs}); err != nil {
			return nil, fmt.Errorf("the racing create: %w", err)
		}
	}
	return r.Client.CreateQueue(ctx, in, opts...)
}

// TestCreateRace: a queue another process created between the check and
// the create, with other attributes, is used as it is when it fits and
// refused when it does not; either way it is left as that process made it.
// When theirs is refused, the dead-letter queue made for ours is removed
// (theirs does not use it); when theirs is used, it stays, unused, as
// after any open that succeeded.
func TestCreateRace(t *testing.T) {
	c := needFauxqs(t)
	dlqURL, _ := newQueue(t, c, nil)
	theirRedrive := `{"deadLetterTargetArn":"` + queueArn(t, c, dlqURL) + `","maxReceiveCount":5}`
	for _, tc := range []struct {
		name    string
		attrs   map[string]string
		wantErr string
	}{
		{"theirs fits", map[string]string{"FifoQueue": "true", "VisibilityTimeout": "12", "RedrivePolicy": theirRedrive}, ""},
		{"theirs has no redrive policy", map[string]string{"FifoQueue": "true", "VisibilityTimeout": "12"}, "exists without a RedrivePolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := freshName(t, c)
			api := racingCreate{Client: c, name: name, attrs: tc.attrs}
			ctx := ctxFor(t, 10*time.Second)
			sub, err := sqs.OpenSubscriptionAPI(ctx, api, name, &sqs.Options{Create: true})
			if err != nil {
				t.Fatalf("OpenSubscription: %v", err)
			}
			defer sub.Close()
			err = sub.Provision(ctx)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Provision: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Provision: %v, want an error saying %q", err, tc.wantErr)
			}
			t.Log(err)
			got := readAll(t, c, queueURLOf(t, c, name))
			if got["VisibilityTimeout"] != "12" || got["RedrivePolicy"] != tc.attrs["RedrivePolicy"] {
				t.Errorf("their queue was changed: %v", got)
			}
			if dlq := queueURLOf(t, c, sqs.DeadLetterName(name)) != ""; dlq != (err == nil) {
				t.Errorf("the dead-letter queue made for this open exists: %v, want %v", dlq, err == nil)
			}
			if err == nil {
				if r, _ := sub.Redelivery(ctx); r.AckWait != 12*time.Second || r.MaxDeliveries != 5 {
					t.Errorf("Redelivery = %v, want theirs: 5 deliveries of 12s", r)
				}
			}
		})
	}
}
