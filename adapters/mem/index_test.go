// Talks to: the in-memory broker only, on a fake clock; no services.
package mem_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
)

// TestIndexEdges covers the edges of the queue's indexes (ready FIFO, seq
// heap of messages ready again, per-group lists, heap of lease and backoff
// ends): each case drives one through the driver on the fake clock and
// checks what a Receive hands out, the Stats and the dead letters.
func TestIndexEdges(t *testing.T) {
	ctx := t.Context()
	cases := []struct {
		name string
		opts mem.Options
		// run drives the broker; it returns the deliveries it checks the
		// final Receive against (nil: no final Receive).
		run      func(f *fixture) []string
		want     []string // the final Receive(10)
		stats    mem.Stats
		wantDead []string
	}{
		{name: "lease ends while its group has later messages: the head comes back, not the next",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2", "a3")
				f.recv(10)
				f.fc.Advance(10 * time.Second)
				return ids(f.recv(10))
			},
			want:  []string{"a1#2"},
			stats: mem.Stats{Stored: 3, InFlight: 1, Published: 3, Deliveries: 2}},
		{name: "ack of a group's head frees its next, delivered in seq order among fresh messages",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1")
				f.send("x2")
				f.sendGroup("g", "a3")
				f.send("x4")
				d := f.recv(1)[0]
				if err := f.sub.Ack(ctx, d); err != nil {
					f.t.Fatal(err)
				}
				return ids(f.recv(10))
			},
			want:  []string{"x2#1", "a3#1", "x4#1"},
			stats: mem.Stats{Stored: 3, InFlight: 3, Published: 4, Deliveries: 4, Acked: 1}},
		{name: "a message freed by an ack comes before a later redelivered one",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2")
				f.send("x3")
				ds := f.recv(10) // a1, x3
				if err := f.sub.Nack(ctx, ds[1], 0); err != nil {
					f.t.Fatal(err)
				}
				if err := f.sub.Ack(ctx, ds[0]); err != nil {
					f.t.Fatal(err)
				}
				return ids(f.recv(10))
			},
			want:  []string{"a2#1", "x3#2"},
			stats: mem.Stats{Stored: 2, InFlight: 2, Published: 3, Deliveries: 4, Acked: 1}},
		{name: "ack of an ungrouped message leaves a blocked group blocked",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2")
				f.send("x")
				ds := f.recv(10) // a1, x
				if err := f.sub.Ack(ctx, ds[1]); err != nil {
					f.t.Fatal(err)
				}
				if s := f.b.Stats(q); s.Ready != 0 {
					f.t.Fatalf("a2 ready behind its leased head: %+v", s)
				}
				return nil
			},
			stats: mem.Stats{Stored: 2, InFlight: 1, Published: 3, Deliveries: 2, Acked: 1}},
		{name: "expired lease on the head at MaxDeliveries dead-letters it and frees the group",
			opts: mem.Options{MaxDeliveries: 1},
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2")
				f.recv(10)
				f.fc.Advance(10 * time.Second)
				return ids(f.recv(10))
			},
			want:     []string{"a2#1"},
			stats:    mem.Stats{Stored: 1, InFlight: 1, DeadLettered: 1, Published: 2, Deliveries: 2},
			wantDead: []string{"a1"}},
		{name: "nack with a delay at MaxDeliveries dead-letters at the delay's end, not before",
			opts: mem.Options{MaxDeliveries: 1},
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2")
				if err := f.sub.Nack(ctx, f.recv(10)[0], 5*time.Second); err != nil {
					f.t.Fatal(err)
				}
				f.fc.Advance(5*time.Second - time.Nanosecond)
				if s := f.b.Stats(q); s.Stored != 2 || s.Ready != 0 || s.DeadLettered != 0 || s.InFlight != 0 {
					f.t.Fatalf("during the delay: %+v", s)
				}
				f.fc.Advance(time.Nanosecond)
				return ids(f.recv(10))
			},
			want:     []string{"a2#1"},
			stats:    mem.Stats{Stored: 1, InFlight: 1, DeadLettered: 1, Published: 2, Deliveries: 2},
			wantDead: []string{"a1"}},
		{name: "leases ending out of seq order in one pass dead-letter in seq order",
			opts: mem.Options{MaxDeliveries: 1},
			run: func(f *fixture) []string {
				f.send("a", "b", "c")
				ds := f.recv(10)
				f.fc.Advance(time.Second)
				if err := f.sub.Extend(ctx, ds[0], 20*time.Second); err != nil { // a ends last
					f.t.Fatal(err)
				}
				f.fc.Advance(time.Minute)
				return nil
			},
			stats:    mem.Stats{DeadLettered: 3, Published: 3, Deliveries: 3},
			wantDead: []string{"a", "b", "c"}},
		{name: "an extended lease outlives a later one",
			run: func(f *fixture) []string {
				f.send("a", "b")
				ds := f.recv(10)
				f.fc.Advance(5 * time.Second)
				if err := f.sub.Extend(ctx, ds[0], 20*time.Second); err != nil {
					f.t.Fatal(err)
				}
				f.fc.Advance(5 * time.Second) // b's lease ends, a's holds
				return ids(f.recv(10))
			},
			want:  []string{"b#2"},
			stats: mem.Stats{Stored: 2, InFlight: 2, Published: 2, Deliveries: 3}},
		{name: "a shorter extension moves no lease",
			run: func(f *fixture) []string {
				f.send("a")
				d := f.recv(1)[0]
				if err := f.sub.Extend(ctx, d, time.Second); err != nil {
					f.t.Fatal(err)
				}
				f.fc.Advance(10*time.Second - time.Nanosecond)
				if s := f.b.Stats(q); s.InFlight != 1 || s.Ready != 0 {
					f.t.Fatalf("before the lease's end: %+v", s)
				}
				f.fc.Advance(time.Nanosecond)
				return ids(f.recv(1))
			},
			want:  []string{"a#2"},
			stats: mem.Stats{Stored: 1, InFlight: 1, Published: 1, Deliveries: 2}},
		{name: "a duplicate delivery's lease keeps the message in flight after the other's ends",
			opts: mem.Options{Faults: mem.Faults{DuplicateDelivery: 1}},
			run: func(f *fixture) []string {
				f.send("a")
				ds := f.recv(2) // a#1 and its copy a#2
				f.fc.Advance(5 * time.Second)
				if err := f.sub.Extend(ctx, ds[1], 20*time.Second); err != nil {
					f.t.Fatal(err)
				}
				f.fc.Advance(5 * time.Second) // a#1's lease ends
				if err := f.sub.Ack(ctx, ds[0]); !errors.Is(err, mem.ErrLeaseExpired) {
					f.t.Fatalf("Ack through the ended lease = %v, want ErrLeaseExpired", err)
				}
				if s := f.b.Stats(q); s.InFlight != 1 || s.Ready != 0 {
					f.t.Fatalf("with a#2's lease live: %+v", s)
				}
				if err := f.sub.Ack(ctx, ds[1]); err != nil {
					f.t.Fatal(err)
				}
				return nil
			},
			stats: mem.Stats{Published: 1, Deliveries: 2, Acked: 1}},
		{name: "a nack through one duplicate ends the other's lease",
			opts: mem.Options{Faults: mem.Faults{DuplicateDelivery: 1}},
			run: func(f *fixture) []string {
				f.send("a")
				ds := f.recv(2)
				if err := f.sub.Nack(ctx, ds[0], time.Second); err != nil {
					f.t.Fatal(err)
				}
				if err := f.sub.Extend(ctx, ds[1], time.Minute); !errors.Is(err, mem.ErrLeaseExpired) {
					f.t.Fatalf("Extend through the other copy = %v, want ErrLeaseExpired", err)
				}
				f.fc.Advance(time.Second)
				return ids(f.recv(1)) // a#3, and its copy a#4 waits
			},
			want:  []string{"a#3"},
			stats: mem.Stats{Stored: 1, Ready: 1, InFlight: 1, Published: 1, Deliveries: 4}},
		{name: "Ready counts only each group's head",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1", "a2")
				f.sendGroup("h", "b1", "b2", "b3")
				f.send("x", "y")
				return nil
			},
			stats: mem.Stats{Stored: 7, Ready: 4, Published: 7}},
		{name: "Ready counts neither leased nor backing-off messages, and a group emptied and refilled",
			run: func(f *fixture) []string {
				f.sendGroup("g", "a1")
				f.send("x", "y")
				ds := f.recv(3)
				if err := f.sub.Ack(ctx, ds[0]); err != nil { // g empties
					f.t.Fatal(err)
				}
				if err := f.sub.Nack(ctx, ds[1], time.Minute); err != nil {
					f.t.Fatal(err)
				}
				f.sendGroup("g", "a2", "a3") // a2 heads the group anew
				return nil
			},
			stats: mem.Stats{Stored: 4, Ready: 1, InFlight: 1, Published: 5, Deliveries: 3, Acked: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts.AckWait == 0 {
				tc.opts.AckWait = 10 * time.Second
			}
			f := newFixture(t, tc.opts)
			if got := tc.run(f); !slices.Equal(got, tc.want) {
				t.Errorf("Receive = %v, want %v", got, tc.want)
			}
			if got := f.b.Stats(q); got != tc.stats {
				t.Errorf("Stats = %+v, want %+v", got, tc.stats)
			}
			var dead []string
			for _, d := range f.b.DeadLetters(q) {
				dead = append(dead, d.Message.ID)
			}
			if !slices.Equal(dead, tc.wantDead) {
				t.Errorf("DeadLetters = %v, want %v", dead, tc.wantDead)
			}
		})
	}
}

// TestDrainsLargeBacklogInOrder consumes a backlog large enough for the
// ready FIFO to reclaim its consumed prefix while messages keep arriving,
// and checks that every message comes out once, in publish order.
func TestDrainsLargeBacklogInOrder(t *testing.T) {
	f := newFixture(t, mem.Options{})
	next, want := 0, 0
	publish := func(k int) {
		msgs := make([]*driver.Message, k)
		for i := range msgs {
			msgs[i] = &driver.Message{ID: "m" + itoa(next)}
			next++
		}
		if _, err := f.top.SendBatch(t.Context(), msgs); err != nil {
			t.Fatal(err)
		}
	}
	for range 50 {
		publish(100)
	}
	for round := 0; want < next; round++ {
		ds, err := f.sub.Receive(t.Context(), 37)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ds {
			if d.Message.ID != "m"+itoa(want) || d.Attempt != 1 {
				t.Fatalf("got %s#%d, want m%d#1", d.Message.ID, d.Attempt, want)
			}
			want++
			if err := f.sub.Ack(t.Context(), d); err != nil {
				t.Fatal(err)
			}
		}
		if round%3 == 0 && next < 20_000 {
			publish(100)
		}
	}
	if s := f.b.Stats(q); s.Stored != 0 || s.Acked != next || s.Ready != 0 {
		t.Errorf("Stats = %+v, want %d acked and nothing stored", s, next)
	}
}

func itoa(i int) string { return fmt.Sprint(i) }
