// Talks to: the in-memory broker only, on a fake clock; no services.
package mem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

const q = "orders"

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness opens each subtest's queue on a broker of its own with a fake
// clock of its own. noWindow runs the suite against a broker without
// publish-side dedup, as on Pub/Sub. realClock runs it on real time, as
// the suite runs against real brokers, to prove its bounded waits work.
type harness struct{ noWindow, realClock bool }

func (h harness) Capabilities() adaptertest.Capabilities {
	return adaptertest.Capabilities{OrdersGroups: true, ConfiguresWindow: !h.noWindow}
}

func (h harness) Open(_ context.Context, _ *testing.T, cfg adaptertest.Config) adaptertest.Entity {
	var clk clock.Clock = clock.NewFake(epoch)
	if h.realClock {
		clk = clock.Real()
	}
	opts := mem.Options{Clock: clk, DedupWindow: cfg.DedupWindow, AckWait: cfg.AckWait, MaxDeliveries: cfg.MaxDeliveries}
	if h.noWindow {
		opts.DedupWindow = 0
	}
	b := mem.NewBroker(opts)
	ent := adaptertest.Entity{
		Topic: b.Topic(q), Subscription: b.Subscription(q), Clock: clk,
		AnotherSubscription: func(context.Context) (driver.Subscription, error) { return b.Subscription(q), nil },
		DeadLetters: func(context.Context) ([]string, error) {
			var ids []string
			for _, d := range b.DeadLetters(q) {
				ids = append(ids, d.Message.ID)
			}
			return ids, nil
		},
	}
	if h.realClock {
		// The window is exact on mem, so waiting it out is a bounded wait
		// of its length; a real broker's harness would poll past its purge.
		ent.WaitOutWindow = func(ctx context.Context) error {
			if !clock.Sleep(clk, opts.DedupWindow, ctx.Done()) {
				return ctx.Err()
			}
			return nil
		}
	}
	return ent
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    harness
	}{
		{"window", harness{}},
		{"no window", harness{noWindow: true}},
		{"real clock", harness{realClock: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.h.realClock && testing.Short() && os.Getenv("CI") == "" {
				// Not a service skip, and never taken under CI.
				t.Skip("waits out leases and the window in real time (about 6s); skipped with -short")
			}
			adaptertest.Run(t, tc.h)
		})
	}
}

// fixture is a broker on a fake clock with driver handles on one queue.
type fixture struct {
	t   *testing.T
	fc  *clock.Fake
	b   *mem.Broker
	top driver.Topic
	sub driver.Subscription
}

func newFixture(t *testing.T, opts mem.Options) *fixture {
	fc := clock.NewFake(epoch)
	opts.Clock = fc
	b := mem.NewBroker(opts)
	return &fixture{t: t, fc: fc, b: b, top: b.Topic(q), sub: b.Subscription(q)}
}

func (f *fixture) send(ids ...string) []driver.SendResult {
	f.t.Helper()
	return f.sendGroup("", ids...)
}

func (f *fixture) sendGroup(group string, ids ...string) []driver.SendResult {
	f.t.Helper()
	msgs := make([]*driver.Message, len(ids))
	for i, id := range ids {
		msgs[i] = &driver.Message{ID: id, Body: []byte("body " + id), GroupKey: group}
	}
	res, err := f.top.SendBatch(f.t.Context(), msgs)
	if err != nil {
		f.t.Fatalf("SendBatch: %v", err)
	}
	for i, r := range res {
		if r.Err != nil {
			f.t.Fatalf("SendBatch %s: %v", ids[i], r.Err)
		}
	}
	return res
}

// recv receives what is deliverable now; it fails if nothing is, since
// every caller first made something due on the fake clock.
func (f *fixture) recv(n int) []*driver.Delivery {
	f.t.Helper()
	if f.b.Stats(q).Ready == 0 {
		f.t.Fatalf("nothing deliverable; stats %+v", f.b.Stats(q))
	}
	ctx, cancel := context.WithTimeout(f.t.Context(), 5*time.Second)
	defer cancel()
	ds, err := f.sub.Receive(ctx, n)
	if err != nil {
		f.t.Fatalf("Receive: %v", err)
	}
	return ds
}

func ids(ds []*driver.Delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, fmt.Sprintf("%s#%d", d.Message.ID, d.Attempt))
	}
	return out
}

func TestDedupWindow(t *testing.T) {
	cases := []struct {
		name      string
		window    time.Duration
		gap       time.Duration
		duplicate bool
	}{
		{"no window", 0, 0, false},
		{"within the window", time.Minute, 59 * time.Second, true},
		{"at the window's end", time.Minute, time.Minute, false},
		{"after the window", time.Minute, 2 * time.Minute, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mem.Options{DedupWindow: tc.window})
			w, _ := f.top.Window(t.Context())
			wantKind := window.KindConfigured
			if tc.window == 0 {
				wantKind = window.KindNone
			}
			if w.Backend != "mem" || w.Duration != tc.window || w.Kind != wantKind || w.Source != window.SourceConfigured {
				t.Errorf("Window = %+v", w)
			}
			first := f.send("a")[0]
			f.fc.Advance(tc.gap)
			second := f.send("a")[0]
			if second.Duplicate != tc.duplicate {
				t.Errorf("second send Duplicate = %v, want %v", second.Duplicate, tc.duplicate)
			}
			if tc.duplicate && second.BackendID != first.BackendID {
				t.Errorf("duplicate BackendID %q, want the original %q", second.BackendID, first.BackendID)
			}
			want := mem.Stats{Stored: 2, Ready: 2, Published: 2}
			if tc.duplicate {
				want = mem.Stats{Stored: 1, Ready: 1, Published: 1, Duplicates: 1}
			}
			if got := f.b.Stats(q); got != want {
				t.Errorf("Stats = %+v, want %+v", got, want)
			}
		})
	}
}

func TestDeadLetter(t *testing.T) {
	cases := []struct {
		name string
		// fail ends one delivery without acking it.
		fail func(f *fixture, d *driver.Delivery)
	}{
		{"lease expiry", func(f *fixture, d *driver.Delivery) { f.fc.Advance(d.Lease) }},
		{"nack", func(f *fixture, d *driver.Delivery) {
			if err := f.sub.Nack(f.t.Context(), d, 0); err != nil {
				f.t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mem.Options{AckWait: 10 * time.Second, MaxDeliveries: 3})
			f.send("a")
			for attempt := 1; attempt <= 3; attempt++ {
				ds := f.recv(1)
				if len(ds) != 1 || ds[0].Attempt != attempt {
					t.Fatalf("delivery %d: got %v", attempt, ids(ds))
				}
				tc.fail(f, ds[0])
			}
			dl := f.b.DeadLetters(q)
			if len(dl) != 1 || dl[0].Message.ID != "a" || dl[0].Deliveries != 3 || dl[0].BackendID == "" {
				t.Fatalf("DeadLetters = %+v, want a after 3 deliveries", dl)
			}
			if s := f.b.Stats(q); s.Stored != 0 || s.Ready != 0 || s.DeadLettered != 1 {
				t.Errorf("Stats = %+v, want nothing stored and one dead letter", s)
			}
		})
	}
}

func TestTerminate(t *testing.T) {
	f := newFixture(t, mem.Options{})
	f.send("a")
	d := f.recv(1)[0]
	if err := f.sub.Terminate(t.Context(), d, errors.New("poison")); err != nil {
		t.Fatal(err)
	}
	dl := f.b.DeadLetters(q)
	if len(dl) != 1 || dl[0].Reason != "terminated: poison" {
		t.Fatalf("DeadLetters = %+v", dl)
	}
	// Settling again through the same delivery is harmless, as on real
	// brokers.
	if err := f.sub.Ack(t.Context(), d); err != nil {
		t.Errorf("Ack after Terminate = %v, want nil", err)
	}
}

func TestLostAckRedelivers(t *testing.T) {
	f := newFixture(t, mem.Options{AckWait: 30 * time.Second, Faults: mem.Faults{LostAck: 1}})
	f.send("a")
	d := f.recv(1)[0]
	if err := f.sub.Ack(t.Context(), d); err != nil {
		t.Fatalf("lost Ack returned %v, want nil (the loss is silent)", err)
	}
	if s := f.b.Stats(q); s.InFlight != 1 || s.Acked != 0 {
		t.Fatalf("after a lost ack: Stats = %+v, want the message still in flight", s)
	}
	f.fc.Advance(30*time.Second - time.Nanosecond)
	if s := f.b.Stats(q); s.Ready != 0 {
		t.Fatalf("redelivered before the lease ended: %+v", s)
	}
	f.fc.Advance(time.Nanosecond)
	if ds := f.recv(1); ds[0].Message.ID != "a" || ds[0].Attempt != 2 {
		t.Fatalf("after the lease: %v, want a#2", ids(ds))
	}
}

func TestGroupOrdering(t *testing.T) {
	f := newFixture(t, mem.Options{AckWait: 10 * time.Second})
	f.sendGroup("A", "a1", "a2")
	f.sendGroup("B", "b1")
	f.sendGroup("", "x")
	first := f.recv(10)
	if got, want := ids(first), []string{"a1#1", "b1#1", "x#1"}; !slices.Equal(got, want) {
		t.Fatalf("first receive = %v, want %v (a2 held behind a1)", got, want)
	}
	// A nack with a delay keeps the group blocked until the delay ends.
	if err := f.sub.Nack(t.Context(), first[0], 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if s := f.b.Stats(q); s.Ready != 0 {
		t.Fatalf("during a1's backoff: %d ready, want none", s.Ready)
	}
	f.fc.Advance(5 * time.Second)
	again := f.recv(10)
	if got, want := ids(again), []string{"a1#2"}; !slices.Equal(got, want) {
		t.Fatalf("after the backoff = %v, want %v", got, want)
	}
	if err := f.sub.Ack(t.Context(), again[0]); err != nil {
		t.Fatal(err)
	}
	if got, want := ids(f.recv(10)), []string{"a2#1"}; !slices.Equal(got, want) {
		t.Fatalf("after acking a1 = %v, want %v", got, want)
	}
}

func TestNackDelay(t *testing.T) {
	cases := []struct {
		name    string
		backoff []time.Duration
		delay   time.Duration
		want    time.Duration
	}{
		{"no backoff", nil, 0, 0},
		{"broker backoff", []time.Duration{3 * time.Second}, 0, 3 * time.Second},
		{"explicit delay wins", []time.Duration{3 * time.Second}, 7 * time.Second, 7 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mem.Options{Backoff: tc.backoff})
			f.send("a")
			if err := f.sub.Nack(t.Context(), f.recv(1)[0], tc.delay); err != nil {
				t.Fatal(err)
			}
			if tc.want > 0 {
				f.fc.Advance(tc.want - time.Nanosecond)
				if s := f.b.Stats(q); s.Ready != 0 {
					t.Fatalf("ready before the delay ended: %+v", s)
				}
				f.fc.Advance(time.Nanosecond)
			}
			if ds := f.recv(1); ds[0].Attempt != 2 {
				t.Fatalf("redelivery = %v, want a#2", ids(ds))
			}
		})
	}
}

func TestLease(t *testing.T) {
	f := newFixture(t, mem.Options{AckWait: 10 * time.Second})
	f.send("a")
	d := f.recv(1)[0]
	if d.Lease != 10*time.Second || d.BackendID != "1" {
		t.Errorf("delivery Lease %s BackendID %q", d.Lease, d.BackendID)
	}
	f.fc.Advance(8 * time.Second)
	if err := f.sub.Extend(t.Context(), d, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	f.fc.Advance(9 * time.Second) // 17s after delivery: the extended lease holds
	if s := f.b.Stats(q); s.InFlight != 1 {
		t.Fatalf("extended lease lost: %+v", s)
	}
	f.fc.Advance(time.Second)
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"Ack", func() error { return f.sub.Ack(t.Context(), d) }},
		{"Nack", func() error { return f.sub.Nack(t.Context(), d, 0) }},
		{"Extend", func() error { return f.sub.Extend(t.Context(), d, time.Second) }},
		{"Terminate", func() error { return f.sub.Terminate(t.Context(), d, nil) }},
	} {
		if err := op.do(); !errors.Is(err, mem.ErrLeaseExpired) {
			t.Errorf("%s after the lease ended = %v, want ErrLeaseExpired", op.name, err)
		}
	}
	if ds := f.recv(1); ds[0].Attempt != 2 {
		t.Fatalf("after expiry = %v, want a#2", ids(ds))
	}
}

// TestReceiveWakes checks that a blocked Receive wakes on every event that
// can make a delivery due, without polling.
func TestReceiveWakes(t *testing.T) {
	cases := []struct {
		name string
		// setup leaves nothing deliverable; event makes a#want due.
		setup func(f *fixture) *driver.Delivery
		event func(f *fixture, d *driver.Delivery)
		want  string
	}{
		{"publish", func(f *fixture) *driver.Delivery { return nil },
			func(f *fixture, _ *driver.Delivery) { f.send("a") }, "a#1"},
		{"nack", func(f *fixture) *driver.Delivery { f.send("a"); return f.recv(1)[0] },
			func(f *fixture, d *driver.Delivery) { f.sub.Nack(f.t.Context(), d, 0) }, "a#2"},
		{"lease expiry", func(f *fixture) *driver.Delivery { f.send("a"); return f.recv(1)[0] },
			func(f *fixture, d *driver.Delivery) { f.advanceWhenWaiting(d.Lease) }, "a#2"},
		{"backoff end", func(f *fixture) *driver.Delivery {
			f.send("a")
			d := f.recv(1)[0]
			f.sub.Nack(f.t.Context(), d, time.Minute)
			return d
		}, func(f *fixture, _ *driver.Delivery) { f.advanceWhenWaiting(time.Minute) }, "a#2"},
		{"ack frees the group", func(f *fixture) *driver.Delivery {
			f.sendGroup("g", "a0", "a")
			return f.recv(1)[0]
		}, func(f *fixture, d *driver.Delivery) { f.sub.Ack(f.t.Context(), d) }, "a#1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mem.Options{AckWait: 10 * time.Second})
			d := tc.setup(f)
			got := make(chan []*driver.Delivery, 1)
			go func() {
				ds, err := f.sub.Receive(t.Context(), 1)
				if err != nil {
					t.Error(err)
				}
				got <- ds
			}()
			tc.event(f, d)
			select {
			case ds := <-got:
				if s := ids(ds); len(s) != 1 || s[0] != tc.want {
					t.Errorf("Receive = %v, want %s", s, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Receive did not wake")
			}
		})
	}
}

// advanceWhenWaiting advances the clock once a Receive waits on a timer, so
// that the advance is what wakes it.
func (f *fixture) advanceWhenWaiting(d time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for f.fc.Waiters() == 0 {
		if time.Now().After(deadline) {
			f.t.Fatal("no Receive waiting on the clock")
		}
		<-tick.C
	}
	f.fc.Advance(d)
}

func TestDuplicatePublishFault(t *testing.T) {
	cases := []struct {
		name       string
		window     time.Duration
		stored     int
		duplicate  bool
		duplicates int
	}{
		{"within the window the copy is dropped", time.Minute, 1, true, 1},
		{"without a window the copy is stored", 0, 2, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, mem.Options{DedupWindow: tc.window, Faults: mem.Faults{DuplicatePublish: 1}})
			res := f.send("a")[0]
			if res.Duplicate != tc.duplicate {
				t.Errorf("Duplicate = %v, want %v (the caller sees the answer to the resend)", res.Duplicate, tc.duplicate)
			}
			if s := f.b.Stats(q); s.Stored != tc.stored || s.Duplicates != tc.duplicates {
				t.Errorf("Stats = %+v, want %d stored, %d duplicates", s, tc.stored, tc.duplicates)
			}
		})
	}
}

func TestDuplicateDeliveryFault(t *testing.T) {
	f := newFixture(t, mem.Options{Faults: mem.Faults{DuplicateDelivery: 1}})
	f.send("a")
	first := f.recv(1)
	second := f.recv(1) // the copy, held for the next Receive
	if got := append(ids(first), ids(second)...); !slices.Equal(got, []string{"a#1", "a#2"}) {
		t.Fatalf("deliveries = %v, want a#1 and its concurrent copy a#2", got)
	}
	for _, d := range []*driver.Delivery{first[0], second[0]} {
		if err := f.sub.Ack(t.Context(), d); err != nil {
			t.Errorf("Ack %s#%d = %v", d.Message.ID, d.Attempt, err)
		}
	}
	if s := f.b.Stats(q); s.Stored != 0 || s.Acked != 1 || s.Deliveries != 2 {
		t.Errorf("Stats = %+v, want acked once after two deliveries", s)
	}
}

// TestFaultsDeterministic runs one scenario with every fault and checks the
// outcome depends on the seed alone.
func TestFaultsDeterministic(t *testing.T) {
	run := func(seed uint64) string {
		f := newFixture(t, mem.Options{
			DedupWindow: time.Minute, AckWait: time.Second,
			Faults: mem.Faults{Seed: seed, DuplicatePublish: 0.3, DuplicateDelivery: 0.3, LostAck: 0.3},
		})
		var trace []string
		for i := range 40 {
			r := f.send(fmt.Sprintf("m%d", i))[0]
			if r.Duplicate {
				trace = append(trace, fmt.Sprintf("dup-publish m%d", i))
			}
		}
		for round := 0; f.b.Stats(q).Stored > 0; round++ {
			if round > 20 {
				t.Fatal("messages never drained")
			}
			for f.b.Stats(q).Ready > 0 {
				for _, d := range f.recv(5) {
					trace = append(trace, fmt.Sprintf("%s#%d", d.Message.ID, d.Attempt))
					if err := f.sub.Ack(t.Context(), d); err != nil {
						t.Fatal(err)
					}
				}
			}
			f.fc.Advance(time.Second) // lost acks come back
		}
		return fmt.Sprint(trace, f.b.Stats(q))
	}
	a, b, c := run(1), run(1), run(2)
	if a != b {
		t.Errorf("seed 1 gave two outcomes:\n%s\n%s", a, b)
	}
	if a == c {
		t.Errorf("seeds 1 and 2 gave the same outcome: %s", a)
	}
}

func TestClosed(t *testing.T) {
	f := newFixture(t, mem.Options{})
	f.top.Close()
	if _, err := f.top.SendBatch(t.Context(), []*driver.Message{{ID: "a"}}); !errors.Is(err, mem.ErrClosed) {
		t.Errorf("SendBatch after Close = %v, want ErrClosed", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.sub.Receive(t.Context(), 1)
		done <- err
	}()
	f.sub.Close()
	select {
	case err := <-done:
		if !errors.Is(err, mem.ErrClosed) {
			t.Errorf("Receive on a closed subscription = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Receive")
	}
}

func TestRefusesWithoutValidation(t *testing.T) {
	f := newFixture(t, mem.Options{})
	lim := f.top.Limits()
	if lim.MaxIDLength != 128 || lim.MaxMessageBytes != 256<<10 || lim.IDAllowed(' ') || !lim.IDAllowed('~') {
		t.Errorf("default limits = %+v", lim)
	}
	res, err := f.top.SendBatch(t.Context(), []*driver.Message{
		{ID: ""}, {ID: "ok"}, {ID: "big", Body: make([]byte, 256<<10+1)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, wantErr := range []bool{true, false, true} {
		if (res[i].Err != nil) != wantErr || (wantErr && !errors.Is(res[i].Err, mem.ErrRefused)) {
			t.Errorf("result %d = %+v", i, res[i])
		}
	}
	if s := f.b.Stats(q); s.Stored != 1 {
		t.Errorf("stored %d, want only the valid message", s.Stored)
	}
}
