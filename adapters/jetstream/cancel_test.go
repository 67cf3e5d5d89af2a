package jetstream

// What a Receive cancelled while its pull waits leaves at the server, on
// the embedded nats-server and the local server at 127.0.0.1:4222 (see
// servers_test.go for when the latter is skipped).

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dedupq/dedupq/driver"
)

// TestCancelledReceiveLeavesNoPull: once a Receive returned on its cancelled
// context, its pull no longer waits at the server, so a message published
// afterwards is first delivered to the next Receive, as attempt 1. A pull
// left open caught that message and spent a delivery on nobody: the
// conformance suite's Dedup saw a new message arrive as attempt 2.
func TestCancelledReceiveLeavesNoPull(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		cfg := testConfig(t, srv)
		cfg.AckWait = 5 * time.Second
		top, sub := openTopic(t, nc, cfg), openSub(t, nc, cfg)

		waiting := func() int {
			info, err := sub.cons.Info(ctxT(t))
			if err != nil {
				t.Fatalf("consumer info: %v", err)
			}
			return info.NumWaiting
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { _, err := sub.Receive(ctx, 1); done <- err }()
		eventually(t, "the Receive's pull to wait at the server", func() (bool, string) {
			n := waiting()
			return n > 0, fmt.Sprintf("%d waiting pulls", n)
		})
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Receive after cancel: %v, want context.Canceled", err)
		}
		// Well under the pull's own expiry (pollWait), which is how long
		// an abandoned pull would linger.
		deadline := time.Now().Add(pollWait / 2)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := waiting(); n > 0; n = waiting() {
			if time.Now().After(deadline) {
				t.Fatalf("%s after its Receive returned, %d pull(s) still wait at the server", pollWait/2, n)
			}
			<-tick.C
		}

		send(t, top, &driver.Message{ID: "after-cancel", Body: []byte("x")})
		d := receiveN(t, sub, 1)[0]
		if d.Message.ID != "after-cancel" || d.Attempt != 1 {
			t.Errorf("got %q attempt %d, want after-cancel attempt 1", d.Message.ID, d.Attempt)
		}
		if err := sub.Ack(ctxT(t), d); err != nil {
			t.Fatal(err)
		}
	})
}
