package jetstream

// Messages published without Nats-Msg-Id, consumed through a dedup Guard.
// Talks to the embedded and the local NATS server (see servers_test.go).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
)

// TestMessagesWithoutIDRunOnceEach: three messages published with plain
// NATS (no Nats-Msg-Id) and different bodies each take effect once; none
// is taken for another, and a redelivery keeps its message's key.
func TestMessagesWithoutIDRunOnceEach(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		cfg := testConfig(t, srv)
		cfg.MaxDeliver = 5
		ctx := ctxT(t)
		// Create the stream and durable through the adapter.
		openSub(t, connect(t, srv), cfg)
		js, err := jetstream.New(connect(t, srv))
		if err != nil {
			t.Fatal(err)
		}
		bodies := []string{"first", "second", "third"}
		for _, b := range bodies {
			if _, err := js.Publish(ctx, cfg.Subject, []byte(b)); err != nil {
				t.Fatal(err)
			}
		}

		guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		con, err := dedupq.OpenConsumer(ctx, cfg.URL(srv.url), dedupq.ConsumerOptions{Dedup: guard})
		if err != nil {
			t.Fatal(err)
		}
		defer con.Close(ctx)

		var mu sync.Mutex
		effects := map[string]int{}
		ids := map[string][]string{} // body → the ID of each delivery
		runCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err = con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			body := string(d.Message.Body)
			ids[body] = append(ids[body], d.Message.ID)
			if body == "second" && d.Attempt == 1 {
				return dedupq.RetryAfter(errors.New("first delivery fails"), 10*time.Millisecond)
			}
			effects[body]++
			if len(effects) == len(bodies) {
				cancel()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, b := range bodies {
			if effects[b] != 1 {
				t.Errorf("message %q took effect %d times, want 1 (effects %v)", b, effects[b], effects)
			}
			want := fmt.Sprintf("stream %s seq %d time ", cfg.Stream, i+1)
			for _, id := range ids[b] {
				if !strings.HasPrefix(id, want) || id != ids[b][0] {
					t.Errorf("message %q delivered with IDs %q; want one stable ID starting %q", b, ids[b], want)
					break
				}
			}
		}
		if len(ids["second"]) != 2 {
			t.Errorf("the failed message was delivered %d times, want 2", len(ids["second"]))
		}
		if s := guard.Stats(); s.Ran != 3 || s.Failed != 1 || s.Conflicts != 0 || s.Suppressed != 0 || s.EmptyKey != 0 {
			t.Errorf("guard stats %+v; want 3 runs, 1 failure, no conflicts (nothing dead-lettered)", s)
		}
	})
}
