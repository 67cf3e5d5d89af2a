package kvstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/dedup"
)

var _ dedup.Checker = (*Store)(nil)

// checkKey is the dedup key Check reads (and never writes): a control
// character keeps it apart from any dedup ID a dedupq Publisher can send.
const checkKey = "\x01dedupq-ready-check"

// markerTTL is the LimitMarkerTTL of the buckets BucketConfig describes for
// ExpiryPerKey: how long the server keeps the note it leaves where a TTL
// removed a record. The store needs no such note (a claim takes a marker
// over like an empty key); one second is the least the server accepts,
// and setting it is how a KV bucket gets per-message TTLs.
const markerTTL = time.Second

// BucketConfig returns the configuration of a bucket fit for a Store made
// with o: the name o.Bucket (or DefaultBucket), a history of one revision
// per key, and for ExpiryPerKey per-message TTLs on (LimitMarkerTTL). maxAge
// becomes the bucket's max age (KeyValueConfig.TTL): with ExpiryInValue it
// must be at least the longest lease and completion TTL the store will be
// given (the Guard's TTL), or those calls fail, and 0 keeps every key
// forever; with ExpiryPerKey records expire on their own and 0 is fine.
// Set Replicas and the like on the result before passing it to
// EnsureBucket.
func BucketConfig(o Options, maxAge time.Duration) jetstream.KeyValueConfig {
	cfg := jetstream.KeyValueConfig{
		Bucket:      o.Bucket,
		Description: "dedupq dedup records (github.com/dedupq/dedupq/dedup/kvstore)",
		History:     1,
		TTL:         maxAge,
	}
	if cfg.Bucket == "" {
		cfg.Bucket = DefaultBucket
	}
	if o.Expiry == ExpiryPerKey {
		cfg.LimitMarkerTTL = markerTTL
	}
	return cfg
}

// EnsureBucket creates the bucket cfg describes (see BucketConfig) unless a
// bucket of that name exists, which it leaves as it is: Store.Check says
// whether an existing one fits.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) error {
	_, err := js.KeyValue(ctx, cfg.Bucket)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("kvstore: ensure bucket %q: %w", cfg.Bucket, err)
	}
	if _, err := js.CreateKeyValue(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
		if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
			return fmt.Errorf("kvstore: ensure bucket %q: %w: the server is older than 2.11; make the store and the bucket with Expiry ExpiryInValue", cfg.Bucket, err)
		}
		return fmt.Errorf("kvstore: ensure bucket %q: %w", cfg.Bucket, err)
	}
	return nil
}

// Check implements dedup.Checker, in two or three round trips: the
// bucket's stream info (is it there, is it a key-value bucket, does it fit
// the Expiry mode), for ExpiryPerKey the account's JetStream API level
// (which tells a server of 2.11 or later), and a read of one reserved key,
// which proves that direct gets, which every claim makes, are answered.
// It writes nothing.
//
// New takes no context, so it does no I/O; call Check (or let
// dedupq.NewConsumer call it through the Guard) to find out at startup.
func (s *Store) Check(ctx context.Context) error {
	st, err := s.js.Stream(ctx, streamName(s.bucket))
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("kvstore: bucket %q does not exist; create it at startup with kvstore.EnsureBucket(ctx, js, kvstore.BucketConfig(opts, maxAge)), or beforehand as a key-value bucket with a history of 1 and%s", s.bucket, map[Expiry]string{
			ExpiryPerKey:  " a limit marker TTL (which turns per-key TTLs on)",
			ExpiryInValue: " a max age of at least the Guard's TTL",
		}[s.expiry])
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("kvstore: %w: enable JetStream on the server (-js) and for the client's account", err)
	case err != nil:
		return s.checkFail(ctx, "stream info", err)
	}
	cfg := st.CachedInfo().Config
	if !slices.Equal(cfg.Subjects, []string{"$KV." + s.bucket + ".>"}) {
		return fmt.Errorf("kvstore: stream %s, with subjects %q, is not the key-value bucket %q; give the store a bucket of its own (Options.Bucket)", cfg.Name, cfg.Subjects, s.bucket)
	}
	if s.expiry == ExpiryPerKey {
		if err := s.checkPerKey(ctx, cfg); err != nil {
			return err
		}
	}
	if _, err := s.read(ctx, st, s.subject(checkKey)); err != nil {
		return s.checkFail(ctx, "read", err)
	}
	s.mu.Lock()
	s.stream, s.maxAge = st, cfg.MaxAge
	s.mu.Unlock()
	return nil
}

// checkPerKey refuses a server or bucket that cannot give records a TTL of
// their own.
func (s *Store) checkPerKey(ctx context.Context, cfg jetstream.StreamConfig) error {
	info, err := s.js.AccountInfo(ctx)
	if err != nil {
		return s.checkFail(ctx, "account info", err)
	}
	// JetStream API level 1 came with nats-server 2.11, as did per-message
	// TTLs; an older server ignores the Nats-TTL header, and records would
	// never expire.
	if info.API.Level < 1 {
		return fmt.Errorf("kvstore: nats-server %s is too old for per-key TTL, which needs 2.11 or later; upgrade the server, or set Options.Expiry to kvstore.ExpiryInValue and give the bucket a max age of at least the Guard's TTL",
			s.js.Conn().ConnectedServerVersion())
	}
	if !cfg.AllowMsgTTL {
		return fmt.Errorf("kvstore: bucket %q does not allow per-key TTLs; update it with LimitMarkerTTL set (js.UpdateKeyValue with its configuration plus LimitMarkerTTL: time.Second; the server can turn per-message TTLs on for an existing bucket, never off), or set Options.Expiry to kvstore.ExpiryInValue", s.bucket)
	}
	if cfg.MaxMsgsPerSubject != 1 {
		return fmt.Errorf("kvstore: bucket %q keeps a history of %d revisions per key; with per-key TTL it must keep 1 (the server stretches a TTL shorter than the marker TTL on a bucket with history, and a lease with it); give the store a bucket of its own made with kvstore.BucketConfig", s.bucket, cfg.MaxMsgsPerSubject)
	}
	return nil
}

// checkFail words a failed probe: a server that did not answer is
// unavailable (it may come back), one that refused is reported as it is.
func (s *Store) checkFail(ctx context.Context, op string, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return fmt.Errorf("kvstore: check (%s): %w", op, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return fmt.Errorf("kvstore: check (%s): JetStream refused it: %w", op, err)
	}
	return fmt.Errorf("kvstore: check (%s): %w: cannot reach NATS JetStream (is the server running, and is the connection's URL right?): %w", op, dedup.ErrStoreUnavailable, err)
}
