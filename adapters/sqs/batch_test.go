package sqs_test

// Partly failed batches and the SDK's own retries, against fauxqs (started
// by TestMain; see fauxqs_test.go). fauxqs refuses a batch entry only for a
// sender fault (bad body, size, group), never with a retryable service
// fault, so the retryable cases go through faultProxy, which rewrites
// fauxqs's real answers. fauxqs returns one message per group per
// receive: every message here has its own group and receiveN loops.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

func batchOf(n int, prefix string) []*dedupq.Message {
	var msgs []*dedupq.Message
	for i := range n {
		msgs = append(msgs, &dedupq.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Body: []byte(fmt.Sprint("body ", i)), GroupKey: fmt.Sprint("g", i)})
	}
	return msgs
}

// consumeIDs receives want deliveries, acks them, checks that the queue is
// then empty (so nothing was delivered twice) and returns the IDs seen.
func consumeIDs(t *testing.T, s *sqs.Subscription, want int) []string {
	t.Helper()
	ds := receiveN(t, s, want, 15*time.Second)
	ackAll(t, s, ds)
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.Message.ID)
	}
	slices.Sort(ids)
	return ids
}

func idsOf(msgs []*dedupq.Message) []string {
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.ID)
	}
	slices.Sort(ids)
	return ids
}

// TestPartlyFailedBatchRefusedByBroker: fauxqs refuses one entry of a
// batch (it is larger than the queue's MaximumMessageSize, which was
// lowered after the publisher started, so the portable check let it
// through). The other entries are stored and delivered once; the refused
// one is reported, not retried (a sender fault would fail again) and not
// "maybe sent"; resent with the same ID once the queue takes it, it is
// delivered once, and resending the whole batch delivers nothing again.
func TestPartlyFailedBatchRefusedByBroker(t *testing.T) {
	c := needFauxqs(t)
	url, _ := newQueue(t, c, map[string]string{"MaximumMessageSize": "4096"})
	tp := openTopic(t, c, url, nil)
	pub, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(t.Context())
	setQueueAttr(t, c, url, "MaximumMessageSize", "1024")

	msgs := batchOf(5, "refused")
	big := msgs[2]
	big.Body = bytes.Repeat([]byte("x"), 2000)
	res, err := pub.PublishBatch(ctxFor(t, 10*time.Second), msgs)
	var be *dedupq.BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 {
		t.Fatalf("PublishBatch err = %v, want a BatchError with one failure", err)
	}
	var pe *dedupq.PublishError
	if !errors.As(be.Failed[0], &pe) || pe.ID != big.ID || pe.Index != 2 || pe.Attempts != 1 || pe.MaybeSent {
		t.Fatalf("failure = %#v, want message 2 refused after 1 attempt, not maybe sent", be.Failed[0])
	}
	var ee *sqs.EntryError
	if !errors.As(pe, &ee) || !ee.SenderFault || ee.Code != "InvalidParameterValue" {
		t.Errorf("cause = %v, want SQS's sender-fault InvalidParameterValue", pe.Err)
	}
	t.Logf("reported: %v", err)
	for i, r := range res {
		if (i == 2) != (r.Err != nil) || (i != 2 && r.BackendID == "") {
			t.Errorf("result %d = %+v", i, r)
		}
	}

	s := openSub(t, c, url, nil)
	others := idsOf(slices.Delete(slices.Clone(msgs), 2, 3))
	if got := consumeIDs(t, s, 4); !slices.Equal(got, others) {
		t.Fatalf("delivered %v, want %v", got, others)
	}
	assertEmpty(t, c, url)

	setQueueAttr(t, c, url, "MaximumMessageSize", "4096")
	if _, err := pub.Publish(ctxFor(t, 10*time.Second), big); err != nil {
		t.Fatalf("resending the refused message: %v", err)
	}
	if _, err := pub.PublishBatch(ctxFor(t, 10*time.Second), msgs); err != nil {
		t.Fatalf("resending the whole batch: %v", err)
	}
	if got := consumeIDs(t, s, 1); !slices.Equal(got, []string{big.ID}) {
		t.Fatalf("delivered %v, want only %s", got, big.ID)
	}
	assertEmpty(t, c, url)
}

// TestPartlyFailedBatchRetriesOnlyFailed: SQS fails one entry with a
// service fault. The Publisher resends that entry alone, with the same
// dedup ID, and every message is delivered once — also when the failed
// entry had in fact been stored, which only the dedup ID makes harmless.
func TestPartlyFailedBatchRetriesOnlyFailed(t *testing.T) {
	c := needFauxqs(t)
	for _, tc := range []struct {
		name   string
		stored bool // the failed entry reached the queue all the same
	}{
		{"not stored", false},
		{"stored but reported failed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const failID = "2" // batch entry Id: the message's index
			proxy := newFaultProxy(t, fauxqsEndpoint, func(action string, n int, body []byte) (int, []byte, []byte, func([]byte) []byte) {
				if action != "SendMessageBatch" || n != 1 {
					return 0, nil, nil, nil
				}
				var fwd []byte
				if !tc.stored {
					var req map[string]any
					json.Unmarshal(body, &req)
					entries := req["Entries"].([]any)
					req["Entries"] = slices.DeleteFunc(entries, func(e any) bool { return e.(map[string]any)["Id"] == failID })
					fwd, _ = json.Marshal(req)
				}
				return 0, nil, fwd, func(resp []byte) []byte {
					var out struct {
						Successful []map[string]any
						Failed     []map[string]any
					}
					json.Unmarshal(resp, &out)
					out.Successful = slices.DeleteFunc(out.Successful, func(e map[string]any) bool { return e["Id"] == failID })
					out.Failed = append(out.Failed, map[string]any{"Id": failID, "SenderFault": false, "Code": "InternalError", "Message": "injected"})
					b, _ := json.Marshal(out)
					return b
				}
			})
			pc := newClient(proxy.URL())
			url, _ := newQueue(t, c, nil)
			pub, err := dedupq.NewPublisher(t.Context(), openTopic(t, pc, url, nil), dedupq.PublisherOptions{
				Retry: &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, AttemptTimeout: 5 * time.Second},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(t.Context())
			msgs := batchOf(5, "retried")
			res, err := pub.PublishBatch(ctxFor(t, 10*time.Second), msgs)
			if err != nil {
				t.Fatalf("PublishBatch: %v", err)
			}
			for i, r := range res {
				want := 1
				if i == 2 {
					want = 2
				}
				if r.Attempts != want || r.Err != nil {
					t.Errorf("result %d: %d attempts, err %v; want %d, nil", i, r.Attempts, r.Err, want)
				}
			}
			reqs := proxy.Requests("SendMessageBatch")
			if len(reqs) != 2 {
				t.Fatalf("%d SendMessageBatch requests, want 2", len(reqs))
			}
			if got := dedupIDs(t, reqs[1]); !slices.Equal(got, []string{msgs[2].ID}) {
				t.Errorf("resend carried %v, want only %s", got, msgs[2].ID)
			}
			s := openSub(t, c, url, nil)
			if got := consumeIDs(t, s, 5); !slices.Equal(got, idsOf(msgs)) {
				t.Fatalf("delivered %v, want %v", got, idsOf(msgs))
			}
			assertEmpty(t, c, url)
		})
	}
}

// TestSDKDoesNotResendBatches: the SDK's standard retryer would resend a
// batch that failed with a server error up to 3 times, adding up to 40 s
// of backoff the startup check cannot see. The adapter turns it off for
// SendMessageBatch: one request per SendBatch, every resend the
// Publisher's own (and so counted in its span), and HiddenRetrySpan zero.
func TestSDKDoesNotResendBatches(t *testing.T) {
	c := needFauxqs(t)
	failures := 2
	proxy := newFaultProxy(t, fauxqsEndpoint, func(action string, n int, _ []byte) (int, []byte, []byte, func([]byte) []byte) {
		if action == "SendMessageBatch" && n <= failures {
			return 500, serverError, nil, nil
		}
		return 0, nil, nil, nil
	})
	url, _ := newQueue(t, c, nil)
	tp := openTopic(t, newClient(proxy.URL()), url, nil)
	if d := tp.HiddenRetrySpan(); d != 0 {
		t.Errorf("HiddenRetrySpan = %s, want 0", d)
	}
	res, err := tp.SendBatch(t.Context(), []*driver.Message{{ID: "m", Body: []byte("b"), GroupKey: "g"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(proxy.Requests("SendMessageBatch")); n != 1 {
		t.Fatalf("one SendBatch made %d requests, want 1", n)
	}
	if res[0].Err == nil || !tp.IsRetryable(res[0].Err) || !strings.Contains(res[0].Err.Error(), "InternalError") {
		t.Fatalf("result %+v: want a retryable InternalError", res[0])
	}

	pub, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{
		Retry: &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond, AttemptTimeout: 5 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(t.Context())
	r, err := pub.Publish(ctxFor(t, 10*time.Second), &dedupq.Message{ID: "m", Body: []byte("b"), GroupKey: "g"})
	if err != nil || r.Attempts != 2 {
		t.Fatalf("Publish = %+v, %v; want success on attempt 2", r, err)
	}
	if n := len(proxy.Requests("SendMessageBatch")); n != 3 {
		t.Errorf("%d SendMessageBatch requests in all, want 3 (1 + the Publisher's 2)", n)
	}
	if got := consumeIDs(t, openSub(t, c, url, nil), 1); !slices.Equal(got, []string{"m"}) {
		t.Errorf("delivered %v", got)
	}
	assertEmpty(t, c, url)
}
