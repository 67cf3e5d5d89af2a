package sqs_test

// Tests of sqs:// URLs. TestParseURL and TestURLParamErrors talk to
// nothing; TestOpenByURL opens queues on fauxqs (started by TestMain, see
// fauxqs_test.go) through the root registry, with credentials from the
// environment as the standard AWS chain reads them (fauxqs checks no
// signature, so TestMain's static test keys do).

import (
	"errors"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		raw                     string
		queue, region, endpoint string
		opts                    sqs.Options
	}{
		{raw: "sqs://orders.fifo?region=eu-west-1", queue: "orders.fifo", region: "eu-west-1"},
		{raw: "sqs://orders.fifo", queue: "orders.fifo"},
		{
			raw:   "sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
			queue: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo", region: "eu-west-1",
		},
		{
			raw:   "sqs://sqs.us-east-1.localhost:4566/000000000000/q.fifo?endpoint=http://127.0.0.1:4566&region=us-east-1",
			queue: "http://sqs.us-east-1.localhost:4566/000000000000/q.fifo", region: "us-east-1", endpoint: "http://127.0.0.1:4566",
		},
		{
			raw:   "sqs://q.fifo?group=default&hash_long_ids=true&ack_wait=45s&wait_time=5s&backoff=1s,10s&terminate=delete&delete_linger=0",
			queue: "q.fifo",
			opts: sqs.Options{DefaultGroup: "default", HashLongIDs: true, VisibilityTimeout: 45 * time.Second, WaitTime: 5 * time.Second,
				NackBackoff: []time.Duration{time.Second, 10 * time.Second}, TerminateDeletes: true, DeleteLinger: -1},
		},
		{raw: "sqs://q.fifo?terminate=dlq&delete_linger=20ms", queue: "q.fifo", opts: sqs.Options{DeleteLinger: 20 * time.Millisecond}},
		{
			raw:   "sqs://q.fifo?endpoint=http://127.0.0.1:4566&create=true&max_deliveries=7",
			queue: "q.fifo", endpoint: "http://127.0.0.1:4566", opts: sqs.Options{Create: true, MaxReceiveCount: 7},
		},
		{raw: "sqs://q.fifo?create=false", queue: "q.fifo"},
		{raw: "sqs://q.fifo?max_deliveries=1000", queue: "q.fifo", opts: sqs.Options{MaxReceiveCount: 1000}},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			u, err := url.Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			queue, region, endpoint, opts, err := sqs.ParseURL(u)
			if err != nil {
				t.Fatalf("ParseURL: %v", err)
			}
			if queue != tc.queue || region != tc.region || endpoint != tc.endpoint {
				t.Errorf("got queue %q region %q endpoint %q; want %q %q %q", queue, region, endpoint, tc.queue, tc.region, tc.endpoint)
			}
			if !equalOptions(*opts, tc.opts) {
				t.Errorf("options %+v, want %+v", *opts, tc.opts)
			}
		})
	}
}

func equalOptions(a, b sqs.Options) bool {
	return a.DefaultGroup == b.DefaultGroup && a.HashLongIDs == b.HashLongIDs &&
		a.VisibilityTimeout == b.VisibilityTimeout && a.WaitTime == b.WaitTime &&
		slices.Equal(a.NackBackoff, b.NackBackoff) && a.TerminateDeletes == b.TerminateDeletes &&
		a.DeleteLinger == b.DeleteLinger && a.Create == b.Create && a.MaxReceiveCount == b.MaxReceiveCount
}

func TestURLParamErrors(t *testing.T) {
	for _, tc := range []struct {
		raw, param string
	}{
		{"sqs://", "queue"},
		{"sqs://bad!name", "queue"},
		{"sqs://host/only-one-part", "queue"},
		{"sqs://host/a/b/c", "queue"},
		{"sqs://key:s3cr3t@q.fifo", "credentials"},
		{"sqs://q.fifo?regoin=eu-west-1", "regoin"},
		{"sqs://q.fifo?region=EU_WEST", "region"},
		{"sqs://q.fifo?region=a&region=b", "region"},
		{"sqs://q.fifo?endpoint=localhost:4566", "endpoint"},
		{"sqs://q.fifo?endpoint=ftp://x", "endpoint"},
		// The SDK quotes the endpoint and the queue URL's host in its errors.
		{"sqs://q.fifo?endpoint=http://key:s3cr3t@127.0.0.1:4566", "endpoint"},
		{"sqs://q.fifo?endpoint=http://127.0.0.1:4566/?X-Amz-Security-Token=s3cr3t", "endpoint"},
		{"sqs://h;key=s3cr3t/000000000000/q.fifo", "queue"},
		{"sqs://q.fifo?aws_secret_access_key=s3cr3t", "aws_secret_access_key"},
		{"sqs://q.fifo?group=a%20b", "group"},
		{"sqs://q.fifo?hash_long_ids=yes-please", "hash_long_ids"},
		{"sqs://q.fifo?ack_wait=1500ms", "ack_wait"},
		{"sqs://q.fifo?ack_wait=13h", "ack_wait"},
		{"sqs://q.fifo?wait_time=21s", "wait_time"},
		{"sqs://q.fifo?wait_time=500ms", "wait_time"},
		{"sqs://q.fifo?wait_time=soon", "wait_time"},
		{"sqs://q.fifo?backoff=1s,x", "backoff"},
		{"sqs://q.fifo?terminate=never", "terminate"},
		{"sqs://q.fifo?delete_linger=5s", "delete_linger"},
		{"sqs://q.fifo?endpoint=http://127.0.0.1:4566&create=maybe", "create"},
		{"sqs://q.fifo?max_deliveries=0", "max_deliveries"},
		{"sqs://q.fifo?max_deliveries=1001", "max_deliveries"},
		{"sqs://q.fifo?max_deliveries=five", "max_deliveries"},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			u, err := url.Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			_, _, _, _, err = sqs.ParseURL(u)
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param {
				t.Fatalf("err = %v, want a ParamError on %q", err, tc.param)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error shows a secret: %v", err)
			}
			t.Log(err)
		})
	}
}

func TestRegisteredAndMissingRegion(t *testing.T) {
	if !slices.Contains(dedupq.DefaultURLMux().Schemes(), "sqs") {
		t.Fatalf("sqs is not registered: %v", dedupq.DefaultURLMux().Schemes())
	}
	// No region in the URL, the environment or a profile: refused before
	// any request, naming the parameter.
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	_, err := dedupq.OpenPublisher(t.Context(), "sqs://orders.fifo?endpoint=http://127.0.0.1:1", dedupq.PublisherOptions{})
	var pe *dedupq.ParamError
	if !errors.As(err, &pe) || pe.Param != "region" {
		t.Fatalf("err = %v, want a ParamError on region", err)
	}
}

func TestOpenByURL(t *testing.T) {
	c := needFauxqs(t)
	queueURL, name := newQueue(t, c, map[string]string{"VisibilityTimeout": "40"})
	u, err := url.Parse(queueURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, raw string
	}{
		{"queue name", "sqs://" + name + "?region=" + testRegion + "&endpoint=" + fauxqsEndpoint + "&group=g"},
		{"queue URL", "sqs://" + u.Host + u.Path + "?region=" + testRegion + "&endpoint=" + fauxqsEndpoint + "&group=g"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := dedupq.OpenPublisher(ctxFor(t, 10*time.Second), tc.raw, dedupq.PublisherOptions{})
			if err != nil {
				t.Fatalf("OpenPublisher: %v", err)
			}
			defer pub.Close(t.Context())
			if w := pub.Window(); w.Backend != "sqs" || w.Duration != 5*time.Minute {
				t.Errorf("Window = %v", w)
			}
			if _, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: strings.ReplaceAll(tc.name, " ", "-"), Body: []byte("b")}); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			con, err := dedupq.OpenConsumer(ctxFor(t, 10*time.Second), tc.raw, dedupq.ConsumerOptions{})
			if err != nil {
				t.Fatalf("OpenConsumer: %v", err)
			}
			defer con.Close(t.Context())
			if r := con.Redelivery(); r.AckWait != 40*time.Second || !r.Unlimited() {
				t.Errorf("Redelivery = %v, want 40s unlimited", r)
			}
		})
	}
	// Opening a missing queue by name fails with SQS's answer.
	_, err = dedupq.OpenPublisher(ctxFor(t, 10*time.Second), "sqs://missing.fifo?region="+testRegion+"&endpoint="+fauxqsEndpoint, dedupq.PublisherOptions{})
	if err == nil {
		t.Fatal("opening a missing queue succeeded")
	}
}

// A Topic and a Subscription opened by URL own the SDK client the opener
// made, and Close closes its keep-alive connections: left open, each held
// a socket and two goroutines until the transport's 90s idle timeout (the
// chaos program's leak check found them). The connections run through a
// counting proxy to fauxqs, which sees each one close.
func TestCloseByURLClosesConnections(t *testing.T) {
	c := needFauxqs(t)
	_, name := newQueue(t, c, nil)
	proxy := newConnCounter(t, strings.TrimPrefix(fauxqsEndpoint, "http://"))
	raw := "sqs://" + name + "?region=" + testRegion + "&endpoint=http://" + proxy.addr + "&group=g&wait_time=0s"
	pub, err := dedupq.OpenPublisher(ctxFor(t, 10*time.Second), raw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("OpenPublisher: %v", err)
	}
	if _, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: "a", Body: []byte("b")}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	con, err := dedupq.OpenConsumer(ctxFor(t, 10*time.Second), raw, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	if proxy.open() == 0 {
		t.Fatal("no connection went through the proxy")
	}
	if err := pub.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := con.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for proxy.open() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d connection(s) still open 5s after Close", proxy.open())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// connCounter forwards TCP connections to target and counts those the
// client has not closed.
type connCounter struct {
	addr string
	n    atomic.Int64
}

func (p *connCounter) open() int64 { return p.n.Load() }

func newConnCounter(t *testing.T, target string) *connCounter {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &connCounter{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			p.n.Add(1)
			go func() {
				defer p.n.Add(-1)
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(in, out) }()
				_, _ = io.Copy(out, in) // returns when the client closes
			}()
		}
	}()
	return p
}
