// These tests talk to real NATS servers with JetStream: an embedded
// nats-server (github.com/nats-io/nats-server/v2, the version go.mod pins)
// that TestMain starts in this process, and, for the mode older servers
// need, the server this machine runs at 127.0.0.1:4222 (nats-server 2.9.10,
// before per-message TTLs; override with DEDUPQ_NATS_OLD_URL). The local
// server's tests are skipped when it is unreachable and CI is unset; under
// CI they fail instead. Every test makes buckets of its own, named at
// random, and deletes them when it ends.
package kvstore_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/kvstore"
	"github.com/dedupq/dedupq/dedup/storetest"
)

var _ dedup.Store = (*kvstore.Store)(nil)

// embeddedURL is the embedded server's client URL, set by TestMain.
var embeddedURL string

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	url, stop, err := embedded.Run(ctx, "")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded NATS server:", err)
		os.Exit(1)
	}
	embeddedURL = url
	code := m.Run()
	stop()
	os.Exit(code)
}

// oldURL is the server before 2.11 this machine runs.
func oldURL() string { return cmp.Or(os.Getenv("DEDUPQ_NATS_OLD_URL"), "nats://127.0.0.1:4222") }

// connect returns a JetStream on url, closed when tb ends. A url other
// than the embedded server's that cannot be reached skips tb, unless CI
// is set.
func connect(tb testing.TB, url string) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		if url != embeddedURL && os.Getenv("CI") == "" {
			tb.Skipf("NATS at %s is unreachable (%v); skipping because CI is unset", url, err)
		}
		tb.Fatalf("NATS at %s is unreachable: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}

// randomName is prefix plus random hex.
func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newBucket creates a bucket of its own, fit for o and with max age
// maxAge, sets o.Bucket to it, and deletes it when tb ends.
func newBucket(tb testing.TB, js jetstream.JetStream, o *kvstore.Options, maxAge time.Duration) jetstream.KeyValue {
	tb.Helper()
	o.Bucket = randomName("test-")
	ctx := context.Background()
	cfg := kvstore.BucketConfig(*o, maxAge)
	// In memory: these tests are about the key-value protocol, not the
	// disk. A file-backed bucket's creation failed once under a full CI
	// run with the server's "error creating store for stream", whose
	// cause the server logs only (its file store's own check of its
	// directory); the store itself is storage-agnostic.
	cfg.Storage = jetstream.MemoryStorage
	if err := kvstore.EnsureBucket(ctx, js, cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = js.DeleteKeyValue(context.Background(), o.Bucket) })
	kv, err := js.KeyValue(ctx, o.Bucket)
	if err != nil {
		tb.Fatal(err)
	}
	return kv
}

func newStore(tb testing.TB, js jetstream.JetStream, o kvstore.Options) *kvstore.Store {
	tb.Helper()
	s, err := kvstore.New(js, o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// TestConformance runs the whole suite, both 64-goroutine races included:
// per-key TTL on the embedded server in real time (the server's clock
// expires records, so nothing can move it), and expiry in the value on a
// fake clock, on the embedded server and on the local pre-2.11 server that
// mode exists for.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name   string
		url    func() string
		expiry kvstore.Expiry
	}{
		{"PerKeyTTL", func() string { return embeddedURL }, kvstore.ExpiryPerKey},
		{"ExpiryInValue", func() string { return embeddedURL }, kvstore.ExpiryInValue},
		{"ExpiryInValueOnOldServer", oldURL, kvstore.ExpiryInValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := connect(t, tc.url())
			o := kvstore.Options{Expiry: tc.expiry, Namespace: randomName("ns-")}
			var opts []storetest.Option
			maxAge := time.Duration(0)
			if tc.expiry == kvstore.ExpiryInValue {
				clk := clock.NewFake(time.Now())
				o.Clock = clk
				opts = append(opts, storetest.WithClock(clk))
				// The suite keeps completions for 20 fake hours.
				maxAge = 48 * time.Hour
			}
			newBucket(t, js, &o, maxAge)
			if err := newStore(t, js, o).Check(context.Background()); err != nil {
				t.Fatalf("Check: %v", err)
			}
			storetest.Run(t, func(t *testing.T) dedup.Store { return newStore(t, js, o) }, opts...)
		})
	}
}

// TestKeysAreEncoded: dedup keys of any bytes map to distinct KV keys that
// the bucket accepts, and each works on its own.
func TestKeysAreEncoded(t *testing.T) {
	js := connect(t, embeddedURL)
	o := kvstore.Options{}
	kv := newBucket(t, js, &o, 0)
	s := newStore(t, js, o)
	ctx := context.Background()
	keys := []string{
		"", "a", "A", "orders:42", "a.b", ".", "..", "a..b", "*", ">", "a b", "$KV.x.y",
		"ä/ö", "\x00", "\x00\xff\xfe", "=", "-_", strings.Repeat("k", 1000),
	}
	seen := map[string]string{}
	for _, k := range keys {
		kk := s.Key(k)
		if prev, dup := seen[kk]; dup {
			t.Fatalf("keys %q and %q both map to %q", prev, k, kk)
		}
		seen[kk] = k
		// nats.go refuses a key outside the KV alphabet with ErrInvalidKey
		// before asking the server.
		if _, err := kv.Get(ctx, kk); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("Get(%q) for dedup key %q = %v, want key not found", kk, k, err)
		}
	}
	for _, k := range keys {
		c, err := s.Claim(ctx, k, "fp-"+k, time.Minute)
		if err != nil || c.State != dedup.Acquired {
			t.Fatalf("Claim(%q) = %+v, %v; want acquired (a key of its own)", k, c, err)
		}
		if err := s.Complete(ctx, k, c.Token, time.Minute, []byte(k)); err != nil {
			t.Fatalf("Complete(%q): %v", k, err)
		}
	}
	for _, k := range keys {
		c, err := s.Claim(ctx, k, "other", time.Minute)
		if err != nil || c.State != dedup.Completed || c.Fingerprint != "fp-"+k || string(c.Result) != k {
			t.Fatalf("Claim(%q) after completion = %s %q %q, %v", k, c.State, c.Fingerprint, c.Result, err)
		}
		if e, err := kv.Get(ctx, s.Key(k)); err != nil || e.Key() != s.Key(k) {
			t.Fatalf("the record of %q is not at KV key %q: %v", k, s.Key(k), err)
		}
	}
}

// gone polls until key's record has left the bucket (Get finds nothing) and
// returns when it first saw that; it fails t if that takes longer than
// within.
func gone(t *testing.T, kv jetstream.KeyValue, kvKey string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		_, err := kv.Get(context.Background(), kvKey)
		now := time.Now()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return now
		}
		if err != nil {
			t.Fatalf("Get(%q): %v", kvKey, err)
		}
		if now.After(deadline) {
			t.Fatalf("record %q still in the bucket %s on", kvKey, within)
		}
		tm := time.NewTimer(20 * time.Millisecond)
		<-tm.C
	}
}

// TestPerKeyTTL: under ExpiryPerKey the server itself removes a record
// when its TTL ends, never before (a TTL with a fraction of a second is
// rounded up: the server would truncate it), and a claim then takes the
// key over; the former holder has lost it.
func TestPerKeyTTL(t *testing.T) {
	js := connect(t, embeddedURL)
	o := kvstore.Options{}
	kv := newBucket(t, js, &o, 0)
	s := newStore(t, js, o)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// write claims or completes key, and returns the holder's token.
		write func(t *testing.T, key string) string
		lives time.Duration // at least
		// then is what a claim finds right after the write.
		then dedup.State
	}{
		{"LeaseTakenOverAfterExpiry", func(t *testing.T, key string) string {
			c, err := s.Claim(ctx, key, "fp-a", 1200*time.Millisecond)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			return c.Token
		}, 2 * time.Second, dedup.InProgress},
		{"CompletionForgottenAfterTTL", func(t *testing.T, key string) string {
			c, err := s.Claim(ctx, key, "fp-a", time.Minute)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			if err := s.Complete(ctx, key, c.Token, time.Second, []byte("r")); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			return c.Token
		}, time.Second, dedup.Completed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := randomName("k-")
			sent := time.Now()
			token := tc.write(t, key)
			if c, err := s.Claim(ctx, key, "fp-b", time.Minute); err != nil || c.State != tc.then || c.Fingerprint != "fp-a" {
				t.Fatalf("Claim right after = %s %q, %v; want %s by fp-a", c.State, c.Fingerprint, err, tc.then)
			}
			at := gone(t, kv, s.Key(key), tc.lives+10*time.Second)
			if lived := at.Sub(sent); lived < tc.lives {
				t.Fatalf("the server removed the record %s after the write, before its %s ended", lived, tc.lives)
			}
			c, err := s.Claim(ctx, key, "fp-b", time.Minute)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim after the record expired = %+v, %v; want acquired", c, err)
			}
			for _, op := range []struct {
				name string
				err  error
			}{
				{"Extend", s.Extend(ctx, key, token, time.Minute)},
				{"Complete", s.Complete(ctx, key, token, time.Minute, nil)},
				{"Release", s.Release(ctx, key, token)},
			} {
				if !errors.Is(op.err, dedup.ErrLeaseLost) {
					t.Errorf("former holder's %s = %v, want ErrLeaseLost", op.name, op.err)
				}
			}
			if c, err := s.Claim(ctx, key, "fp-c", time.Minute); err != nil || c.State != dedup.InProgress || c.Fingerprint != "fp-b" {
				t.Fatalf("Claim after the takeover = %s %q, %v; want in progress by fp-b", c.State, c.Fingerprint, err)
			}
		})
	}
}

// TestExpiryInValue: under ExpiryInValue the record's own lease end and
// expiry decide, by the store's clock, to the millisecond; and a lease or
// TTL longer than the bucket's max age, which would remove the record
// early, is refused.
func TestExpiryInValue(t *testing.T) {
	js := connect(t, embeddedURL)
	clk := clock.NewFake(time.Now())
	o := kvstore.Options{Expiry: kvstore.ExpiryInValue, Clock: clk}
	newBucket(t, js, &o, time.Hour)
	s := newStore(t, js, o)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, key string) string
		d     time.Duration
		then  dedup.State
	}{
		{"LeaseTakenOverAfterExpiry", func(t *testing.T, key string) string {
			c, err := s.Claim(ctx, key, "fp-a", 90*time.Second)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			return c.Token
		}, 90 * time.Second, dedup.InProgress},
		{"CompletionForgottenAfterTTL", func(t *testing.T, key string) string {
			c, err := s.Claim(ctx, key, "fp-a", time.Minute)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			if err := s.Complete(ctx, key, c.Token, 10*time.Minute, []byte("r")); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			return c.Token
		}, 10 * time.Minute, dedup.Completed},
	} {
		// Sequential: they move one clock.
		t.Run(tc.name, func(t *testing.T) {
			key := randomName("k-")
			token := tc.write(t, key)
			clk.Advance(tc.d - time.Millisecond)
			if c, err := s.Claim(ctx, key, "fp-b", time.Minute); err != nil || c.State != tc.then || c.Fingerprint != "fp-a" {
				t.Fatalf("Claim a millisecond before the end = %s %q, %v; want %s by fp-a", c.State, c.Fingerprint, err, tc.then)
			}
			clk.Advance(time.Millisecond)
			c, err := s.Claim(ctx, key, "fp-b", time.Minute)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim at the end = %+v, %v; want acquired", c, err)
			}
			if err := s.Complete(ctx, key, token, time.Minute, nil); !errors.Is(err, dedup.ErrLeaseLost) {
				t.Fatalf("former holder's Complete = %v, want ErrLeaseLost", err)
			}
		})
	}
	t.Run("LongerThanMaxAge", func(t *testing.T) {
		key := randomName("k-")
		if _, err := s.Claim(ctx, key, "fp", 2*time.Hour); err == nil || errors.Is(err, dedup.ErrStoreUnavailable) || !strings.Contains(err.Error(), "max age") {
			t.Fatalf("Claim with a lease above the max age = %v; want a refusal naming the max age", err)
		}
		c, err := s.Claim(ctx, key, "fp", time.Minute)
		if err != nil || c.State != dedup.Acquired {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		for _, op := range []struct {
			name string
			err  error
		}{
			{"Extend", s.Extend(ctx, key, c.Token, 2*time.Hour)},
			{"Complete", s.Complete(ctx, key, c.Token, 24*time.Hour, nil)},
		} {
			if op.err == nil || errors.Is(op.err, dedup.ErrStoreUnavailable) || errors.Is(op.err, dedup.ErrLeaseLost) || !strings.Contains(op.err.Error(), "max age") {
				t.Errorf("%s above the max age = %v; want a refusal naming the max age", op.name, op.err)
			}
		}
		if got, err := s.Claim(ctx, key, "other", time.Minute); err != nil || got.State != dedup.InProgress {
			t.Fatalf("after the refusals the key is %s, %v; want still in progress", got.State, err)
		}
	})
}

// TestClosedConnection: with the connection gone, every call fails with
// ErrStoreUnavailable (fail-closed), and a cancelled context is reported as
// itself.
func TestClosedConnection(t *testing.T) {
	js := connect(t, embeddedURL)
	o := kvstore.Options{}
	newBucket(t, js, &o, 0)
	s := newStore(t, js, o)
	ctx := context.Background()
	c, err := s.Claim(ctx, "held", "fp", time.Minute)
	if err != nil || c.State != dedup.Acquired {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Claim(cctx, "x", "fp", time.Minute); !errors.Is(err, context.Canceled) || errors.Is(err, dedup.ErrStoreUnavailable) {
		t.Fatalf("Claim with a cancelled context = %v; want context.Canceled only", err)
	}
	js.Conn().Close()
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"Claim", func() error { _, err := s.Claim(ctx, "y", "fp", time.Minute); return err }},
		{"Extend", func() error { return s.Extend(ctx, "held", c.Token, time.Minute) }},
		{"Complete", func() error { return s.Complete(ctx, "held", c.Token, time.Minute, nil) }},
		{"Release", func() error { return s.Release(ctx, "held", c.Token) }},
		{"Check", func() error { return s.Check(ctx) }},
	} {
		if err := op.call(); !errors.Is(err, dedup.ErrStoreUnavailable) || !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("%s on a closed connection = %v; want ErrStoreUnavailable wrapping nats.ErrConnectionClosed", op.name, err)
		}
	}
}

// TestMarkersExpire: under ExpiryPerKey neither a release nor a record's
// expiry leaves anything behind for good: the markers expire too, so a
// bucket holds only live records.
func TestMarkersExpire(t *testing.T) {
	js := connect(t, embeddedURL)
	o := kvstore.Options{}
	newBucket(t, js, &o, 0)
	s := newStore(t, js, o)
	ctx := context.Background()
	st, err := js.Stream(ctx, "KV_"+o.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, key, token string)
	}{
		{"Release", func(t *testing.T, key, token string) {
			if err := s.Release(ctx, key, token); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}},
		{"LeaseExpiry", func(t *testing.T, key, token string) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := randomName("k-")
			c, err := s.Claim(ctx, key, "fp", time.Second)
			if err != nil || c.State != dedup.Acquired {
				t.Fatalf("Claim = %+v, %v", c, err)
			}
			tc.end(t, key, c.Token)
			subj := "$KV." + o.Bucket + "." + s.Key(key)
			deadline := time.Now().Add(15 * time.Second)
			for {
				m, err := st.GetLastMsgForSubject(ctx, subj)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if time.Now().After(deadline) {
					t.Fatalf("subject %s still holds revision %d (headers %v) 15s on", subj, m.Sequence, m.Header)
				}
				tm := time.NewTimer(50 * time.Millisecond)
				<-tm.C
			}
		})
	}
}
