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

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/sqs"
)

type harness struct{}

func (harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{OrdersGroups: true, WaitTimeout: 15 * time.Second}
}

func (harness) Open(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	c := needFauxqs(t)
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
	ent := adaptertest.Entity{Topic: tp, Subscription: sub}
	if dlq != "" {
		dead, err := sqs.OpenSubscription(ctx, c, dlq, nil)
		if err != nil {
			t.Fatalf("OpenSubscription on the DLQ: %v", err)
		}
		t.Cleanup(func() { dead.Close() })
		ent.DeadLetters = adaptertest.DeadLettersFrom(dead)
	}
	return ent
}

func TestConformance(t *testing.T) {
	needFauxqs(t)
	adaptertest.Run(t, harness{})
}
