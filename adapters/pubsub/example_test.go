package pubsub_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/window"
)

// A publisher on Pub/Sub must declare consumer-side dedup to retry: the
// broker deduplicates nothing, so only the consumers' dedup store absorbs
// resends. Without ConsumerDedupTTL the default retry policy is refused.
func Example() {
	ctx := context.Background()
	url := "pubsub://my-project/orders?emulator=127.0.0.1:8085"

	_, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{})
	if err != nil {
		fmt.Println("without consumer-side dedup:", err)
	}

	pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{
		Retry:            &window.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2, AttemptTimeout: 10 * time.Second},
		ConsumerDedupTTL: 24 * time.Hour,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close(ctx)
	res, err := pub.Publish(ctx, &dedupq.Message{ID: "order-42", Body: []byte(`{"order":42}`), GroupKey: "customer-7"})
	fmt.Println(res.BackendID, err)
}
