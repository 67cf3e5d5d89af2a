package jetstream

// The adapter conformance suite (adapters/adaptertest) against real NATS
// servers: the embedded nats-server TestMain starts and the local server at
// 127.0.0.1:4222 (skipped when unreachable outside CI, failed under CI).
// The Restart check runs on neither: under "embedded" it gets a private
// embedded server of its own, with file storage, which it shuts down and
// starts again on the same port and store directory; under "local" it is
// skipped, since the shared server is never restarted.

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/adaptertest"
)

func TestConformance(t *testing.T) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			needServer(t, srv)
			adaptertest.Run(t, harness{srv})
		})
	}
}

// harness gives every subtest a fresh stream and durable, opened through
// the URL opener as a user's program would.
type harness struct{ srv server }

func (h harness) Capabilities() adaptertest.Capabilities {
	// One stream keeps one order, but concurrent handlers and immediate
	// nack redelivery do not keep a group's messages one at a time.
	return adaptertest.Capabilities{OrdersGroups: false, ConfiguresWindow: true}
}

func (h harness) Open(ctx context.Context, t *testing.T, c adaptertest.Config) adaptertest.Entity {
	t.Helper()
	srv, storage := h.srv, jetstream.MemoryStorage
	var restart *adaptertest.Restarter
	if c.Restartable && h.srv.name == "embedded" {
		p := startPrivate(ctx, t)
		srv, storage, restart = p.server(), jetstream.FileStorage, p.restarter()
	}
	name := uniqueName("C")
	cfg := Config{
		Stream: name, Subject: "dedupq.conformance." + strings.ToLower(name), Durable: "conformance",
		CreateStream: true, Storage: storage,
		Duplicates: max(c.DedupWindow, 100*time.Millisecond), // the server's minimum
		AckWait:    c.AckWait, MaxDeliver: c.MaxDeliveries,
	}
	if cfg.MaxDeliver <= 0 {
		cfg.MaxDeliver = -1
	}
	deleteStreamAtCleanup(t, srv, name)
	u, err := url.Parse(cfg.URL(srv.url))
	if err != nil {
		t.Fatal(err)
	}
	top, err := URLOpener{}.OpenTopic(ctx, u)
	if err != nil {
		t.Fatalf("OpenTopic(%s): %v", u, err)
	}
	sub, err := URLOpener{}.OpenSubscription(ctx, u)
	if err != nil {
		top.Close()
		t.Fatalf("OpenSubscription(%s): %v", u, err)
	}
	terms := watchTerminated(t, connect(t, srv), cfg)
	return adaptertest.Entity{
		Topic: top, Subscription: sub, Restart: restart,
		WaitOutWindow: func(ctx context.Context) error {
			// The server forgets an ID when its purge timer fires, at the
			// window's end; give that timer some slack.
			wait := time.NewTimer(cfg.Duplicates + max(cfg.Duplicates/2, 250*time.Millisecond))
			defer wait.Stop()
			select {
			case <-wait.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		DeadLetters: terms.ids,
	}
}

// terminated collects the messages the consumer terminated, from the
// server's MSG_TERMINATED advisories: JetStream has no dead-letter queue,
// and the advisory is what a dead-letter handler would subscribe to.
type terminated struct {
	js     jetstream.JetStream
	stream string
	mu     sync.Mutex
	seqs   []uint64
}

func watchTerminated(t *testing.T, nc *nats.Conn, cfg Config) *terminated {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := &terminated{js: js, stream: cfg.Stream}
	subj := "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + cfg.Stream + "." + cfg.Durable
	s, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if json.Unmarshal(m.Data, &adv) == nil {
			w.mu.Lock()
			w.seqs = append(w.seqs, adv.StreamSeq)
			w.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unsubscribe() })
	return w
}

// ids looks up the dedup IDs of the terminated messages.
func (w *terminated) ids(ctx context.Context) ([]string, error) {
	w.mu.Lock()
	seqs := append([]uint64(nil), w.seqs...)
	w.mu.Unlock()
	stream, err := w.js.Stream(ctx, w.stream)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, seq := range seqs {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			return nil, err
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids, nil
}
