// The benchmarks talk to the embedded nats-server TestMain starts (file
// storage), like the tests:
//
//	go test -run '^$' -bench ClaimComplete ./dedup/kvstore/
package kvstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/kvstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// BenchmarkClaimComplete measures a claim plus a completion per message —
// what the Guard costs per delivery — beside the raw KV Create plus Update
// (by revision) that a hand-rolled dedup on the same bucket would do, in
// the same run and on the same connection, at concurrency 1, 16 and 64,
// for both expiry modes. Compare the msgs/s metrics.
func BenchmarkClaimComplete(b *testing.B) {
	js := connect(b, embeddedURL)
	ctx := context.Background()
	var run atomic.Int64
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("raw-KV-Create+Update/c=%d", conc), func(b *testing.B) {
			o := kvstore.Options{}
			kv := newBucket(b, js, &o, 0)
			prefix := fmt.Sprintf("raw-%d-", run.Add(1))
			val := []byte("1")
			testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
				key := prefix + strconv.FormatInt(i, 10)
				rev, err := kv.Create(ctx, key, val)
				if err != nil {
					return err
				}
				_, err = kv.Update(ctx, key, val, rev)
				return err
			})
		})
		// The same with a per-key TTL on the create, to tell what the
		// server's TTL bookkeeping costs from what the store adds.
		b.Run(fmt.Sprintf("raw-KV-Create-KeyTTL+Update/c=%d", conc), func(b *testing.B) {
			o := kvstore.Options{}
			kv := newBucket(b, js, &o, 0)
			prefix := fmt.Sprintf("raw-%d-", run.Add(1))
			val := []byte("1")
			testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
				key := prefix + strconv.FormatInt(i, 10)
				rev, err := kv.Create(ctx, key, val, jetstream.KeyTTL(time.Minute))
				if err != nil {
					return err
				}
				_, err = kv.Update(ctx, key, val, rev)
				return err
			})
		})
		for _, expiry := range []kvstore.Expiry{kvstore.ExpiryPerKey, kvstore.ExpiryInValue} {
			name := map[kvstore.Expiry]string{kvstore.ExpiryPerKey: "store-per-key-ttl", kvstore.ExpiryInValue: "store-expiry-in-value"}[expiry]
			b.Run(fmt.Sprintf("%s/c=%d", name, conc), func(b *testing.B) {
				o := kvstore.Options{Expiry: expiry}
				newBucket(b, js, &o, 0)
				s := newStore(b, js, o)
				if err := s.Check(ctx); err != nil {
					b.Fatal(err)
				}
				prefix := fmt.Sprint("run-", run.Add(1), "-")
				testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
					key := prefix + strconv.FormatInt(i, 10)
					cl, err := s.Claim(ctx, key, "fp", time.Minute)
					if err != nil {
						return err
					}
					if cl.State != dedup.Acquired {
						return fmt.Errorf("fresh key %s", cl.State)
					}
					return s.Complete(ctx, key, cl.Token, time.Hour, nil)
				})
			})
		}
	}
}
