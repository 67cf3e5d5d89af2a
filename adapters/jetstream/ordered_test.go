package jetstream

// Ordered durables (ordered=true) on real servers: the embedded
// nats-server, the out-of-process one of the same release
// (forEachOrderedServer), and the local 2.9.10 at 127.0.0.1:4222 for the
// refusal. TestOrderedOwnerKilled runs a Consumer in a child process (this
// test binary again, see TestMain) and SIGKILLs it by its PID.
// TestNackDelayCapped talks to no server.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// orderedTestConfig is testConfig with an ordered durable: a 1s ack wait
// makes a 1s pull wait and a 3s PinnedTTL.
func orderedTestConfig(t testing.TB, srv server) Config {
	cfg := testConfig(t, srv)
	cfg.Ordered = true
	return cfg
}

// groupMsgs are messages from..to of group g, with IDs g-from … g-to.
func groupMsgs(g string, from, to int) []*driver.Message {
	var msgs []*driver.Message
	for i := from; i <= to; i++ {
		msgs = append(msgs, &driver.Message{ID: fmt.Sprintf("%s-%d", g, i), Body: []byte(g), GroupKey: g})
	}
	return msgs
}

func ids(ds []*driver.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Message.ID
	}
	return out
}

// TestOrderedDurableCreated: ordered=true creates the durable with a pinned
// priority group and the PinnedTTL the order needs, reports it before and
// after it exists, and an existing one fits a second open.
func TestOrderedDurableCreated(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := orderedTestConfig(t, srv)
		openTopic(t, nc, cfg)
		planned, err := OpenSubscription(ctxT(t), nc, cfg)
		if err != nil {
			t.Fatalf("OpenSubscription: %v", err)
		}
		defer planned.Close()
		if err := planned.OrdersGroups(ctxT(t)); err != nil {
			t.Errorf("OrdersGroups before the durable exists: %v, want nil: it will be created ordered", err)
		}
		want := Ordering{Group: PriorityGroup, PinnedTTL: 3 * time.Second, Takeover: 3750 * time.Millisecond, MaxNackDelay: time.Second}
		if got := planned.Ordering(ctxT(t)); got != want {
			t.Errorf("Ordering before the durable exists = %+v, want %+v", got, want)
		}
		sub := openSub(t, nc, cfg)
		js, _ := jetstream.New(nc)
		cons, err := js.Consumer(ctxT(t), cfg.Stream, cfg.Durable)
		if err != nil {
			t.Fatal(err)
		}
		c := cons.CachedInfo().Config
		if c.PriorityPolicy != jetstream.PriorityPolicyPinned || !slices.Equal(c.PriorityGroups, []string{PriorityGroup}) ||
			c.PinnedTTL != MinPinnedTTL(time.Second) || c.MaxRequestExpires != time.Second {
			t.Errorf("created durable: PriorityPolicy %v, PriorityGroups %v, PinnedTTL %s, MaxRequestExpires %s; want pinned_client, [%s], %s, 1s",
				c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL, c.MaxRequestExpires, PriorityGroup, MinPinnedTTL(time.Second))
		}
		if err := sub.OrdersGroups(ctxT(t)); err != nil {
			t.Errorf("OrdersGroups: %v", err)
		}
		if got := sub.Ordering(ctxT(t)); got != want {
			t.Errorf("Ordering = %+v, want %+v", got, want)
		}
		openSub(t, nc, cfg)
	})
}

// TestOrderedRefusals: what is not an ordered durable is refused with the
// fix: at open when the URL says ordered=true, by OrdersGroups (and so by
// an ordered Consumer) otherwise; and an update that adds the pieces
// makes a durable ordered.
func TestOrderedRefusals(t *testing.T) {
	srv := server{"embedded", embeddedURL}
	plain := func(*jetstream.ConsumerConfig) {}
	pinned := func(ttl time.Duration) func(*jetstream.ConsumerConfig) {
		return func(c *jetstream.ConsumerConfig) {
			c.PriorityPolicy, c.PriorityGroups, c.PinnedTTL, c.MaxRequestExpires = jetstream.PriorityPolicyPinned, []string{"workers"}, ttl, time.Second
		}
	}
	cases := []struct {
		name    string
		durable func(*jetstream.ConsumerConfig) // nil: none
		ordered bool
		pinTTL  time.Duration
		// openErr is part of the open's *DurableError; ordersErr part of
		// OrdersGroups' error, when the open worked.
		openErr, ordersErr string
	}{
		{"plain durable, ordered=true", plain, true, 0, "it has no pinned priority group", ""},
		{"plain durable", plain, false, 0, "", "has no pinned priority group, so every consumer pulls from it at once: give it PriorityPolicy pinned_client"},
		{"missing durable", nil, false, 0, "", "will be created without a pinned priority group"},
		{"pinned, PinnedTTL too short", pinned(2 * time.Second), false, 0, "", "raise PinnedTTL to 3s or more"},
		{"pinned, PinnedTTL too short, ordered=true", pinned(2 * time.Second), true, 0, "raise PinnedTTL to 3s or more", ""},
		{"pinned, other PinnedTTL than asked", pinned(4 * time.Second), true, 5 * time.Second, "its PinnedTTL is 4s, not 5s", ""},
		{"pinned with BackOff", func(c *jetstream.ConsumerConfig) {
			pinned(time.Minute)(c)
			c.BackOff = []time.Duration{time.Second, 2 * time.Second}
		}, false, 0, "", "it has BackOff"},
		{"pinned as an operator made it", pinned(3 * time.Second), false, 0, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nc := connect(t, srv)
			cfg := testConfig(t, srv)
			if tc.durable != nil {
				durableFor(t, nc, cfg, tc.durable)
			} else {
				openTopic(t, nc, cfg)
			}
			cfg.Ordered, cfg.PinnedTTL = tc.ordered, tc.pinTTL
			sub, err := OpenSubscription(ctxT(t), nc, cfg)
			if tc.openErr != "" {
				var de *DurableError
				if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.openErr) {
					t.Fatalf("OpenSubscription: %v, want a *DurableError saying %q", err, tc.openErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenSubscription: %v", err)
			}
			defer sub.Close()
			err = sub.OrdersGroups(ctxT(t))
			switch {
			case tc.ordersErr == "" && err != nil:
				t.Errorf("OrdersGroups: %v, want nil", err)
			case tc.ordersErr != "" && (err == nil || !strings.Contains(err.Error(), tc.ordersErr)):
				t.Errorf("OrdersGroups: %v, want an error saying %q", err, tc.ordersErr)
			}
		})
	}

	t.Run("an update adds the pieces", func(t *testing.T) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		_, cons := durableFor(t, nc, cfg, plain)
		cc := cons.CachedInfo().Config
		pinned(3 * time.Second)(&cc)
		js, _ := jetstream.New(nc)
		if _, err := js.UpdateConsumer(ctxT(t), cfg.Stream, cc); err != nil {
			t.Fatalf("the update the refusal suggests: %v", err)
		}
		cfg.Ordered = true
		sub := openSub(t, nc, cfg)
		if err := sub.OrdersGroups(ctxT(t)); err != nil {
			t.Errorf("OrdersGroups after the update: %v", err)
		}
	})

	t.Run("an ordered Consumer on a plain durable", func(t *testing.T) {
		cfg := testConfig(t, srv)
		_, err := dedupq.OpenConsumer(ctxT(t), cfg.URL(srv.url), dedupq.ConsumerOptions{Ordered: true})
		if !errors.Is(err, dedupq.ErrOrderingUnsupported) || !strings.Contains(err.Error(), "ordered=true") {
			t.Fatalf("OpenConsumer: %v, want ErrOrderingUnsupported naming ordered=true", err)
		}
	})
}

// TestOrderedRefusedOnOldServer: the local server (2.9.10) has no priority
// groups, and would create a durable without them: ordered=true is
// refused at open, naming the version needed, before anything is created,
// and an ordered Consumer on a plain durable is refused the same way.
func TestOrderedRefusedOnOldServer(t *testing.T) {
	srv := server{"local", "nats://" + localAddr}
	needServer(t, srv)
	nc := connect(t, srv)
	if serverAtLeast(nc.ConnectedServerVersion(), 2, 11, 0) {
		t.Fatalf("the local server runs %s, which has priority groups: this test needs one older than %s", nc.ConnectedServerVersion(), OrderedServerVersion)
	}
	wantText := []string{"nats-server " + OrderedServerVersion + " or later", "the server runs " + nc.ConnectedServerVersion()}
	cfg := orderedTestConfig(t, srv)
	_, err := OpenSubscription(ctxT(t), nc, cfg)
	for _, w := range wantText {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Fatalf("OpenSubscription(ordered=true): %v, want an error saying %q", err, w)
		}
	}
	js, _ := jetstream.New(nc)
	if _, err := js.Stream(ctxT(t), cfg.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("after the refusal, looking the stream up: %v, want it not created", err)
	}

	cfg.Ordered = false
	_, err = dedupq.OpenConsumer(ctxT(t), cfg.URL(srv.url), dedupq.ConsumerOptions{Ordered: true})
	if !errors.Is(err, dedupq.ErrOrderingUnsupported) || !strings.Contains(err.Error(), wantText[0]) {
		t.Fatalf("OpenConsumer(Ordered): %v, want ErrOrderingUnsupported saying %q", err, wantText[0])
	}
}

// TestOrderedOneConsumerAtATime: two Consumers on one ordered durable, each
// with its own connection: one is pinned and handles every message, the
// other stands by; no group's messages run at once or out of order.
func TestOrderedOneConsumerAtATime(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		cfg := orderedTestConfig(t, srv)
		cfg.CreateStream = true
		url := cfg.URL(srv.url)
		const groups, perGroup = 8, 20
		var (
			mu         sync.Mutex
			next       = map[string]int{}
			running    = map[string]bool{}
			byConsumer [2]int
			violations []string
			done       = make(chan struct{})
		)
		handler := func(c int) dedupq.Handler {
			return func(_ context.Context, d *dedupq.Delivery) error {
				g := d.Message.GroupKey
				mu.Lock()
				if running[g] {
					violations = append(violations, fmt.Sprintf("%s started while another of its group ran", d.Message.ID))
				}
				if want := fmt.Sprintf("%s-%d", g, next[g]+1); d.Message.ID != want {
					violations = append(violations, fmt.Sprintf("%s handled when %s was due", d.Message.ID, want))
				}
				running[g] = true
				mu.Unlock()
				time.Sleep(time.Millisecond) // a handler's work, giving others the chance to overlap
				mu.Lock()
				running[g] = false
				next[g]++
				byConsumer[c]++
				if byConsumer[0]+byConsumer[1] == groups*perGroup {
					close(done)
				}
				mu.Unlock()
				return nil
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		for c := range 2 {
			con, err := dedupq.OpenConsumer(ctxT(t), url, dedupq.ConsumerOptions{Ordered: true, Concurrency: 8})
			if err != nil {
				t.Fatalf("OpenConsumer %d: %v", c, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer con.Close(context.Background())
				if err := con.Run(ctx, handler(c)); err != nil {
					t.Errorf("consumer %d: Run: %v", c, err)
				}
			}()
		}
		top := openTopic(t, connect(t, srv), cfg)
		var msgs []*driver.Message
		for i := 1; i <= perGroup; i++ {
			for g := range groups {
				msgs = append(msgs, groupMsgs(fmt.Sprintf("g%d", g), i, i)...)
			}
		}
		send(t, top, msgs...)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			mu.Lock()
			t.Errorf("handled %v of %d messages within 30s", byConsumer, groups*perGroup)
			mu.Unlock()
		}
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, v := range violations {
			t.Error(v)
		}
		if byConsumer[0] != 0 && byConsumer[1] != 0 {
			t.Errorf("both consumers handled messages (%d and %d): the durable's pin must keep one at a time", byConsumer[0], byConsumer[1])
		}
	})
}

// TestOrderedTakeoverInStreamOrder: a consumer that holds three messages of
// a group, the first extended while it runs, dies; the standby is pinned
// once PinnedTTL passed and gets the three in stream order, though the
// server has them due in another (the ones waiting behind the first
// first).
func TestOrderedTakeoverInStreamOrder(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		cfg := orderedTestConfig(t, srv)
		top := openTopic(t, connect(t, srv), cfg)
		ncA := connect(t, srv)
		a := openSub(t, ncA, cfg)
		b := openSub(t, connect(t, srv), cfg)
		send(t, top, groupMsgs("g", 1, 3)...)
		held := receiveN(t, a, 3)
		if got := ids(held); !slices.Equal(got, []string{"g-1", "g-2", "g-3"}) {
			t.Fatalf("the owner got %v", got)
		}
		// The first runs on past the others' receipt, as a handler's lease
		// keeper extends it: it is due for redelivery last. (The wait makes
		// the gap between the due times, larger than the server's timer's
		// slop; it waits for no condition.)
		time.Sleep(300 * time.Millisecond)
		if err := a.Extend(ctxT(t), held[0], time.Second); err != nil {
			t.Fatal(err)
		}
		a.Close()
		ncA.Close() // the owner dies
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		got, err := b.Receive(ctx, 10)
		if err != nil {
			t.Fatalf("the standby's Receive: %v", err)
		}
		if ids := ids(got); !slices.Equal(ids, []string{"g-1", "g-2", "g-3"}) {
			t.Fatalf("the standby got %v, want g-1, g-2, g-3", ids)
		}
		for _, d := range got {
			if d.Attempt != 2 {
				t.Errorf("%s: attempt %d, want 2", d.Message.ID, d.Attempt)
			}
		}
	})
}

// TestOrderedPinKeptWhileHeld: a consumer that holds a delivery and does
// not pull (its handlers busy) keeps its pin past PinnedTTL, so the
// standby gets nothing, not even messages published meanwhile; once it
// settles and stops, the standby takes over.
func TestOrderedPinKeptWhileHeld(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		cfg := orderedTestConfig(t, srv)
		top := openTopic(t, connect(t, srv), cfg)
		a := openSub(t, connect(t, srv), cfg)
		b := openSub(t, connect(t, srv), cfg)
		send(t, top, groupMsgs("g", 1, 1)...)
		held := receiveN(t, a, 1)
		send(t, top, groupMsgs("g", 2, 3)...)
		// The holder extends its delivery as a Consumer's lease keeper
		// does, while the standby tries for twice PinnedTTL.
		stop := make(chan struct{})
		extended := make(chan error, 1)
		go func() {
			tick := time.NewTicker(400 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					extended <- nil
					return
				case <-tick.C:
					if err := a.Extend(context.Background(), held[0], time.Second); err != nil {
						extended <- err
						return
					}
				}
			}
		}()
		expectNone(t, b, 2*MinPinnedTTL(time.Second))
		close(stop)
		if err := <-extended; err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if err := a.Ack(ctxT(t), held[0]); err != nil {
			t.Fatal(err)
		}
		got := receiveN(t, b, 2)
		if ids := ids(got); !slices.Equal(ids, []string{"g-2", "g-3"}) {
			t.Fatalf("the standby got %v, want g-2, g-3", ids)
		}
	})
}

// ownerChildEnv, set to a jetstream URL, makes this test binary a child
// that runs an ordered Consumer on it (runOwnerChild, from TestMain);
// ownerBlockEnv names the message whose handler never returns.
const (
	ownerChildEnv = "DEDUPQ_JETSTREAM_OWNER_URL"
	ownerBlockEnv = "DEDUPQ_JETSTREAM_OWNER_BLOCK"
)

// runOwnerChild consumes the URL in ownerChildEnv with an ordered Consumer
// of four handlers, printing "ran ID" as each handler starts, until it is
// killed.
func runOwnerChild(url string) int {
	con, err := dedupq.OpenConsumer(context.Background(), url, dedupq.ConsumerOptions{Ordered: true, Concurrency: 4})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: OpenConsumer:", err)
		return 1
	}
	var mu sync.Mutex
	block := os.Getenv(ownerBlockEnv)
	err = con.Run(context.Background(), func(_ context.Context, d *dedupq.Delivery) error {
		mu.Lock()
		fmt.Printf("ran %s\n", d.Message.ID)
		mu.Unlock()
		if d.Message.ID == block {
			select {} // mid-group, until the kill
		}
		return nil
	})
	fmt.Fprintln(os.Stderr, "child: Run:", err)
	return 1
}

// TestOrderedOwnerKilled: the pinned consumer, a child process, is
// SIGKILLed while a group's fourth message runs and later ones wait behind
// it; a standby Consumer in this process, which got nothing while the
// child lived (the child's pin held though its handlers were all busy),
// takes the group over after PinnedTTL and handles the rest, from the
// fourth, each once and in order.
func TestOrderedOwnerKilled(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		cfg := orderedTestConfig(t, srv)
		// Waiting deliveries go back and come again while the group is
		// stuck: unlimited deliveries, so that none is dropped.
		cfg.MaxDeliver = -1
		top := openTopic(t, connect(t, srv), cfg)
		const last = 10
		send(t, top, groupMsgs("g", 1, last)...)
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		child := exec.Command(exe, "-test.run=^$")
		child.Env = append(os.Environ(), ownerChildEnv+"="+cfg.URL(srv.url), ownerBlockEnv+"=g-4")
		child.Stderr = os.Stderr
		out, err := child.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = child.Wait(); close(exited) }()
		t.Cleanup(func() { _ = child.Process.Kill(); <-exited })
		ran := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				ran <- strings.TrimPrefix(sc.Text(), "ran ")
			}
			close(ran)
		}()
		var childRan []string
		for len(childRan) < 4 {
			select {
			case id, ok := <-ran:
				if !ok {
					t.Fatalf("the child exited after running %v", childRan)
				}
				childRan = append(childRan, id)
			case <-time.After(30 * time.Second):
				t.Fatalf("the child ran %v within 30s", childRan)
			}
		}
		if !slices.Equal(childRan, []string{"g-1", "g-2", "g-3", "g-4"}) {
			t.Fatalf("the child ran %v, want g-1 … g-4", childRan)
		}

		var (
			mu   sync.Mutex
			took []string
			all  = make(chan struct{})
		)
		standby, err := dedupq.OpenConsumer(ctxT(t), cfg.URL(srv.url), dedupq.ConsumerOptions{Ordered: true, Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() {
			runDone <- standby.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				took = append(took, d.Message.ID)
				if d.Message.ID == fmt.Sprintf("g-%d", last) {
					close(all)
				}
				return nil
			})
		}()
		defer func() {
			cancel()
			<-runDone
			standby.Close(context.Background())
		}()
		// The child holds g-4 and its four handler slots (g-5 … wait
		// behind it) for twice PinnedTTL: its pin must hold.
		hold := time.NewTimer(2 * MinPinnedTTL(time.Second))
		select {
		case <-hold.C:
		case id := <-ran:
			t.Fatalf("the child ran %s while g-4 ran", id)
		}
		mu.Lock()
		if len(took) > 0 {
			t.Fatalf("the standby handled %v while the owner lived", took)
		}
		mu.Unlock()

		if err := child.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-exited
		select {
		case <-all:
		case <-time.After(30 * time.Second):
		}
		mu.Lock()
		defer mu.Unlock()
		var want []string
		for i := 4; i <= last; i++ {
			want = append(want, fmt.Sprintf("g-%d", i))
		}
		if !slices.Equal(took, want) {
			t.Fatalf("after the kill the standby handled %v, want %v", took, want)
		}
	})
}

// TestNackDelayCapped: on an ordered durable a nack's delay is cut to
// MaxNackDelay (PinnedTTL less the pull wait less 1s): a longer one could
// still be waiting when the pin has moved on.
func TestNackDelayCapped(t *testing.T) {
	s := &Subscription{consCfg: jetstream.ConsumerConfig{
		PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{PriorityGroup},
		AckWait: time.Second, MaxRequestExpires: time.Second, PinnedTTL: 10 * time.Second,
	}}
	s.ord.active.Store(true)
	for _, tc := range []struct{ delay, want time.Duration }{
		{0, 0}, {300 * time.Millisecond, 300 * time.Millisecond}, {8 * time.Second, 8 * time.Second}, {time.Hour, 8 * time.Second},
	} {
		if got := s.nackDelay(tc.delay); got != tc.want {
			t.Errorf("nack with %s on an ordered durable: delay %s, want %s", tc.delay, got, tc.want)
		}
	}
	if got := new(Subscription).nackDelay(time.Hour); got != time.Hour {
		t.Errorf("nack on a durable that is not ordered: delay %s, want it unchanged", got)
	}
}

// TestOrderedStandbyKeepsRedeliveryOrder: while one consumer is pinned, a
// standby sends no pulls: the server would move every redelivery it pops
// for a pull that may not take it to the end of its queue, and the owner
// would get its group's given-back messages out of order. The owner gives
// three back in order, again and again, while the standby tries to
// receive; they come back in order every time.
func TestOrderedStandbyKeepsRedeliveryOrder(t *testing.T) {
	forEachOrderedServer(t, func(t *testing.T, srv server) {
		cfg := orderedTestConfig(t, srv)
		cfg.MaxDeliver = -1
		top := openTopic(t, connect(t, srv), cfg)
		a := openSub(t, connect(t, srv), cfg)
		b := openSub(t, connect(t, srv), cfg)
		send(t, top, groupMsgs("g", 1, 3)...)
		held := receiveN(t, a, 3)
		ctx, cancel := context.WithCancel(context.Background())
		standby := make(chan []*driver.Delivery, 1)
		go func() {
			var got []*driver.Delivery
			for ctx.Err() == nil {
				ds, _ := b.Receive(ctx, 10)
				got = append(got, ds...)
			}
			standby <- got
		}()
		for round := range 10 {
			for _, d := range held {
				if err := a.Nack(ctxT(t), d, 0); err != nil {
					t.Fatal(err)
				}
			}
			held = receiveN(t, a, 3)
			if got := ids(held); !slices.Equal(got, []string{"g-1", "g-2", "g-3"}) {
				t.Errorf("round %d: the owner got its given-back messages back as %v", round, got)
			}
		}
		cancel()
		if got := <-standby; len(got) > 0 {
			t.Errorf("the standby got %v while the owner was pinned", ids(got))
		}
	})
}
