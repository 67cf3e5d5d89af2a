package servicebus_test

// SendResult.Duplicate against the Service Bus double (through the real
// SDK), with each entity's properties answered by the Admin seam: only an
// entity that deduplicates reports a duplicate.

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// TestDuplicateOnlyWhereDeduplicated: the management API returns a
// DuplicateDetectionHistoryTimeWindow even for an entity created without
// RequiresDuplicateDetection, which stores every send. Sending the same ID
// twice there must report Duplicate=false both times (and the entity does
// hold both), while a deduplicating entity reports the second send.
func TestDuplicateOnlyWhereDeduplicated(t *testing.T) {
	d := needDouble(t)
	cases := []struct {
		name       string
		dedup      bool
		wantDup    []bool
		wantStored int
	}{
		{"duplicate detection off, 10m history window", false, []bool{false, false}, 2},
		{"duplicate detection on, 10m window", true, []bool{false, true}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			q := newQueue(t, d, a, servicebus.EntityProperties{
				RequiresDuplicateDetection: tc.dedup, DuplicateDetectionWindow: 10 * time.Minute,
				LockDuration: time.Minute, MaxDeliveryCount: 10,
			})
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer tp.Close()
			defer sub.Close()
			for i, want := range tc.wantDup {
				res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: "same-id", Body: []byte("x")}})
				if err != nil || res[0].Err != nil {
					t.Fatalf("send %d: %v / %v", i+1, err, res[0].Err)
				}
				if res[0].Duplicate != want {
					t.Errorf("send %d of the same ID: Duplicate = %v, want %v", i+1, res[0].Duplicate, want)
				}
			}
			// What the entity holds: receive until the expected count, then
			// make sure nothing more arrives within a short wait.
			got := 0
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			for got < tc.wantStored {
				ds, err := sub.Receive(ctx, 10)
				if err != nil {
					t.Fatalf("Receive after %d of %d: %v", got, tc.wantStored, err)
				}
				for _, dl := range ds {
					if err := sub.Ack(t.Context(), dl); err != nil {
						t.Fatalf("Ack: %v", err)
					}
				}
				got += len(ds)
			}
			short, cancelShort := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancelShort()
			if ds, err := sub.Receive(short, 10); err == nil && len(ds) > 0 {
				got += len(ds)
			}
			if got != tc.wantStored {
				t.Errorf("the entity stored %d messages, want %d", got, tc.wantStored)
			}
		})
	}
}
