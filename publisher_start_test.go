// Tests of the Publisher against a scripted driver that starts batches
// (driver.BatchStarter): no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
)

// startTopic is a scriptTopic that also starts batches: StartBatch stores
// a batch and records the call as SendBatch does, but its answers are
// given only by wait, which blocks while the call's gate is closed. It
// logs "start k" and "wait k" (k: StartBatch call, from 1) as they happen.
type startTopic struct {
	*scriptTopic
	smu      sync.Mutex
	events   []string
	started  int
	inFlight int // started, wait not yet returned
	most     int // the most inFlight ever
	// startErr[k], when set, fails StartBatch call k as a whole, before
	// anything is sent.
	startErr map[int]error
	// gated makes every wait block until its ctx ends.
	gated bool
	// misuse records a wait called more than once.
	misuse []string
}

func newStartTopic(script ...map[string]error) *startTopic {
	return &startTopic{scriptTopic: newScriptTopic(script...)}
}

func (s *startTopic) log(format string, a ...any) {
	s.events = append(s.events, fmt.Sprintf(format, a...))
}

func (s *startTopic) StartBatch(ctx context.Context, msgs []*driver.Message) (func() ([]driver.SendResult, error), error) {
	s.smu.Lock()
	s.started++
	k := s.started
	s.log("start %d", k)
	err := s.startErr[k]
	s.smu.Unlock()
	if err != nil {
		return nil, err
	}
	res, err := s.scriptTopic.SendBatch(ctx, msgs)
	s.smu.Lock()
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.smu.Unlock()
	waited := false
	return func() ([]driver.SendResult, error) {
		s.smu.Lock()
		defer s.smu.Unlock()
		if waited {
			s.misuse = append(s.misuse, fmt.Sprintf("wait %d called again", k))
			return res, err
		}
		waited = true
		if s.gated {
			s.smu.Unlock()
			<-ctx.Done()
			s.smu.Lock()
			// No answer came: the broker may have stored them.
			res, err = nil, ctx.Err()
		}
		s.inFlight--
		s.log("wait %d", k)
		return res, err
	}, nil
}

func (s *startTopic) state() (events []string, started, inFlight, most int, misuse []string) {
	s.smu.Lock()
	defer s.smu.Unlock()
	return append([]string(nil), s.events...), s.started, s.inFlight, s.most, s.misuse
}

func idsN(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%d", i)
	}
	return ids
}

// TestPublishBatchOverlapsStartedChunks: with a driver that starts
// batches, the next chunks are started before the first one's answers are
// awaited, in batch order, never more than chunksStarted at once, and
// every started chunk is awaited exactly once before PublishBatch returns.
func TestPublishBatchOverlapsStartedChunks(t *testing.T) {
	topic := newStartTopic()
	topic.batch = 2
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(3)})
	if err != nil {
		t.Fatal(err)
	}
	ids := idsN(12)
	res, err := p.PublishBatch(context.Background(), msgs(ids...))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.ID != ids[i] || r.BackendID != ids[i]+"-stored" || r.Attempts != 1 {
			t.Errorf("result %d = %+v, want %s stored at the first attempt", i, r, ids[i])
		}
	}
	events, _, inFlight, most, misuse := topic.state()
	want := "start 1,start 2,start 3,start 4,wait 1,start 5,wait 2,start 6,wait 3,wait 4,wait 5,wait 6"
	if got := strings.Join(events, ","); got != want {
		t.Errorf("events = %s\nwant %s", got, want)
	}
	if most != chunksStarted || inFlight != 0 || misuse != nil {
		t.Errorf("at most %d chunks in flight (want %d), %d left in flight, misuse %v", most, chunksStarted, inFlight, misuse)
	}
	wantCalls := [][]string{{"m0", "m1"}, {"m2", "m3"}, {"m4", "m5"}, {"m6", "m7"}, {"m8", "m9"}, {"m10", "m11"}}
	if !equalCalls(topic.calls, wantCalls) {
		t.Errorf("calls = %v, want %v", topic.calls, wantCalls)
	}
}

// TestStartedChunkFailures: a failure in an early chunk is retried (through
// SendBatch) and reported while the later chunks, already started, are
// stored; retries only resend what failed, after the answers of the chunks
// already started are in.
func TestStartedChunkFailures(t *testing.T) {
	tests := []struct {
		name     string
		script   []map[string]error
		startErr map[int]error
		calls    [][]string
		attempts []int // per message
		failed   map[int]bool
		events   string // start/wait order, when it matters
	}{
		{
			name:     "messages of the first chunk fail: the retryable one is resent, the refused one reported",
			script:   []map[string]error{{"m0": errUnavailable, "m1": errRefused}},
			calls:    [][]string{{"m0", "m1"}, {"m2", "m3"}, {"m4", "m5"}, {"m6", "m7"}, {"m0"}, {"m8", "m9"}},
			attempts: []int{2, 1, 1, 1, 1, 1, 1, 1, 1, 1},
			failed:   map[int]bool{1: true},
			// The later chunks' answers are taken before the first
			// chunk's retry and its backoff, while their attempt
			// timeouts still run.
			events: "start 1,start 2,start 3,start 4,wait 1,wait 2,wait 3,wait 4,start 5,wait 5",
		},
		{
			name:     "the second chunk's start fails as a whole: resent whole after the first chunk",
			startErr: map[int]error{2: errUnavailable},
			calls:    [][]string{{"m0", "m1"}, {"m4", "m5"}, {"m6", "m7"}, {"m8", "m9"}, {"m2", "m3"}},
			attempts: []int{1, 1, 2, 2, 1, 1, 1, 1, 1, 1},
		},
		{
			name:     "the second chunk's start is refused: reported, the others stored",
			startErr: map[int]error{2: errRefused},
			calls:    [][]string{{"m0", "m1"}, {"m4", "m5"}, {"m6", "m7"}, {"m8", "m9"}},
			attempts: []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
			failed:   map[int]bool{2: true, 3: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := newStartTopic(tt.script...)
			topic.batch, topic.startErr = 2, tt.startErr
			p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(3)})
			if err != nil {
				t.Fatal(err)
			}
			ids := idsN(10)
			res, err := p.PublishBatch(context.Background(), msgs(ids...))
			var be *BatchError
			if len(tt.failed) == 0 && err != nil || len(tt.failed) > 0 && (!errors.As(err, &be) || len(be.Failed) != len(tt.failed)) {
				t.Fatalf("err = %v, want %d messages listed", err, len(tt.failed))
			}
			for i, r := range res {
				if r.Attempts != tt.attempts[i] {
					t.Errorf("message %d: %d attempts, want %d", i, r.Attempts, tt.attempts[i])
				}
				var pe *PublishError
				switch {
				case tt.failed[i] && (!errors.As(r.Err, &pe) || pe.Index != i || pe.MaybeSent || !errors.Is(r.Err, errRefused)):
					t.Errorf("message %d: %v, want a PublishError refused, not maybe sent", i, r.Err)
				case !tt.failed[i] && (r.Err != nil || r.BackendID == ""):
					t.Errorf("message %d: %+v, want stored", i, r)
				}
			}
			if !equalCalls(topic.calls, tt.calls) {
				t.Errorf("calls = %v, want %v", topic.calls, tt.calls)
			}
			events, started, inFlight, _, misuse := topic.state()
			if inFlight != 0 || misuse != nil || started != 5 {
				t.Errorf("%d starts (want 5), %d left in flight, misuse %v", started, inFlight, misuse)
			}
			if got := strings.Join(events, ","); tt.events != "" && got != tt.events {
				t.Errorf("events = %s\nwant %s", got, tt.events)
			}
		})
	}
}

// TestStartedChunksCancelled: ctx ends while chunks are started and
// unanswered. The started ones may have been stored; the ones never
// started were not sent. Nothing is left waiting.
func TestStartedChunksCancelled(t *testing.T) {
	topic := newStartTopic()
	topic.batch, topic.gated = 2, true
	// An attempt timeout far off, so that only the cancellation ends the
	// waits.
	retry := fastRetry(3)
	retry.AttemptTimeout = time.Minute
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: retry})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type outcome struct {
		res []Result
		err error
	}
	done := make(chan outcome)
	go func() {
		res, err := p.PublishBatch(ctx, msgs(idsN(12)...))
		done <- outcome{res, err}
	}()
	testutil.WaitFor(t, func() bool { _, started, _, _, _ := topic.state(); return started == chunksStarted })
	cancel()
	out := <-done
	var be *BatchError
	if !errors.As(out.err, &be) || len(be.Failed) != 12 {
		t.Fatalf("err = %v, want every message listed", out.err)
	}
	for i, r := range out.res {
		startedChunk := i < 2*chunksStarted
		var pe *PublishError
		if !errors.As(r.Err, &pe) || pe.MaybeSent != startedChunk || !errors.Is(r.Err, context.Canceled) || pe.Attempts != r.Attempts {
			t.Errorf("message %d: %#v, want MaybeSent %v, context.Canceled", i, r.Err, startedChunk)
		}
		if startedChunk != (r.Attempts == 1) {
			t.Errorf("message %d: %d attempts", i, r.Attempts)
		}
	}
	events, started, inFlight, _, misuse := topic.state()
	if started != chunksStarted || inFlight != 0 || misuse != nil || len(events) != 2*chunksStarted {
		t.Errorf("%d starts (want %d), %d left in flight, misuse %v, events %v", started, chunksStarted, inFlight, misuse, events)
	}
}
