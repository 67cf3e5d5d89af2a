package servicebus_test

// The adapter conformance suite (adapters/adaptertest) against the Service
// Bus test double started by TestMain (main_test.go), through the real
// azservicebus SDK; entity properties come through the Admin seam.
//
// Each subtest gets a fresh queue whose duplicate detection window, lock
// duration and MaxDeliveryCount are the suite's Config. The double accepts
// a 1-second window, which Service Bus (20 s at least) would not: that is
// what lets the "after the window" half of the dedup check run here.
// Service Bus orders only within sessions, which this adapter does not
// receive from, so the group ordering check is skipped.

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/servicebus"
)

type harness struct{}

func (harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{ConfiguresWindow: true, WaitTimeout: 15 * time.Second}
}

func (harness) Open(ctx context.Context, t *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	d := needDouble(t)
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
	}
	q := newQueue(t, d, a, p)
	c := newClient(t, d)
	tp, sub := openPair(t, c, q, &servicebus.Options{Admin: a})
	return adaptertest.Entity{
		Topic: tp, Subscription: sub,
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
