package adaptertest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/dedupq/dedupq"
)

// testGroupOrderingTwoConsumers: two Consumers on one subscription, as two
// processes, share the groups without breaking them: no two deliveries of
// one group run at once, across both, and a message runs only once the one
// before it in its group has succeeded. Every group's head fails once, so
// that the given-back deliveries and the redelivered head cross the two
// consumers too.
func testGroupOrderingTwoConsumers(t *testing.T, s *suite) {
	if !s.caps.OrdersGroups {
		t.Skip("capability: the backend does not order by group key")
	}
	e := s.newEnv(t, DefaultConfig(), 4)
	if e.ent.AnotherSubscription == nil {
		t.Skip("capability: the harness opens no second subscription on an entity")
	}
	if e.fake != nil {
		// A Consumer whose group's head went to the other one waits for it
		// a while, giving back what comes first with a short delay: time
		// must pass, and nothing here advances a fake clock meanwhile.
		t.Skip("capability: two Consumers hand a group between them in real time; a fake-clock entity cannot")
	}
	sub2, err := e.ent.AnotherSubscription(t.Context())
	if err != nil {
		t.Fatalf("AnotherSubscription: %v", err)
	}
	con2, err := dedupq.NewConsumer(t.Context(), sub2, dedupq.ConsumerOptions{
		Concurrency: 4, Clock: e.ent.Clock, Ordered: true,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		sub2.Close()
		t.Fatalf("NewConsumer on the second subscription: %v", err)
	}
	t.Cleanup(func() { con2.Close(context.Background()) })

	const groups, perGroup = 4, 5
	var msgs []*dedupq.Message
	for i := 1; i <= perGroup; i++ {
		for g := range groups {
			key := fmt.Sprintf("two-%d", g)
			msgs = append(msgs, &dedupq.Message{
				ID: e.id(fmt.Sprintf("%s-%d", key, i)), Body: []byte(key), GroupKey: key,
				Attributes: map[string]string{"seq": strconv.Itoa(i)},
			})
		}
	}
	if _, err := e.pub.PublishBatch(t.Context(), msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}

	var mu sync.Mutex
	done := map[string]int{}      // group → the last seq that succeeded
	inFlight := map[string]bool{} // group → a delivery of it runs
	var violations []string
	h := func(_ context.Context, d *dedupq.Delivery) error {
		key := d.Message.GroupKey
		seq, _ := strconv.Atoi(d.Message.Attributes["seq"])
		mu.Lock()
		if inFlight[key] {
			violations = append(violations, fmt.Sprintf("%s #%d started while another of its group ran", d.Message.ID, d.Attempt))
		}
		if seq != done[key]+1 {
			violations = append(violations, fmt.Sprintf("%s #%d started after %s-%d had succeeded", d.Message.ID, d.Attempt, key, done[key]))
		}
		inFlight[key] = true
		fail := seq == 1 && d.Attempt == 1
		mu.Unlock()
		runtime.Gosched() // give the other consumer a chance to start one of the group early
		mu.Lock()
		defer mu.Unlock()
		inFlight[key] = false
		if fail {
			return errors.New("fail each group's head once")
		}
		if seq == done[key]+1 {
			done[key] = seq
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	second := make(chan error, 1)
	go func() {
		second <- con2.Run(ctx, func(ctx context.Context, d *dedupq.Delivery) error {
			e.rec.add(d) // wakes the wait below as the first consumer's deliveries do
			return h(ctx, d)
		})
	}()
	e.consume("every group's last message", h, func(ds []dedupq.Delivery) bool {
		for g := range groups {
			if !has(e.id(fmt.Sprintf("two-%d-%d", g, perGroup)))(ds) {
				return false
			}
		}
		return true
	})
	cancel()
	if err := <-second; err != nil {
		t.Errorf("the second Consumer's Run = %v, want nil", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	for g := range groups {
		if key := fmt.Sprintf("two-%d", g); done[key] != perGroup {
			t.Errorf("group %s: succeeded up to %d, want %d", key, done[key], perGroup)
		}
	}
}
