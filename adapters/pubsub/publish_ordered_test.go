package pubsub_test

// A publish of an ordering key that fails is retried by the dedupq
// Publisher under the same IDs, and the key is not left paused: the
// client's Publisher pauses a key after a failed publish until
// ResumePublish, and each attempt uses a fresh one. Talks to an in-process
// pstest (publishes only, which pstest serves without the data races of
// its streaming pull; see main_test.go) whose first publish request with
// the key fails Unavailable.

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupq/dedupq"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/window"
)

// failFirstKeyed fails the first Publish request with a message of key.
type failFirstKeyed struct {
	key    string
	mu     sync.Mutex
	failed bool
}

func (r *failFirstKeyed) React(req any) (bool, any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := req.(*pb.PublishRequest)
	if !ok || r.failed {
		return false, nil, nil
	}
	for _, m := range p.Messages {
		if m.OrderingKey == r.key {
			r.failed = true
			return true, nil, status.Error(codes.Unavailable, "injected")
		}
	}
	return false, nil, nil
}

func TestOrderedPublishRetried(t *testing.T) {
	r := &failFirstKeyed{key: "k"}
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Publish", Reactor: r})
	t.Cleanup(func() { srv.Close() }) // after the client's cleanups, which delete the topic
	c := server{name: "in-process pstest", addr: srv.Addr, minAckDeadline: time.Second}.client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	topic := "projects/" + c.Project() + "/topics/" + uniqueID("topic")
	createTopic(ctx, t, c, topic)
	tp, err := dpubsub.OpenTopic(ctx, c, topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := dedupq.NewPublisher(ctx, tp, dedupq.PublisherOptions{
		Retry:            &window.RetryPolicy{MaxAttempts: 3, InitialBackoff: window.NoBackoff, AttemptTimeout: 5 * time.Second},
		ConsumerDedupTTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	msgs := []*dedupq.Message{
		{ID: "k1", Body: []byte("1"), GroupKey: "k"},
		{ID: "n1", Body: []byte("2")},
		{ID: "k2", Body: []byte("3"), GroupKey: "k"},
	}
	if _, err := pub.PublishBatch(ctx, msgs); err != nil {
		t.Fatalf("PublishBatch: %v", err)
	}
	if !r.failed {
		t.Fatal("no publish request failed: the test proves nothing")
	}
	var keyed []string
	count := map[string]int{}
	for _, m := range srv.Messages() {
		id := m.Attributes[dpubsub.AttrID]
		count[id]++
		if m.OrderingKey == "k" {
			keyed = append(keyed, id)
		}
	}
	if len(keyed) != 2 || keyed[0] != "k1" || keyed[1] != "k2" {
		t.Errorf("key k stored as %v, want k1 then k2", keyed)
	}
	if count["n1"] != 1 {
		t.Errorf("the message without a key was stored %d times, want once", count["n1"])
	}
}
