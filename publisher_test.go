// Tests of the portable Publisher against a scripted driver: no services.
package dedupq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/testutil"
	"github.com/dedupq/dedupq/window"
)

var errUnavailable = errors.New("broker unavailable")
var errRefused = errors.New("broker refused the message")

// scriptTopic answers each SendBatch call from a script: script[call][id]
// is the error for that message on that call (nil or absent = stored).
type scriptTopic struct {
	mu     sync.Mutex
	win    window.Window
	limits driver.Limits
	batch  int
	script []map[string]error
	calls  [][]string // IDs sent per call
	stored map[string]int
	block  chan struct{} // when set, SendBatch waits on it or ctx
	// entered, when set, receives once per SendBatch call that waits on
	// block, so that a test can act while a send is in flight.
	entered chan struct{}
	// onCall, when set, runs during each SendBatch call (numbered from 1)
	// after the messages are stored.
	onCall func(call int)
	// short drops this many results from the end of every answer, as a
	// faulty driver would.
	short int
	// failFirst fails the first send of each of its IDs with its error,
	// whatever the call it comes in.
	failFirst map[string]error
	sentOnce  map[string]bool
}

func newScriptTopic(script ...map[string]error) *scriptTopic {
	return &scriptTopic{
		win:    window.Window{Backend: "script", Duration: 5 * time.Minute, Kind: window.KindFixed},
		limits: driver.Limits{MaxIDLength: 8, MaxMessageBytes: 16, IDAllowed: func(r rune) bool { return r != ' ' }},
		batch:  10, script: script, stored: map[string]int{},
	}
}

func (s *scriptTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	if s.block != nil {
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		select {
		case <-s.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	call := len(s.calls)
	var ids []string
	res := make([]driver.SendResult, len(msgs))
	for i, m := range msgs {
		ids = append(ids, m.ID)
		if call < len(s.script) && s.script[call][m.ID] != nil {
			res[i].Err = s.script[call][m.ID]
			continue
		}
		if err := s.failFirst[m.ID]; err != nil && !s.sentOnce[m.ID] {
			if s.sentOnce == nil {
				s.sentOnce = map[string]bool{}
			}
			s.sentOnce[m.ID] = true
			res[i].Err = err
			continue
		}
		s.stored[m.ID]++
		res[i].BackendID = m.ID + "-stored"
		res[i].Duplicate = s.stored[m.ID] > 1
	}
	s.calls = append(s.calls, ids)
	if s.onCall != nil {
		s.onCall(len(s.calls))
	}
	return res[:max(len(res)-s.short, 0)], nil
}

func (s *scriptTopic) MaxBatch() int                                 { return s.batch }
func (s *scriptTopic) Limits() driver.Limits                         { return s.limits }
func (s *scriptTopic) Window(context.Context) (window.Window, error) { return s.win, nil }
func (s *scriptTopic) HiddenRetrySpan() time.Duration                { return 0 }
func (s *scriptTopic) IsRetryable(err error) bool                    { return errors.Is(err, errUnavailable) }
func (s *scriptTopic) Close() error                                  { return nil }

func fastRetry(attempts int) *window.RetryPolicy {
	return &window.RetryPolicy{MaxAttempts: attempts, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, AttemptTimeout: time.Second}
}

func msgs(ids ...string) []*Message {
	var out []*Message
	for _, id := range ids {
		out = append(out, &Message{ID: id, Body: []byte("b")})
	}
	return out
}

func TestPublishBatchRetriesOnlyFailedWithSameID(t *testing.T) {
	topic := newScriptTopic(
		map[string]error{"b": errUnavailable, "c": errRefused},
		map[string]error{"b": errUnavailable},
	)
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(3)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.PublishBatch(context.Background(), msgs("a", "b", "c"))
	var be *BatchError
	if !errors.As(err, &be) || len(be.Failed) != 1 {
		t.Fatalf("err = %v, want a BatchError with one failure", err)
	}
	var pe *PublishError
	if !errors.As(be.Failed[0], &pe) || pe.ID != "c" || pe.Index != 2 || pe.MaybeSent || !errors.Is(err, errRefused) {
		t.Fatalf("failure = %#v, want c refused, not sent", be.Failed[0])
	}
	want := [][]string{{"a", "b", "c"}, {"b"}, {"b"}}
	if got := topic.calls; !equalCalls(got, want) {
		t.Errorf("calls = %v, want %v", got, want)
	}
	if res[0].Err != nil || res[1].Err != nil || res[1].Attempts != 3 || res[1].BackendID != "b-stored" {
		t.Errorf("results = %+v", res)
	}
}

func equalCalls(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], ",") != strings.Join(b[i], ",") {
			return false
		}
	}
	return true
}

func TestPublishGivesUpAfterMaxAttempts(t *testing.T) {
	topic := newScriptTopic(map[string]error{"a": errUnavailable}, map[string]error{"a": errUnavailable})
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(2)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Publish(context.Background(), &Message{ID: "a"})
	var pe *PublishError
	if !errors.As(err, &pe) || !pe.MaybeSent || pe.Attempts != 2 || !errors.Is(err, errUnavailable) {
		t.Fatalf("err = %v, want PublishError after 2 attempts, maybe sent", err)
	}
}

func TestPublishDuplicateIsSuccess(t *testing.T) {
	topic := newScriptTopic()
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{})
	for i, dup := range []bool{false, true} {
		r, err := p.Publish(context.Background(), &Message{ID: "x"})
		if err != nil || r.Duplicate != dup {
			t.Fatalf("publish %d: %+v, %v; want Duplicate=%v", i, r, err, dup)
		}
	}
}

func TestPublishCancelledSaysMaybeSent(t *testing.T) {
	topic := newScriptTopic()
	topic.block = make(chan struct{})
	topic.entered = make(chan struct{})
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(1)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := p.Publish(ctx, &Message{ID: "a"}); done <- err }()
	<-topic.entered // cancelled while the send is in flight
	cancel()
	err := <-done
	var pe *PublishError
	if !errors.As(err, &pe) || !pe.MaybeSent || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want PublishError{MaybeSent} wrapping context.Canceled", err)
	}
}

func TestPublishBackoffUsesClockAndStopsOnCancel(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	topic := newScriptTopic(map[string]error{"a": errUnavailable})
	retry := &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, MaxBackoff: time.Minute, AttemptTimeout: time.Second}
	p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: retry, Clock: fake})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := p.Publish(ctx, &Message{ID: "a"}); done <- err }()
	testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errUnavailable) {
		t.Fatalf("err = %v, want both the cancellation and the last attempt's error", err)
	}
	if len(topic.calls) != 1 {
		t.Errorf("calls = %d, want 1 (no send after cancel)", len(topic.calls))
	}
}

func TestPublishRetriesAfterBackoff(t *testing.T) {
	fake := clock.NewFake(time.Unix(0, 0))
	topic := newScriptTopic(map[string]error{"a": errUnavailable})
	retry := &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Minute, MaxBackoff: time.Minute, AttemptTimeout: time.Second}
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{Retry: retry, Clock: fake})
	done := make(chan error)
	go func() { _, err := p.Publish(context.Background(), &Message{ID: "a"}); done <- err }()
	testutil.WaitFor(t, func() bool { return fake.Waiters() == 1 })
	fake.Advance(time.Minute)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestValidationSendsNothing(t *testing.T) {
	tests := []struct {
		name  string
		m     *Message
		field string
	}{
		{"empty ID", &Message{ID: ""}, "ID"},
		{"ID too long", &Message{ID: "123456789"}, "ID"},
		{"refused character", &Message{ID: "a b"}, "ID"},
		{"invalid UTF-8", &Message{ID: "a\xff"}, "ID"},
		{"oversize", &Message{ID: "big", Body: make([]byte, 17)}, "Body"},
		{"attributes count toward size", &Message{ID: "big", Body: make([]byte, 10), Attributes: map[string]string{"k": "123456"}}, "Body"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := newScriptTopic()
			p, _ := NewPublisher(context.Background(), topic, PublisherOptions{})
			res, err := p.PublishBatch(context.Background(), []*Message{{ID: "ok"}, tt.m})
			var ve *ValidationError
			if !errors.Is(err, ErrInvalidMessage) || !errors.As(err, &ve) || ve.Field != tt.field || ve.Index != 1 {
				t.Fatalf("err = %v, want ValidationError on %s of message 1", err, tt.field)
			}
			if len(topic.calls) != 0 {
				t.Errorf("sent %v, want nothing sent", topic.calls)
			}
			if !errors.Is(res[0].Err, ErrNotSent) {
				t.Errorf("valid message result = %v, want ErrNotSent", res[0].Err)
			}
		})
	}
}

func TestKeyFunc(t *testing.T) {
	topic := newScriptTopic()
	topic.limits.MaxIDLength = 0
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{KeyFunc: ContentKey})
	r, err := p.Publish(context.Background(), &Message{Body: []byte("hello")})
	if err != nil || len(r.ID) != 64 {
		t.Fatalf("Publish = %+v, %v; want a 64-char content key", r, err)
	}
}

func TestBatchIsChunked(t *testing.T) {
	topic := newScriptTopic()
	topic.batch = 2
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{})
	if _, err := p.PublishBatch(context.Background(), msgs("a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"a", "b"}, {"c"}}; !equalCalls(topic.calls, want) {
		t.Errorf("calls = %v, want %v", topic.calls, want)
	}
}

func TestNewPublisherRefusesUnsafePolicy(t *testing.T) {
	slow := &window.RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Minute, MaxBackoff: time.Minute, AttemptTimeout: 10 * time.Second}
	tests := []struct {
		name string
		win  window.Window
		ttl  time.Duration
		ok   bool
	}{
		{"10 minutes of retries in a 5-minute window", window.Window{Backend: "sqs", Duration: 5 * time.Minute, Kind: window.KindFixed}, 0, false},
		{"the same in a 7-day window", window.Window{Backend: "servicebus", Duration: 7 * 24 * time.Hour, Kind: window.KindConfigured}, 0, true},
		{"declared consumer dedup covers it", window.Window{Backend: "sqs", Duration: 5 * time.Minute, Kind: window.KindFixed}, time.Hour, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := newScriptTopic()
			topic.win = tt.win
			_, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: slow, ConsumerDedupTTL: tt.ttl})
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, window.ErrUnsafeRetry)) {
				t.Fatalf("NewPublisher err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

// TestPublisherCloseWithDoneContext checks that a done ctx does not make
// Close report publishes in progress when there are none: a deferred
// pub.Close(ctx) after a signal cancelled ctx is the common case.
func TestPublisherCloseWithDoneContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 100 { // a race between two ready cases would show in 100 tries
		p, err := NewPublisher(context.Background(), newScriptTopic(), PublisherOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Close(ctx); err != nil {
			t.Fatalf("Close #%d with nothing in progress = %v, want nil", i, err)
		}
	}
}

// TestPublisherCloseWaitsForPublishes checks that Close waits for a publish
// in flight, and that its ctx bounds that wait.
func TestPublisherCloseWaitsForPublishes(t *testing.T) {
	for _, cancelClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancelClose), func(t *testing.T) {
			top := newScriptTopic()
			top.block, top.entered = make(chan struct{}), make(chan struct{}, 1)
			p, err := NewPublisher(context.Background(), top, PublisherOptions{Retry: fastRetry(1)})
			if err != nil {
				t.Fatal(err)
			}
			published := make(chan error, 1)
			go func() { _, err := p.Publish(context.Background(), &Message{ID: "a"}); published <- err }()
			<-top.entered
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			closed := make(chan error, 1)
			go func() { closed <- p.Close(ctx) }()
			testutil.WaitFor(t, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.idle != nil })
			if cancelClose {
				cancel()
				if err := within(t, closed, "Close"); !errors.Is(err, context.Canceled) {
					t.Fatalf("Close = %v, want context.Canceled", err)
				}
				close(top.block)
				within(t, published, "Publish")
				return
			}
			close(top.block)
			if err := within(t, published, "Publish"); err != nil {
				t.Fatalf("Publish = %v", err)
			}
			if err := within(t, closed, "Close"); err != nil {
				t.Fatalf("Close = %v, want nil", err)
			}
		})
	}
}

func TestClosedPublisher(t *testing.T) {
	p, _ := NewPublisher(context.Background(), newScriptTopic(), PublisherOptions{})
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(context.Background(), &Message{ID: "a"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
}

// TestBatchErrorListsEveryMessageNotStored: a caller that resends exactly
// BatchError.Failed resends every message the broker did not store, each
// failure says whether the broker may have stored it anyway, and
// errors.Is sees every cause.
func TestBatchErrorListsEveryMessageNotStored(t *testing.T) {
	type failure struct {
		index     int
		invalid   bool // a *ValidationError, else a *PublishError
		attempts  int
		maybeSent bool
		is        error
	}
	tests := []struct {
		name         string
		ids          []string
		batch        int
		script       []map[string]error
		cancelOnCall int // cancel ctx during this SendBatch call; 0: never
		short        int
		calls        [][]string
		failed       []failure
	}{
		{
			name: "one invalid message: nothing sent, every message listed",
			ids:  []string{"a", "", "c"}, batch: 10,
			failed: []failure{
				{index: 0, is: ErrNotSent},
				{index: 1, invalid: true, is: ErrInvalidMessage},
				{index: 2, is: ErrNotSent},
			},
		},
		{
			name: "several invalid messages",
			ids:  []string{"a b", "b", "123456789"}, batch: 10,
			failed: []failure{
				{index: 0, invalid: true, is: ErrInvalidMessage},
				{index: 1, is: ErrNotSent},
				{index: 2, invalid: true, is: ErrInvalidMessage},
			},
		},
		{
			name: "a later chunk refused",
			ids:  []string{"a", "b", "c"}, batch: 2,
			script: []map[string]error{{}, {"c": errRefused}},
			calls:  [][]string{{"a", "b"}, {"c"}},
			failed: []failure{{index: 2, attempts: 1, is: errRefused}},
		},
		{
			name: "an earlier chunk refused, the later ones still sent",
			ids:  []string{"a", "b", "c"}, batch: 1,
			script: []map[string]error{{"a": errRefused}},
			calls:  [][]string{{"a"}, {"b"}, {"c"}},
			failed: []failure{{index: 0, attempts: 1, is: errRefused}},
		},
		{
			name: "ctx cancelled between chunks: the rest never sent",
			ids:  []string{"a", "b", "c"}, batch: 1, cancelOnCall: 1,
			calls: [][]string{{"a"}},
			failed: []failure{
				{index: 1, is: context.Canceled},
				{index: 2, is: context.Canceled},
			},
		},
		{
			name: "the driver answers for fewer messages than it was given",
			ids:  []string{"a", "b", "c"}, batch: 10, short: 1,
			calls:  [][]string{{"a", "b", "c"}},
			failed: []failure{{index: 2, attempts: 1, maybeSent: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topic := newScriptTopic(tt.script...)
			topic.batch, topic.short = tt.batch, tt.short
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			topic.onCall = func(call int) {
				if call == tt.cancelOnCall {
					cancel()
				}
			}
			p, err := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(3)})
			if err != nil {
				t.Fatal(err)
			}
			res, err := p.PublishBatch(ctx, msgs(tt.ids...))
			var be *BatchError
			if !errors.As(err, &be) || be.Total != len(tt.ids) || len(be.Failed) != len(tt.failed) {
				t.Fatalf("err = %v, want a BatchError of %d listing %d", err, len(tt.ids), len(tt.failed))
			}
			listed := map[int]bool{}
			for k, w := range tt.failed {
				got := be.Failed[k]
				listed[w.index] = true
				if res[w.index].Err != got {
					t.Errorf("Result[%d].Err = %v, want the listed %v", w.index, res[w.index].Err, got)
				}
				if w.is != nil && (!errors.Is(got, w.is) || !errors.Is(err, w.is)) {
					t.Errorf("Failed[%d] = %v: errors.Is(%v) false on it or on the BatchError", k, got, w.is)
				}
				if w.invalid {
					var ve *ValidationError
					if !errors.As(got, &ve) || ve.Index != w.index {
						t.Errorf("Failed[%d] = %#v, want a ValidationError for message %d", k, got, w.index)
					}
					continue
				}
				var pe *PublishError
				if !errors.As(got, &pe) || pe.Index != w.index || pe.ID != tt.ids[w.index] || pe.Attempts != w.attempts || pe.MaybeSent != w.maybeSent {
					t.Errorf("Failed[%d] = %#v, want a PublishError for message %d (%q), %d attempts, MaybeSent %v",
						k, got, w.index, tt.ids[w.index], w.attempts, w.maybeSent)
				}
			}
			for i, r := range res {
				if !listed[i] && (r.Err != nil || r.BackendID == "") {
					t.Errorf("message %d is not listed, so it must be stored: %+v", i, r)
				}
			}
			if !equalCalls(topic.calls, tt.calls) {
				t.Errorf("calls = %v, want %v", topic.calls, tt.calls)
			}
		})
	}
}

// TestPublishReturnsTheMessagesOwnError: Publish unwraps the one-message
// batch.
func TestPublishReturnsTheMessagesOwnError(t *testing.T) {
	tests := []struct {
		name   string
		m      *Message
		script map[string]error
		check  func(error) bool
	}{
		{"invalid", &Message{ID: ""}, nil, func(err error) bool {
			var ve *ValidationError
			return errors.As(err, &ve) && errors.Is(err, ErrInvalidMessage) && !errors.Is(err, ErrNotSent)
		}},
		{"refused", &Message{ID: "a"}, map[string]error{"a": errRefused}, func(err error) bool {
			var pe *PublishError
			return errors.As(err, &pe) && pe.Attempts == 1 && !pe.MaybeSent && errors.Is(err, errRefused)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := NewPublisher(context.Background(), newScriptTopic(tt.script), PublisherOptions{Retry: fastRetry(1)})
			_, err := p.Publish(context.Background(), tt.m)
			var be *BatchError
			if errors.As(err, &be) || !tt.check(err) {
				t.Fatalf("Publish err = %#v", err)
			}
		})
	}
}
