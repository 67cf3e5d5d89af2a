package servicebus_test

// SendBatch's per-message outcomes through the Sender seam (no broker): a
// fake Sender whose batches hold a fixed number of messages, whose single
// sends take larger ones (as Premium's link does: a 1 MB batch limit below
// a message limit of up to 100 MB), and whose transfers fail on demand —
// what the double cannot be made to do — and that records every transfer,
// to check what a partitioned entity is sent in one.

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
	cap        int
	maxMessage int // largest body SendMessage takes; 0 means a batch's (100)
	failNth    int // 1-based transfer that fails; 0 means none
	sent       [][]string
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

func (s *fakeSender) SendMessage(_ context.Context, m *azservicebus.Message) error {
	limit := s.maxMessage
	if limit == 0 {
		limit = 100
	}
	if len(m.Body) > limit {
		// What the SDK returns for amqp:link:message-size-exceeded.
		return azservicebus.ErrMessageTooLarge
	}
	s.sent = append(s.sent, []string{*m.MessageID})
	if len(s.sent) == s.failNth {
		return &azservicebus.Error{Code: azservicebus.CodeConnectionLost}
	}
	return nil
}

func (s *fakeSender) Close(context.Context) error { return nil }

func TestSendBatchOutcomes(t *testing.T) {
	small := func(id string) *driver.Message { return &driver.Message{ID: id, Body: []byte("x")} }
	big := &driver.Message{ID: "big", Body: make([]byte, 200)}
	keyed := func(id, key string) *driver.Message { return &driver.Message{ID: id, GroupKey: key, Body: []byte("x")} }
	mixedKeys := []*driver.Message{keyed("a", "g1"), keyed("b", "g1"), keyed("c", "g2"), keyed("d", ""), keyed("e", ""), keyed("f", "g1")}
	cases := []struct {
		name        string
		sender      *fakeSender
		partitioned bool
		noDedup     bool
		msgs        []*driver.Message
		transfers   int
		wantErr     []string // per message: "" ok, "batch" BatchSendError, "large" TooLargeError
	}{
		{"one transfer", &fakeSender{cap: 10}, false, false, []*driver.Message{small("a"), small("b")}, 1, []string{"", ""}},
		{"split by size", &fakeSender{cap: 2}, false, false, []*driver.Message{small("a"), small("b"), small("c")}, 2, []string{"", "", ""}},
		{"second transfer fails whole", &fakeSender{cap: 2, failNth: 2}, false, false, []*driver.Message{small("a"), small("b"), small("c"), small("d"), small("e")}, 3, []string{"", "", "batch", "batch", ""}},
		// A message that does not fit flushes the batch before it, to learn
		// whether it fits an empty one: hence two transfers.
		{"too large alone", &fakeSender{cap: 10}, false, false, []*driver.Message{small("a"), big, small("c")}, 2, []string{"", "large", ""}},
		// Premium: over the batch limit, within the entity's message limit.
		{"over the batch limit, sent alone", &fakeSender{cap: 10, maxMessage: 1000}, false, false, []*driver.Message{small("a"), big, small("c")}, 3, []string{"", "", ""}},
		{"sent alone, fails alone", &fakeSender{cap: 10, maxMessage: 1000, failNth: 2}, false, false, []*driver.Message{small("a"), big, small("c")}, 3, []string{"", "batch", ""}},
		// A partitioned entity takes one partition key per transfer, in
		// the order given…
		{"partitioned: cut where the key changes", &fakeSender{cap: 10}, true, true, mixedKeys, 4, []string{"", "", "", "", "", ""}},
		// …and, with duplicate detection, one message per send.
		{"partitioned with duplicate detection: one per send", &fakeSender{cap: 10}, true, false, mixedKeys, 6, []string{"", "", "", "", "", ""}},
		{"partitioned with duplicate detection: a failed send is its own", &fakeSender{cap: 10, failNth: 3}, true, false, mixedKeys, 6, []string{"", "", "batch", "", "", ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := servicebus.EntityProperties{
				RequiresDuplicateDetection: !tc.noDedup, EnablePartitioning: tc.partitioned,
				DuplicateDetectionWindow: 60e9, LockDuration: 60e9, MaxDeliveryCount: 10,
			}
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
			if tc.wantErr[0] == "" && !tc.noDedup && !again[0].Duplicate {
				t.Errorf("resend of %s: Duplicate false, want true", tc.msgs[0].ID)
			}
		})
	}
}
