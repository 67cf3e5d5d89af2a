package servicebus_test

// Partitioned entities, against the Service Bus double (through the real
// azservicebus SDK), which refuses what the service refuses there:
//
//   - "When sending to a partition-enabled entity, all messages included in
//     a single send operation must have the same PartitionKey" (and
//     SessionId): the Service Bus SDK troubleshooting guide, "Cannot send
//     batch with multiple partition keys",
//     https://aka.ms/azsdk/net/servicebus/exceptions/troubleshoot;
//   - with duplicate detection on as well, a batch of distinct MessageIds is
//     refused outright (amqp:not-allowed, "Batching brokered messages with
//     distinct SessionId, PartitionKey, or MessageId is not supported for an
//     entity with partitioning and duplicate detection enabled"); the
//     service team's advice is not to batch there
//     (https://github.com/Azure/azure-sdk-for-python/issues/36333);
//   - "If partitioning is enabled, MessageId+PartitionKey is used to
//     determine uniqueness"
//     (https://learn.microsoft.com/azure/service-bus-messaging/duplicate-detection):
//     an ID resent under another partition key is a new message.
//
// Entity properties come through the Admin seam.

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// TestPartitionedEntityTakesEveryBatch: a SendBatch of messages under
// several GroupKeys (and none) is stored whole, whatever the entity allows
// in one transfer; before, it went out as one MessageBatch that a
// partitioned entity refuses, and every valid message was reported
// refused.
func TestPartitionedEntityTakesEveryBatch(t *testing.T) {
	d := needDouble(t)
	cases := []struct {
		name               string
		partitioned, dedup bool
	}{
		{"partitioned, duplicate detection on", true, true},
		{"partitioned, duplicate detection off", true, false},
		{"not partitioned, duplicate detection on", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			q := newQueue(t, d, a, servicebus.EntityProperties{
				RequiresDuplicateDetection: tc.dedup, DuplicateDetectionWindow: 10 * time.Minute,
				EnablePartitioning: tc.partitioned,
				LockDuration:       time.Minute, MaxDeliveryCount: 10,
			})
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer tp.Close()
			defer sub.Close()
			msgs := []*driver.Message{
				{ID: "a", GroupKey: "g1", Body: []byte("1")},
				{ID: "b", GroupKey: "g1", Body: []byte("2")},
				{ID: "c", GroupKey: "g2", Body: []byte("3")},
				{ID: "d", Body: []byte("4")},
				{ID: "e", Body: []byte("5")},
				{ID: "f", GroupKey: "g1", Body: []byte("6")},
			}
			res, err := tp.SendBatch(t.Context(), msgs)
			if err != nil {
				t.Fatalf("SendBatch: %v", err)
			}
			for i, r := range res {
				if r.Err != nil || r.BackendID != msgs[i].ID {
					t.Errorf("message %s: %+v, want stored", msgs[i].ID, r)
				}
			}
			var got []string
			for _, m := range receiveN(t, sub, len(msgs)) {
				got = append(got, m.ID+"/"+m.GroupKey)
			}
			slices.Sort(got)
			if want := []string{"a/g1", "b/g1", "c/g2", "d/", "e/", "f/g1"}; !slices.Equal(got, want) {
				t.Errorf("the entity holds %v, want %v", got, want)
			}
		})
	}
}

// TestPartitionedDedupPerKey: on a partitioned entity the same ID under
// another GroupKey (the partition key) is stored, and must not be reported
// as a duplicate; the window's scope says so.
func TestPartitionedDedupPerKey(t *testing.T) {
	d := needDouble(t)
	sends := []*driver.Message{
		{ID: "x", GroupKey: "g1", Body: []byte("1")},
		{ID: "x", GroupKey: "g2", Body: []byte("2")},
		{ID: "x", GroupKey: "g1", Body: []byte("3")},
	}
	cases := []struct {
		name        string
		partitioned bool
		wantDup     []bool
		wantStored  int
		wantScope   string // in the window's scope; "" means no "partition key" there
	}{
		{"partitioned: per partition key", true, []bool{false, false, true}, 2, "per partition key"},
		{"not partitioned: per entity", false, []bool{false, true, true}, 1, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			q := newQueue(t, d, a, servicebus.EntityProperties{
				RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
				EnablePartitioning: tc.partitioned,
				LockDuration:       time.Minute, MaxDeliveryCount: 10,
			})
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer tp.Close()
			defer sub.Close()
			for i, m := range sends {
				res, err := tp.SendBatch(t.Context(), []*driver.Message{m})
				if err != nil || res[0].Err != nil {
					t.Fatalf("send %d: %v / %v", i+1, err, res[0].Err)
				}
				if res[0].Duplicate != tc.wantDup[i] {
					t.Errorf("send %d (%s under %s): Duplicate = %v, want %v", i+1, m.ID, m.GroupKey, res[0].Duplicate, tc.wantDup[i])
				}
			}
			receiveN(t, sub, tc.wantStored)
			w, err := tp.Window(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if has := strings.Contains(w.Scope, "partition key"); has != (tc.wantScope != "") || !strings.Contains(w.Scope, tc.wantScope) {
				t.Errorf("window scope %q, want it to say %q", w.Scope, tc.wantScope)
			}
		})
	}
}
