// Talks to: the in-memory broker only, through mem:// URLs on the real
// clock; no services.
package mem_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
)

var runs atomic.Int64

func TestURLPublisherAndConsumerMeet(t *testing.T) {
	ctx := t.Context()
	// URL brokers live as long as the process: a queue of its own per run
	// keeps -count=N honest.
	name := fmt.Sprintf("url-meet-%d", runs.Add(1))
	raw := "mem://" + name + "?window=2m&ack_wait=30s&max_deliveries=5&backoff=1s,5s"
	pub, err := dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	// A consumer may leave the parameters out: it reaches the same queue.
	con, err := dedupq.OpenConsumer(ctx, "mem://"+name, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer con.Close(ctx)
	if w := pub.Window(); w.Duration != 2*time.Minute || w.Backend != "mem" {
		t.Errorf("Window = %+v, want mem's 2m", w)
	}
	if r := con.Redelivery(); r.AckWait != 30*time.Second || r.MaxDeliveries != 5 || len(r.Backoff) != 2 {
		t.Errorf("Redelivery = %+v", r)
	}
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "o-1", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	b := mem.URLBroker(name)
	if b == nil || b.Stats(name).Stored != 1 {
		t.Fatalf("URLBroker did not see the publish")
	}
	runCtx, stop := context.WithCancel(ctx)
	got := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
			got <- d.Message.ID
			return nil
		})
	}()
	select {
	case id := <-got:
		if id != "o-1" {
			t.Errorf("delivered %q, want o-1", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the consumer opened by URL never received the message")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestURLParamErrors(t *testing.T) {
	// The first open fixes the queue's parameters.
	p, err := dedupq.OpenPublisher(t.Context(), "mem://url-fixed?window=2m", dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Close(t.Context())
	cases := []struct {
		url, param string
	}{
		{"mem://url-bad?colour=blue", "colour"},
		{"mem://url-bad?window=soon", "window"},
		{"mem://url-bad?window=-1s", "window"},
		{"mem://url-bad?max_deliveries=x", "max_deliveries"},
		{"mem://url-bad?backoff=1s,,", "backoff"},
		{"mem://url-bad?lost_ack=2", "lost_ack"},
		{"mem://url-bad?ack_wait=1s&ack_wait=2s", "ack_wait"},
		{"mem://?window=1m", "name"},
		{"mem://url-bad/extra", "name"},
		{"mem://url-bad;token=x", "name"},
		{"mem://url-bad?token=x", "token"},
		{"mem://url-fixed?window=3m", "window"},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			_, err := dedupq.OpenConsumer(t.Context(), tc.url, dedupq.ConsumerOptions{})
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != tc.param {
				t.Fatalf("error %v, want a *dedupq.ParamError for %q", err, tc.param)
			}
		})
	}
	if mem.URLBroker("url-bad") != nil {
		t.Error("a refused URL created a broker")
	}
}
