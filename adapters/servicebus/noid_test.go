package servicebus

// The identity of messages received without a MessageId. Pure: builds
// azservicebus.ReceivedMessage values; no broker.

import (
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestFallbackIDWithoutMessageID(t *testing.T) {
	at := time.Unix(1700000000, 123)
	seq := func(n int64) *int64 { return &n }
	queue := Entity{Queue: "orders"}
	tests := []struct {
		name string
		m    *azservicebus.ReceivedMessage
		e    Entity
		want string
	}{
		{"MessageId wins", &azservicebus.ReceivedMessage{MessageID: "order-1", SequenceNumber: seq(7), EnqueuedTime: &at}, queue, "order-1"},
		{"no MessageId: entity, sequence, enqueued time", &azservicebus.ReceivedMessage{SequenceNumber: seq(7), EnqueuedTime: &at}, queue,
			"queue orders seq 7 time 1700000000000000123"},
		{"topic subscription", &azservicebus.ReceivedMessage{SequenceNumber: seq(7), EnqueuedTime: &at}, Entity{Topic: "t", Subscription: "s"},
			"topic t subscription s seq 7 time 1700000000000000123"},
		{"no identity at all", &azservicebus.ReceivedMessage{}, queue, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := fromSB(tt.m, time.Minute, tt.e)
			if d.Message.ID != tt.want {
				t.Errorf("ID = %q, want %q", d.Message.ID, tt.want)
			}
			// A redelivery carries the same sequence number and time.
			if again := fromSB(tt.m, time.Minute, tt.e); again.Message.ID != d.Message.ID {
				t.Errorf("redelivery ID %q differs from %q", again.Message.ID, d.Message.ID)
			}
		})
	}
}
