package jetstream

// The adapter conformance suite (adapters/adaptertest) against real NATS
// servers: the embedded nats-server TestMain starts, with an ordinary
// durable and with an ordered one; the out-of-process server of go.mod's
// release (internal/natsbin), with an ordered durable; and the local
// server at 127.0.0.1:4222 (2.9.10: skipped when unreachable outside CI,
// failed under CI), with an ordinary durable, where an ordered Consumer is
// refused for the server's version. The Restart check runs on the
// embedded ones only: it gets a private embedded server of its own, with
// file storage, which it shuts down and starts again on the same port and
// store directory; elsewhere it is skipped, since the shared servers are
// never restarted.

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
	"github.com/dedupq/dedupq/driver"
)

func TestConformance(t *testing.T) {
	local := server{"local", "nats://" + localAddr}
	for _, env := range []struct {
		name    string
		srv     func(t *testing.T) server
		ordered bool
	}{
		{"embedded", func(*testing.T) server { return server{"embedded", embeddedURL} }, false},
		{"embedded-ordered", func(*testing.T) server { return server{"embedded", embeddedURL} }, true},
		{"current-ordered", func(t *testing.T) server { return currentServer(t) }, true},
		{"local", func(t *testing.T) server { needServer(t, local); return local }, false},
	} {
		t.Run(env.name, func(t *testing.T) {
			adaptertest.Run(t, harness{env.srv(t), env.ordered})
		})
	}
}

// harness gives every subtest a fresh stream and durable, opened through
// the URL opener as a user's program would; ordered asks for an ordered
// durable (ordered=true).
type harness struct {
	srv     server
	ordered bool
}

func (h harness) Capabilities() adaptertest.Capabilities {
	// A durable without a pinned priority group hands a group's messages
	// to every consumer at once: an ordered Consumer is refused on it.
	return adaptertest.Capabilities{OrdersGroups: h.ordered, ConfiguresWindow: true}
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
		AckWait:    c.AckWait, MaxDeliver: c.MaxDeliveries, Ordered: h.ordered,
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
		// A second process's: a connection of its own.
		AnotherSubscription: func(ctx context.Context) (driver.Subscription, error) {
			return URLOpener{}.OpenSubscription(ctx, u)
		},
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
