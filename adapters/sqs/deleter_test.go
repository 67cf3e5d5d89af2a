package sqs

// The deleter that coalesces acks into DeleteMessageBatch requests, on a
// fake DeleteMessageBatch made in the test: talks to nothing.

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
)

// fakeDeletes answers DeleteMessageBatch with do; every other call of the
// API panics (nil interface).
type fakeDeletes struct {
	sqsAPI
	do func(ctx context.Context, in *awssqs.DeleteMessageBatchInput) (*awssqs.DeleteMessageBatchOutput, error)
}

func (f *fakeDeletes) DeleteMessageBatch(ctx context.Context, in *awssqs.DeleteMessageBatchInput, _ ...func(*awssqs.Options)) (*awssqs.DeleteMessageBatchOutput, error) {
	return f.do(ctx, in)
}

// ackingSub is a Subscription over api whose deleter waits linger, with a
// full receive's deliveries (receipt handles rh-0 … rh-9).
func ackingSub(api sqsAPI, linger time.Duration) (*Subscription, []*driver.Delivery) {
	s := &Subscription{api: api, del: newDeleter(api, func() string { return "q" }, linger)}
	ms := make([]types.Message, maxBatch)
	for i := range ms {
		n := strconv.Itoa(i)
		ms[i] = types.Message{MessageId: aws.String("mid-" + n), ReceiptHandle: aws.String("rh-" + n), Body: aws.String("b")}
	}
	return s, s.deliveries(ms, time.Minute)
}

// allSucceed is the answer to a full batch whose entries all succeeded.
func allSucceed() *awssqs.DeleteMessageBatchOutput {
	out := &awssqs.DeleteMessageBatchOutput{}
	for i := range maxBatch {
		out.Successful = append(out.Successful, types.DeleteMessageBatchResultEntry{Id: aws.String(strconv.Itoa(i))})
	}
	return out
}

// TestAckAllocations: ten concurrent acks that fill one DeleteMessageBatch
// cost the batch's few allocations (the batch, its channel and context,
// the request, its goroutine), not several each: 7 in all, where a
// request, channel, context watch and two SDK strings per ack made 105.
func TestAckAllocations(t *testing.T) {
	out := allSucceed()
	var bad sync.Map
	api := &fakeDeletes{do: func(_ context.Context, in *awssqs.DeleteMessageBatchInput) (*awssqs.DeleteMessageBatchOutput, error) {
		if len(in.Entries) != maxBatch {
			bad.Store("batch size", len(in.Entries))
		}
		return out, nil
	}}
	// A long linger: the tenth ack sends the batch, never the timer.
	s, ds := ackingSub(api, time.Hour)
	defer s.Close()
	var wg sync.WaitGroup
	start := make([]chan struct{}, len(ds))
	for i, d := range ds {
		start[i] = make(chan struct{})
		go func() {
			for range start[i] {
				if err := s.Ack(context.Background(), d); err != nil {
					bad.Store(i, err)
				}
				wg.Done()
			}
		}()
	}
	defer func() {
		for _, c := range start {
			close(c)
		}
	}()
	n := testing.AllocsPerRun(50, func() {
		wg.Add(len(ds))
		for _, c := range start {
			c <- struct{}{}
		}
		wg.Wait()
	})
	t.Logf("%.1f allocations for %d acks", n, len(ds))
	bad.Range(func(k, v any) bool {
		t.Errorf("%v: %v", k, v)
		return true
	})
	if n > 7 {
		t.Errorf("%.0f allocations for %d acks that fill one DeleteMessageBatch, want 7", n, len(ds))
	}
}

// TestAcksOfABatch: each ack of a shared DeleteMessageBatch gets its own
// entry's result; an ack that gives up returns its context's error without
// failing the others' request, which is cancelled only once every ack of
// the batch has given up.
func TestAcksOfABatch(t *testing.T) {
	t.Run("each entry's result", func(t *testing.T) {
		api := &fakeDeletes{do: func(_ context.Context, in *awssqs.DeleteMessageBatchInput) (*awssqs.DeleteMessageBatchOutput, error) {
			out := &awssqs.DeleteMessageBatchOutput{}
			for _, e := range in.Entries {
				switch aws.ToString(e.ReceiptHandle) {
				case "rh-3":
					out.Failed = append(out.Failed, types.BatchResultErrorEntry{Id: e.Id, Code: aws.String("ReceiptHandleIsInvalid"), SenderFault: true})
				case "rh-5": // no answer at all
				default:
					out.Successful = append(out.Successful, types.DeleteMessageBatchResultEntry{Id: e.Id})
				}
			}
			return out, nil
		}}
		s, ds := ackingSub(api, time.Hour)
		defer s.Close()
		errs := make([]error, len(ds))
		var wg sync.WaitGroup
		for i, d := range ds {
			wg.Go(func() { errs[i] = s.Ack(t.Context(), d) })
		}
		wg.Wait()
		for i, err := range errs {
			var ee *EntryError
			switch {
			case i == 3 && (!errors.As(err, &ee) || ee.Code != "ReceiptHandleIsInvalid"):
				t.Errorf("ack %d = %v, want its entry's EntryError", i, err)
			case i == 5 && err == nil:
				t.Errorf("ack %d of an unanswered entry succeeded", i)
			case i != 3 && i != 5 && err != nil:
				t.Errorf("ack %d = %v", i, err)
			}
		}
	})

	// Ten acks fill a batch, which goes at once; the request waits in the
	// fake until the test releases it or its context ends.
	t.Run("giving up", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			quit int // how many of the acks give up
		}{
			{"one ack", 1},
			{"every ack", maxBatch},
		} {
			t.Run(tc.name, func(t *testing.T) {
				sent := make(chan context.Context, 1)
				release := make(chan struct{})
				api := &fakeDeletes{do: func(ctx context.Context, in *awssqs.DeleteMessageBatchInput) (*awssqs.DeleteMessageBatchOutput, error) {
					sent <- ctx
					select {
					case <-release:
						return allSucceed(), nil
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}}
				s, ds := ackingSub(api, time.Hour)
				defer s.Close()
				quit, cancelQuit := context.WithCancel(t.Context())
				defer cancelQuit()
				errs := make([]chan error, len(ds))
				for i, d := range ds {
					ctx := t.Context()
					if i < tc.quit {
						ctx = quit
					}
					errs[i] = make(chan error, 1)
					go func() { errs[i] <- s.Ack(ctx, d) }()
				}
				req := <-sent
				cancelQuit()
				for i := range tc.quit {
					if err := <-errs[i]; !errors.Is(err, context.Canceled) {
						t.Errorf("ack %d that gave up = %v, want its context's error", i, err)
					}
				}
				if tc.quit == len(ds) {
					select {
					case <-req.Done():
					case <-time.After(10 * time.Second):
						t.Fatal("the request outlived every ack waiting on it")
					}
					return
				}
				if req.Err() != nil {
					t.Fatal("acks giving up cancelled the request others wait on")
				}
				close(release)
				for i := tc.quit; i < len(ds); i++ {
					if err := <-errs[i]; err != nil {
						t.Errorf("ack %d that waited = %v", i, err)
					}
				}
			})
		}
	})
}

// TestAckAfterAllOfItsBatchGaveUp: once every ack of an unsent batch has
// given up, the next ack does not join that batch, whose request context
// is cancelled: it goes in a batch of its own and succeeds.
func TestAckAfterAllOfItsBatchGaveUp(t *testing.T) {
	var mu sync.Mutex
	var sent [][]string
	api := &fakeDeletes{do: func(ctx context.Context, in *awssqs.DeleteMessageBatchInput) (*awssqs.DeleteMessageBatchOutput, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		mu.Lock()
		var hs []string
		for _, e := range in.Entries {
			hs = append(hs, aws.ToString(e.ReceiptHandle))
		}
		sent = append(sent, hs)
		mu.Unlock()
		out := &awssqs.DeleteMessageBatchOutput{}
		for _, e := range in.Entries {
			out.Successful = append(out.Successful, types.DeleteMessageBatchResultEntry{Id: e.Id})
		}
		return out, nil
	}}
	// A linger the test never waits for: the batch goes when the
	// subscription closes.
	s, ds := ackingSub(api, time.Hour)
	gaveUp, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Ack(gaveUp, ds[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("ack with a cancelled context = %v, want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Ack(context.Background(), ds[1]) }()
	testutil.WaitFor(t, func() bool {
		s.del.mu.Lock()
		defer s.del.mu.Unlock()
		return s.del.cur != nil && s.del.cur.live == 1
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("ack after its batch's only other ack gave up = %v, want success", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 || len(sent[0]) != 1 || sent[0][0] != "rh-1" {
		t.Errorf("DeleteMessageBatch calls %v, want one with rh-1 alone", sent)
	}
}
