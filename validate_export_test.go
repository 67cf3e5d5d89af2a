// These tests use the in-memory broker (adapters/mem): no services.
package dedupq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
)

// Validate and Publisher.Validate refuse what PublishBatch would, and send
// nothing.
func TestValidateWithoutSending(t *testing.T) {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: time.Minute * 5})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	big := make([]byte, mem.DefaultLimits().MaxMessageBytes+1)
	tests := []struct {
		name                string
		msgs                []*dedupq.Message
		wantPortable, wantP bool // want an error from Validate, Publisher.Validate
	}{
		{name: "valid", msgs: []*dedupq.Message{{ID: "a"}, {ID: "b", GroupKey: "g"}}},
		{name: "empty ID", msgs: []*dedupq.Message{{ID: "a"}, {}}, wantPortable: true, wantP: true},
		{name: "nil message", msgs: []*dedupq.Message{nil}, wantPortable: true, wantP: true},
		{name: "over the backend's size", msgs: []*dedupq.Message{{ID: "a", Body: big}}, wantP: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ve *dedupq.ValidationError
			if err := dedupq.Validate(tt.msgs...); (err != nil) != tt.wantPortable || (err != nil && !errors.As(err, &ve)) {
				t.Errorf("Validate: %v", err)
			}
			if err := pub.Validate(tt.msgs...); (err != nil) != tt.wantP || (err != nil && !errors.As(err, &ve)) {
				t.Errorf("Publisher.Validate: %v", err)
			}
		})
	}
	if s := broker.Stats("q"); s.Published != 0 {
		t.Fatalf("validation sent %d messages", s.Published)
	}
}
