package servicebus_test

// Premium's large messages, against the Service Bus double (through the
// real azservicebus SDK). A Premium entity takes messages up to its
// MaxMessageSizeInKilobytes (up to 100 MB), but a batch only up to the
// link's com.microsoft:max-message-batch-size, 1 MB: azservicebus 1.11.0
// sizes MessageBatch by that vendor property (its CHANGELOG: "on Premium
// large-message entities, where max-message-size can be up to 100 MB but
// the batch limit is 1 MB"), and the service refuses a larger batch
// ("The message … is larger than is currently allowed (1048576 bytes)",
// https://github.com/Azure/azure-sdk-for-net/issues/43187); see also
// https://learn.microsoft.com/azure/service-bus-messaging/service-bus-premium-messaging
// ("Large messages support"). The double advertises the property and
// refuses a larger batch transfer the same way.

import (
	"bytes"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// TestPremiumMessageOverBatchLimit: a message larger than the batch limit
// and within the entity's own limit is stored (sent on its own), and the
// messages around it too; before, AddMessage refused it into every batch
// and it was reported too large, permanently.
func TestPremiumMessageOverBatchLimit(t *testing.T) {
	d := needDouble(t)
	const batchLimit = 1 << 20 // Premium's
	cases := []struct {
		name  string
		sizes []int // body sizes of the messages of one SendBatch
	}{
		{"alone", []int{batchLimit + batchLimit/2}},
		{"between small ones", []int{10, batchLimit + batchLimit/2, 10, 10}},
		{"two large in a row", []int{batchLimit * 2, batchLimit + 1, 10}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			p := servicebus.EntityProperties{
				RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
				LockDuration: time.Minute, MaxDeliveryCount: 10,
				MaxMessageBytes: 4 << 20, // MaxMessageSizeInKilobytes 4096
			}
			cfg := queueConfig(p)
			cfg.MaxBatchBytes = batchLimit
			q := newQueueWith(t, d, a, p, cfg)
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer tp.Close()
			defer sub.Close()
			var msgs []*driver.Message
			for i, n := range tc.sizes {
				msgs = append(msgs, &driver.Message{ID: string(rune('a' + i)), Body: bytes.Repeat([]byte{byte('a' + i)}, n)})
			}
			res, err := tp.SendBatch(t.Context(), msgs)
			if err != nil {
				t.Fatalf("SendBatch: %v", err)
			}
			for i, r := range res {
				if r.Err != nil {
					t.Errorf("message %s (%d bytes): %v, want stored", msgs[i].ID, len(msgs[i].Body), r.Err)
				}
			}
			got := map[string][]byte{}
			for _, m := range receiveN(t, sub, len(msgs)) {
				got[m.ID] = m.Body
			}
			for _, m := range msgs {
				if !bytes.Equal(got[m.ID], m.Body) {
					t.Errorf("message %s: received %d bytes, want its %d", m.ID, len(got[m.ID]), len(m.Body))
				}
			}
		})
	}
}
