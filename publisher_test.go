// Tests of the portable Publisher against a scripted driver: no services.
package dedupq

import (
	"context"
	"errors"
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
		s.stored[m.ID]++
		res[i].BackendID = m.ID + "-stored"
		res[i].Duplicate = s.stored[m.ID] > 1
	}
	s.calls = append(s.calls, ids)
	return res, nil
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
	p, _ := NewPublisher(context.Background(), topic, PublisherOptions{Retry: fastRetry(1)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { _, err := p.Publish(ctx, &Message{ID: "a"}); done <- err }()
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

func TestClosedPublisher(t *testing.T) {
	p, _ := NewPublisher(context.Background(), newScriptTopic(), PublisherOptions{})
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(context.Background(), &Message{ID: "a"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
}
