package jetstream

// Started batches (driver.BatchStarter) against real NATS servers: the
// embedded nats-server that TestMain starts and the local server at
// 127.0.0.1:4222 (see servers_test.go).

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

func numbered(prefix string, n int, body []byte) []*driver.Message {
	msgs := make([]*driver.Message, n)
	for i := range msgs {
		msgs[i] = &driver.Message{ID: prefix + strconv.Itoa(i), Body: body}
	}
	return msgs
}

// TestStartBatchKeepsCallOrder: a batch started before another is stored
// before it, whichever is awaited first.
func TestStartBatchKeepsCallOrder(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		top := openTopic(t, connect(t, srv), testConfig(t, srv))
		const n = 300
		waitA, err := top.StartBatch(ctxT(t), numbered("a", n, []byte("A")))
		if err != nil {
			t.Fatal(err)
		}
		waitB, err := top.StartBatch(ctxT(t), numbered("b", n, []byte("B")))
		if err != nil {
			t.Fatal(err)
		}
		resB, errB := waitB()
		resA, errA := waitA()
		if errA != nil || errB != nil || len(resA) != n || len(resB) != n {
			t.Fatalf("waits: %d results, %v; %d results, %v", len(resA), errA, len(resB), errB)
		}
		for i, r := range append(resA, resB...) {
			if r.Err != nil || r.BackendID != strconv.Itoa(i+1) {
				t.Fatalf("message %d of the two batches: %+v, want stored at sequence %d", i, r, i+1)
			}
		}
	})
}

// TestPublisherLargeBatchInOrder: a batch of many chunks, whose first
// attempts overlap, lands in the stream in batch order.
func TestPublisherLargeBatchInOrder(t *testing.T) {
	for _, maxBatch := range []int{0, 100} {
		t.Run("MaxBatch="+strconv.Itoa(maxBatch), func(t *testing.T) {
			srv := servers()[0]
			nc := connect(t, srv)
			cfg := testConfig(t, srv)
			// Room for the default retry policy.
			cfg.Duplicates, cfg.MaxBatch = 2*time.Minute, maxBatch
			top, err := OpenTopic(ctxT(t), nc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := dedupq.NewPublisher(ctxT(t), top, dedupq.PublisherOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close(context.Background())
			const n = 5000
			body := []byte(strings.Repeat("x", 1024))
			msgs := make([]*dedupq.Message, n)
			for i := range msgs {
				msgs[i] = &dedupq.Message{ID: "m" + strconv.Itoa(i), Body: body}
			}
			res, err := pub.PublishBatch(ctxT(t), msgs)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.BackendID != strconv.Itoa(i+1) {
					t.Fatalf("message %d stored at sequence %s, want %d", i, r.BackendID, i+1)
				}
			}
			js, _ := jetstream.New(nc)
			stream, err := js.Stream(ctxT(t), cfg.Stream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := stream.Info(ctxT(t))
			if err != nil || info.State.Msgs != n {
				t.Fatalf("stream info: %+v, %v; want %d messages", info, err, n)
			}
			for seq := uint64(1); seq <= n; seq += 499 {
				m, err := stream.GetMsg(ctxT(t), seq)
				if err != nil || m.Header.Get(nats.MsgIdHdr) != msgs[seq-1].ID {
					t.Fatalf("stream message %d: %v, want ID %s", seq, err, msgs[seq-1].ID)
				}
			}
		})
	}
}
