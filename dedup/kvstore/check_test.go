// Readiness check tests. They talk to the embedded nats-server TestMain
// starts (see kvstore_test.go), and to the local pre-2.11 server at
// 127.0.0.1:4222 for the refusal of a server too old for per-key TTL
// (skipped when it is unreachable unless CI is set).
package kvstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/kvstore"
)

func TestCheck(t *testing.T) {
	ctx := context.Background()
	emb := connect(t, embeddedURL)
	for _, tc := range []struct {
		name string
		js   func(t *testing.T) jetstream.JetStream
		// setup makes what the store finds and returns its options.
		setup func(t *testing.T, js jetstream.JetStream) kvstore.Options
		// want lists what the error must say; none: Check passes.
		want []string
	}{
		{"PerKeyReady", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			o := kvstore.Options{}
			newBucket(t, js, &o, 0)
			return o
		}, nil},
		{"InValueReady", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			o := kvstore.Options{Expiry: kvstore.ExpiryInValue}
			newBucket(t, js, &o, time.Hour)
			return o
		}, nil},
		{"InValueOnAPerKeyBucket", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			o := kvstore.Options{}
			newBucket(t, js, &o, 0)
			o.Expiry = kvstore.ExpiryInValue
			return o
		}, nil},
		{"MissingBucket", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			return kvstore.Options{Bucket: randomName("missing-")}
		}, []string{"does not exist", "kvstore.EnsureBucket"}},
		{"NotABucket", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			name := randomName("plain-")
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "KV_" + name, Subjects: []string{name + ".>"}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), "KV_"+name) })
			return kvstore.Options{Bucket: name, Expiry: kvstore.ExpiryInValue}
		}, []string{"is not the key-value bucket", "Options.Bucket"}},
		{"PerKeyOnABucketWithoutTTLs", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			o := kvstore.Options{Expiry: kvstore.ExpiryInValue}
			newBucket(t, js, &o, time.Hour)
			o.Expiry = kvstore.ExpiryPerKey
			return o
		}, []string{"does not allow per-key TTLs", "LimitMarkerTTL", "ExpiryInValue"}},
		{"PerKeyOnABucketWithHistory", nil, func(t *testing.T, js jetstream.JetStream) kvstore.Options {
			o := kvstore.Options{Bucket: randomName("history-")}
			cfg := kvstore.BucketConfig(o, 0)
			cfg.History = 5
			if err := kvstore.EnsureBucket(ctx, js, cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), o.Bucket) })
			return o
		}, []string{"history of 5", "must keep 1"}},
		{"PerKeyOnAServerTooOld", func(t *testing.T) jetstream.JetStream { return connect(t, oldURL()) },
			func(t *testing.T, js jetstream.JetStream) kvstore.Options {
				o := kvstore.Options{Expiry: kvstore.ExpiryInValue}
				newBucket(t, js, &o, time.Hour)
				o.Expiry = kvstore.ExpiryPerKey
				return o
			}, []string{"too old for per-key TTL", "2.11", "kvstore.ExpiryInValue"}},
		{"InValueOnAServerTooOldForPerKey", func(t *testing.T) jetstream.JetStream { return connect(t, oldURL()) },
			func(t *testing.T, js jetstream.JetStream) kvstore.Options {
				o := kvstore.Options{Expiry: kvstore.ExpiryInValue}
				newBucket(t, js, &o, time.Hour)
				return o
			}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := emb
			if tc.js != nil {
				js = tc.js(t)
			}
			s := newStore(t, js, tc.setup(t, js))
			// Through the Guard, as dedupq.NewConsumer calls it.
			g, err := dedup.NewGuard(dedup.GuardOptions{Store: s, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			err = g.Check(ctx)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Check passed; want a refusal")
			}
			if !errors.Is(err, dedup.ErrNotReady) || errors.Is(err, dedup.ErrStoreUnavailable) {
				t.Fatalf("Check = %v; want ErrNotReady and not ErrStoreUnavailable (the server answered)", err)
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check = %v; want it to say %q", err, w)
				}
			}
		})
	}
}

// TestFixForABucketWithoutTTLs: what Check tells the owner of a bucket
// without per-key TTLs to do works on an existing bucket.
func TestFixForABucketWithoutTTLs(t *testing.T) {
	ctx := context.Background()
	js := connect(t, embeddedURL)
	o := kvstore.Options{Expiry: kvstore.ExpiryInValue}
	kv := newBucket(t, js, &o, time.Hour)
	o.Expiry = kvstore.ExpiryPerKey
	s := newStore(t, js, o)
	if err := s.Check(ctx); err == nil || !strings.Contains(err.Error(), "LimitMarkerTTL") {
		t.Fatalf("Check = %v; want the refusal that names LimitMarkerTTL", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.Config()
	cfg.LimitMarkerTTL = time.Second
	if _, err := js.UpdateKeyValue(ctx, cfg); err != nil {
		t.Fatalf("UpdateKeyValue with LimitMarkerTTL: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check after the fix = %v", err)
	}
}

// TestEnsureBucketLeavesAnExistingOne: EnsureBucket creates a missing
// bucket once and leaves one that exists, even with another configuration.
func TestEnsureBucketLeavesAnExistingOne(t *testing.T) {
	ctx := context.Background()
	js := connect(t, embeddedURL)
	o := kvstore.Options{Bucket: randomName("ensure-")}
	t.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), o.Bucket) })
	for i, maxAge := range []time.Duration{0, time.Hour} {
		if err := kvstore.EnsureBucket(ctx, js, kvstore.BucketConfig(o, maxAge)); err != nil {
			t.Fatalf("EnsureBucket #%d: %v", i+1, err)
		}
	}
	kv, err := js.KeyValue(ctx, o.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 0 || st.History() != 1 || st.LimitMarkerTTL() != time.Second {
		t.Fatalf("bucket has max age %s, history %d, marker TTL %s; want the first call's 0, 1, 1s", st.TTL(), st.History(), st.LimitMarkerTTL())
	}
}
