package adaptertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// testRoundTrip: what is published arrives unchanged, once, as attempt 1,
// under the broker's ID that the publish reported.
func testRoundTrip(t *testing.T, s *suite) {
	cases := []struct {
		name string
		msg  dedupq.Message
	}{
		{"attributes and group key", dedupq.Message{Body: []byte(`{"order":42}`), Attributes: map[string]string{"color": "blue", "n": "1"}, GroupKey: "orders-7"}},
		{"body only", dedupq.Message{Body: []byte("plain")}},
		{"utf-8 body", dedupq.Message{Body: []byte("héllo, 世界"), GroupKey: group}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t, DefaultConfig(), 1)
			m := tc.msg
			m.ID = e.id("rt")
			if m.GroupKey == "" && e.ent.Topic.Limits().GroupKeyRequired {
				m.GroupKey = group
			}
			res := e.publish(&m)
			if res.Duplicate || res.BackendID == "" || res.ID != m.ID {
				t.Errorf("Publish result = %+v, want ID %q, a BackendID and Duplicate false", res, m.ID)
			}
			ds := e.consume("the message", ack, has(m.ID))
			d := deliveredOf(ds, m.ID)[0]
			got := d.Message
			if !bytes.Equal(got.Body, m.Body) {
				t.Errorf("Body = %q, want %q", got.Body, m.Body)
			}
			if len(got.Attributes)+len(m.Attributes) > 0 && !maps.Equal(got.Attributes, m.Attributes) {
				t.Errorf("Attributes = %v, want %v", got.Attributes, m.Attributes)
			}
			if got.GroupKey != m.GroupKey {
				t.Errorf("GroupKey = %q, want %q", got.GroupKey, m.GroupKey)
			}
			if d.Attempt != 1 {
				t.Errorf("Attempt = %d, want 1", d.Attempt)
			}
			if d.BackendID == "" || d.BackendID != res.BackendID {
				t.Errorf("delivery BackendID = %q, want the publish's %q", d.BackendID, res.BackendID)
			}
		})
	}
}

// testBatch: a batch is stored whole, each message under its own broker ID.
func testBatch(t *testing.T, s *suite) {
	e := s.newEnv(t, DefaultConfig(), 2)
	const n = 5
	msgs := make([]*dedupq.Message, n)
	for i := range msgs {
		msgs[i] = e.msg(fmt.Sprintf("batch%d", i))
	}
	res, err := e.pub.PublishBatch(t.Context(), msgs)
	if err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	seen := map[string]bool{}
	for i, r := range res {
		if r.Err != nil || r.Duplicate || r.BackendID == "" || seen[r.BackendID] {
			t.Errorf("result %d = %+v, want a fresh, distinct BackendID", i, r)
		}
		seen[r.BackendID] = true
	}
	ds := e.consume("the whole batch", ack, func(ds []dedupq.Delivery) bool {
		for _, m := range msgs {
			if !has(m.ID)(ds) {
				return false
			}
		}
		return true
	})
	for _, m := range msgs {
		if got := deliveredOf(ds, m.ID); got[0].Attempt != 1 {
			t.Errorf("%s: first delivery is attempt %d, want 1", m.ID, got[0].Attempt)
		}
	}
}

// testDedup: a resend within the window is reported as a duplicate and
// never delivered; after the window the same ID is a new message.
func testDedup(t *testing.T, s *suite) {
	cfg := DefaultConfig()
	e := s.newEnv(t, cfg, 1)
	w := e.pub.Window()
	if !w.Protects() {
		t.Skipf("no publish-side dedup to test: %s", w)
	}
	m := e.msg("dup")
	first := e.publish(m)
	second := e.publish(m)
	if first.Duplicate {
		t.Errorf("first publish reported Duplicate")
	}
	if !second.Duplicate {
		t.Errorf("second publish of %s within the window: Duplicate false, want true", m.ID)
	}
	if first.BackendID != second.BackendID {
		t.Errorf("duplicate's BackendID = %q, want the stored message's %q", second.BackendID, first.BackendID)
	}
	e.consume("the message", ack, has(m.ID))
	e.expectOnlyMarker("the duplicate was delivered", true)

	wait := e.ent.WaitOutWindow
	if wait == nil && e.fake != nil {
		wait = func(context.Context) error { e.fake.Advance(w.Duration); return nil }
	}
	if wait == nil {
		t.Logf("not waiting out the %s: the harness gave no WaitOutWindow", w)
		return
	}
	if err := wait(t.Context()); err != nil {
		t.Fatalf("WaitOutWindow: %v", err)
	}
	before := e.rec.len()
	if again := e.publish(m); again.Duplicate {
		t.Fatalf("publish after the window: Duplicate true, want a new message")
	}
	ds := e.consume("the message published again after the window", ack, func(ds []dedupq.Delivery) bool {
		return has(m.ID)(ds[before:])
	})[before:]
	if got := deliveredOf(ds, m.ID); got[0].Attempt != 1 {
		t.Errorf("after the window: attempt %d, want 1 (a new message)", got[0].Attempt)
	}
}

// testRedelivery: an error or a panic nacks the delivery, which comes back
// with a higher attempt; a permanent error terminates it for good.
func testRedelivery(t *testing.T, s *suite) {
	cases := []struct {
		name      string
		fail      func() error
		redeliver bool
	}{
		{"error", func() error { return errors.New("transient failure") }, true},
		{"panic", func() error { panic("handler panic") }, true},
		{"permanent", func() error { return dedupq.Permanent(errors.New("poison message")) }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t, DefaultConfig(), 1)
			m := e.msg("redeliver")
			e.publish(m)
			h := func(_ context.Context, d *dedupq.Delivery) error {
				if d.Message.ID == m.ID && d.Attempt == 1 {
					return tc.fail()
				}
				return nil
			}
			if tc.redeliver {
				ds := e.consume("the redelivery", h, func(ds []dedupq.Delivery) bool {
					return len(deliveredOf(ds, m.ID)) >= 2
				})
				got := deliveredOf(ds, m.ID)
				if got[0].Attempt != 1 || got[1].Attempt <= got[0].Attempt {
					t.Errorf("attempts %d then %d, want 1 then higher", got[0].Attempt, got[1].Attempt)
				}
				return
			}
			e.consume("the message", h, has(m.ID))
			if e.ent.DeadLetters != nil {
				e.waitDeadLettered(m.ID)
			}
			e.expectOnlyMarker("a permanently failed message was redelivered", true)
		})
	}
}

// waitDeadLettered polls the harness's dead letters, with a deadline, until
// id is among them.
func (e *env) waitDeadLettered(id string) {
	e.t.Helper()
	deadline := time.Now().Add(e.timeout())
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		ids, err := e.ent.DeadLetters(e.t.Context())
		if err != nil {
			e.t.Fatalf("DeadLetters: %v", err)
		}
		for _, got := range ids {
			if got == id {
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s not dead-lettered within %s; dead letters: %v", id, e.timeout(), ids)
		}
		<-tick.C
	}
}

// testWindow: publisher and consumer report the same window, a real one
// unless the backend has none, and the configured one where it is set.
func testWindow(t *testing.T, s *suite) {
	cfg := DefaultConfig()
	e := s.newEnv(t, cfg, 1)
	pw, cw := e.pub.Window(), e.con.Window()
	if pw.Backend == "" {
		t.Errorf("window %+v names no backend", pw)
	}
	// The consumer may scope its window more narrowly (a Pub/Sub
	// subscription names itself and its exactly-once setting).
	if pw.Backend != cw.Backend || pw.Kind != cw.Kind || pw.Duration != cw.Duration || pw.Source != cw.Source {
		t.Errorf("publisher window %+v, consumer window %+v: want the same entity's", pw, cw)
	}
	if none := pw.Kind == window.KindNone; none != (pw.Duration == 0) || pw.Duration < 0 {
		t.Errorf("window %+v: want Duration > 0, or 0 with KindNone", pw)
	}
	if s.caps.ConfiguresWindow && pw.Duration != cfg.DedupWindow {
		t.Errorf("window Duration = %s, want the configured %s", pw.Duration, cfg.DedupWindow)
	}
	if r := e.con.Redelivery(); r.AckWait <= 0 {
		t.Errorf("Redelivery().AckWait = %s, want the real lease", r.AckWait)
	}
}

// refusedRune finds a character the backend refuses in IDs, if any.
func refusedRune(lim driver.Limits) (rune, bool) {
	if lim.IDAllowed == nil {
		return 0, false
	}
	for _, r := range []rune{' ', '\n', '\t', 'é', '\x7f', '*', '>', '/', '.', '|', '#'} {
		if !lim.IDAllowed(r) {
			return r, true
		}
	}
	return 0, false
}

// testValidation: a message the backend would refuse is refused before
// sending with a typed error, and nothing reaches the broker.
func testValidation(t *testing.T, s *suite) {
	cases := []struct {
		name  string
		field string
		// make returns the invalid message, or a reason to skip.
		make func(e *env, lim driver.Limits) (*dedupq.Message, string)
	}{
		{"empty ID", "ID", func(e *env, _ driver.Limits) (*dedupq.Message, string) {
			m := e.msg("x")
			m.ID = ""
			return m, ""
		}},
		{"ID over the length limit", "ID", func(e *env, lim driver.Limits) (*dedupq.Message, string) {
			if lim.MaxIDLength <= 0 {
				return nil, "the backend sets no ID length limit"
			}
			m := e.msg("x")
			m.ID = strings.Repeat("a", lim.MaxIDLength+1)
			return m, ""
		}},
		{"ID with a refused character", "ID", func(e *env, lim driver.Limits) (*dedupq.Message, string) {
			r, ok := refusedRune(lim)
			if !ok {
				return nil, "the backend refuses no character the suite tries"
			}
			m := e.msg("x")
			m.ID = "bad" + string(r) + "id"
			return m, ""
		}},
		{"body over the size limit", "Body", func(e *env, lim driver.Limits) (*dedupq.Message, string) {
			if lim.MaxMessageBytes <= 0 {
				return nil, "the backend sets no size limit"
			}
			m := e.msg("x")
			m.Body = bytes.Repeat([]byte("x"), lim.MaxMessageBytes+1)
			return m, ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := s.newEnv(t, DefaultConfig(), 1)
			m, skip := tc.make(e, e.ent.Topic.Limits())
			if skip != "" {
				t.Skip(skip)
			}
			res, err := e.pub.Publish(t.Context(), m)
			checkInvalid(t, err, tc.field)
			if res.Attempts != 0 {
				t.Errorf("Attempts = %d, want 0: nothing may be sent", res.Attempts)
			}
			e.expectOnlyMarker("a refused message reached the broker", false)
		})
	}
	t.Run("batch with one invalid message", func(t *testing.T) {
		e := s.newEnv(t, DefaultConfig(), 1)
		bad := e.msg("x")
		bad.ID = ""
		res, err := e.pub.PublishBatch(t.Context(), []*dedupq.Message{e.msg("valid"), bad})
		checkInvalid(t, err, "ID")
		if len(res) != 2 || !errors.Is(res[0].Err, dedupq.ErrNotSent) {
			t.Errorf("results %+v: want the valid message marked ErrNotSent", res)
		}
		e.expectOnlyMarker("part of a refused batch reached the broker", false)
	})
}

func checkInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if !errors.Is(err, dedupq.ErrInvalidMessage) {
		t.Fatalf("error %v: want one matching dedupq.ErrInvalidMessage", err)
	}
	var ve *dedupq.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v: want a *dedupq.ValidationError", err)
	}
	if ve.Field != field || ve.Backend == "" {
		t.Errorf("ValidationError Field %q Backend %q, want Field %q and the backend named", ve.Field, ve.Backend, field)
	}
}

// testGroupOrdering: within a group, messages are handled one at a time in
// publish order, even when the first is nacked and redelivered, while
// another group proceeds independently (every env of such a backend asks
// for it: ConsumerOptions.Ordered). A backend that does not order by group
// key must refuse a Consumer that asks, never run it unordered.
func testGroupOrdering(t *testing.T, s *suite) {
	if !s.caps.OrdersGroups {
		ent := s.open(t, DefaultConfig())
		defer ent.Topic.Close()
		con, err := dedupq.NewConsumer(t.Context(), ent.Subscription, dedupq.ConsumerOptions{Ordered: true})
		if err == nil {
			con.Close(context.Background())
			t.Fatal("NewConsumer accepted Ordered on a backend the harness says does not order by group key")
		}
		defer ent.Subscription.Close()
		if !errors.Is(err, dedupq.ErrOrderingUnsupported) {
			t.Fatalf("NewConsumer = %v, want an error matching ErrOrderingUnsupported", err)
		}
		return
	}
	e := s.newEnv(t, DefaultConfig(), 4)
	groups := []string{"ga", "gb"}
	const perGroup = 4
	var msgs []*dedupq.Message
	for i := 1; i <= perGroup; i++ {
		for _, g := range groups {
			msgs = append(msgs, &dedupq.Message{
				ID: e.id(fmt.Sprintf("%s-%d", g, i)), Body: []byte(g), GroupKey: g,
				Attributes: map[string]string{"seq": strconv.Itoa(i)},
			})
		}
	}
	if _, err := e.pub.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	type state struct {
		done     int
		inFlight bool
	}
	var mu sync.Mutex
	states := map[string]*state{}
	var violations []string
	h := func(_ context.Context, d *dedupq.Delivery) error {
		g := d.Message.GroupKey
		i, _ := strconv.Atoi(d.Message.Attributes["seq"])
		mu.Lock()
		st := states[g]
		if st == nil {
			st = &state{}
			states[g] = st
		}
		if st.inFlight {
			violations = append(violations, fmt.Sprintf("%s #%d delivered while another of its group was in flight", d.Message.ID, d.Attempt))
		}
		if i != st.done+1 {
			violations = append(violations, fmt.Sprintf("%s #%d delivered after %s-%d was handled", d.Message.ID, d.Attempt, g, st.done))
		}
		st.inFlight = true
		mu.Unlock()
		runtime.Gosched() // give the broker a chance to hand out the next one early
		fail := i == 1 && d.Attempt == 1
		mu.Lock()
		st.inFlight = false
		if !fail {
			st.done = i
		}
		mu.Unlock()
		if fail {
			return errors.New("nack the head of the group once")
		}
		return nil
	}
	e.consume("every group's last message", h, func(ds []dedupq.Delivery) bool {
		for _, g := range groups {
			if !has(e.id(fmt.Sprintf("%s-%d", g, perGroup)))(ds) {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	for _, g := range groups {
		if st := states[g]; st == nil || st.done != perGroup {
			t.Errorf("group %s: handled up to %v, want %d", g, st, perGroup)
		}
	}
}

// testGracefulShutdown: cancelling Run lets an in-flight handler finish with
// a live context, acks its delivery, and the message does not come back.
func testGracefulShutdown(t *testing.T, s *suite) {
	e := s.newEnv(t, DefaultConfig(), 1)
	m := e.msg("slow")
	started, release := make(chan struct{}), make(chan struct{})
	var startOnce sync.Once
	var ctxErr error
	r := e.start(func(ctx context.Context, d *dedupq.Delivery) error {
		if d.Message.ID == m.ID {
			startOnce.Do(func() { close(started) })
			<-release
			ctxErr = ctx.Err()
		}
		return nil
	})
	e.publish(m)
	deadline := time.NewTimer(e.timeout())
	defer deadline.Stop()
	select {
	case <-started:
	case <-deadline.C:
		t.Fatalf("handler not started within %s", e.timeout())
	}
	r.cancel()
	select {
	case err := <-r.done:
		t.Fatalf("Run returned (%v) while a handler was still in flight", err)
	default:
	}
	close(release)
	r.stop()
	if ctxErr != nil {
		t.Errorf("the in-flight handler's context was done (%v) at shutdown; it must be let finish", ctxErr)
	}
	if ds, _ := e.rec.snapshot(); len(deliveredOf(ds, m.ID)) != 1 {
		n := len(deliveredOf(ds, m.ID))
		t.Errorf("%d deliveries of %s, want 1", n, m.ID)
	}
	e.expectOnlyMarker("the message handled during shutdown was not acked", true)
}

// testReceiveHonoursContext: a driver-level check that Receive on an empty
// entity returns, with the context's error, once its context is cancelled;
// the Consumer's shutdown depends on it.
func testReceiveHonoursContext(t *testing.T, s *suite) {
	ent := s.open(t, DefaultConfig())
	defer ent.Topic.Close()
	defer ent.Subscription.Close()
	ctx, cancel := context.WithCancel(t.Context())
	type result struct {
		ds  []*driver.Delivery
		err error
	}
	done := make(chan result, 1)
	go func() {
		ds, err := ent.Subscription.Receive(ctx, 1)
		done <- result{ds, err}
	}()
	cancel()
	deadline := time.NewTimer(s.caps.WaitTimeout)
	defer deadline.Stop()
	select {
	case r := <-done:
		if len(r.ds) != 0 || !errors.Is(r.err, context.Canceled) {
			t.Errorf("Receive on an empty entity = %d deliveries, %v; want none and context.Canceled", len(r.ds), r.err)
		}
	case <-deadline.C:
		t.Fatalf("Receive did not return within %s of its context being cancelled", s.caps.WaitTimeout)
	}
}
