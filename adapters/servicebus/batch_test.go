package servicebus_test

// SendBatch's per-message outcomes through the Sender seam (no broker): a
// fake Sender whose batches hold a fixed number of messages and whose
// transfers fail on demand — what the double cannot be made to do.

import (
	"context"
	"errors"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

type fakeBatch struct {
	ids []string
	cap int
}

func (b *fakeBatch) AddMessage(m *azservicebus.Message, _ *azservicebus.AddMessageOptions) error {
	if len(m.Body) > 100 || len(b.ids) == b.cap {
		return azservicebus.ErrMessageTooLarge
	}
	b.ids = append(b.ids, *m.MessageID)
	return nil
}

func (b *fakeBatch) NumMessages() int32 { return int32(len(b.ids)) }

type fakeSender struct {
	cap     int
	failNth int // 1-based transfer that fails; 0 means none
	sent    [][]string
}

func (s *fakeSender) NewBatch(context.Context) (servicebus.Batch, error) {
	return &fakeBatch{cap: s.cap}, nil
}

func (s *fakeSender) SendBatch(_ context.Context, b servicebus.Batch) error {
	s.sent = append(s.sent, b.(*fakeBatch).ids)
	if len(s.sent) == s.failNth {
		return &azservicebus.Error{Code: azservicebus.CodeConnectionLost}
	}
	return nil
}

func (s *fakeSender) Close(context.Context) error { return nil }

func TestSendBatchOutcomes(t *testing.T) {
	small := func(id string) *driver.Message { return &driver.Message{ID: id, Body: []byte("x")} }
	big := &driver.Message{ID: "big", Body: make([]byte, 200)}
	cases := []struct {
		name      string
		sender    *fakeSender
		msgs      []*driver.Message
		transfers int
		wantErr   []string // per message: "" ok, "batch" BatchSendError, "large" TooLargeError
	}{
		{"one transfer", &fakeSender{cap: 10}, []*driver.Message{small("a"), small("b")}, 1, []string{"", ""}},
		{"split by size", &fakeSender{cap: 2}, []*driver.Message{small("a"), small("b"), small("c")}, 2, []string{"", "", ""}},
		{"second transfer fails whole", &fakeSender{cap: 2, failNth: 2}, []*driver.Message{small("a"), small("b"), small("c"), small("d"), small("e")}, 3, []string{"", "", "batch", "batch", ""}},
		// A message that does not fit flushes the batch before it, to learn
		// whether it fits an empty one: hence two transfers.
		{"too large alone", &fakeSender{cap: 10}, []*driver.Message{small("a"), big, small("c")}, 2, []string{"", "large", ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 60e9, LockDuration: 60e9, MaxDeliveryCount: 10}
			tp, err := servicebus.OpenTopicWith(t.Context(), tc.sender, servicebus.Entity{Queue: "q"}, &servicebus.Options{Stated: &st})
			if err != nil {
				t.Fatal(err)
			}
			res, err := tp.SendBatch(t.Context(), tc.msgs)
			if err != nil {
				t.Fatalf("SendBatch: %v", err)
			}
			if len(tc.sender.sent) != tc.transfers {
				t.Errorf("%d transfers %v, want %d", len(tc.sender.sent), tc.sender.sent, tc.transfers)
			}
			for i, r := range res {
				var be *servicebus.BatchSendError
				var tl *servicebus.TooLargeError
				switch want := tc.wantErr[i]; {
				case want == "" && (r.Err != nil || r.BackendID != tc.msgs[i].ID):
					t.Errorf("message %d: %+v, want stored under its ID", i, r)
				case want == "batch" && (!errors.As(r.Err, &be) || !tp.IsRetryable(r.Err)):
					t.Errorf("message %d: %v, want a retryable *BatchSendError", i, r.Err)
				case want == "large" && (!errors.As(r.Err, &tl) || !errors.Is(r.Err, azservicebus.ErrMessageTooLarge) || tp.IsRetryable(r.Err)):
					t.Errorf("message %d: %v, want a non-retryable *TooLargeError", i, r.Err)
				}
			}
			// The same IDs again within the window are this Topic's duplicates.
			again, _ := tp.SendBatch(t.Context(), tc.msgs[:1])
			if tc.wantErr[0] == "" && !again[0].Duplicate {
				t.Errorf("resend of %s: Duplicate false, want true", tc.msgs[0].ID)
			}
		})
	}
}
