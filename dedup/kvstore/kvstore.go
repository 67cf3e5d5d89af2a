// Package kvstore is a dedup.Store in a NATS JetStream key-value bucket
// (github.com/nats-io/nats.go/jetstream), for JetStream users who run
// nothing else: the dedup records live on the same servers as the
// messages, and are replicated with the bucket.
//
// # Layout
//
// Each dedup key is one key of the bucket, named Namespace + "." + the dedup
// key in unpadded base64url (RFC 4648 §5; the empty key is "="): KV keys
// allow only letters, digits and -_=./, and a dedup key can hold anything,
// so every key is encoded, readable or not, and Store.Key gives the KV key
// of a dedup key for `nats kv get`. The namespace (a tenant, a consumer
// group) is a key token of its own, so `nats kv ls` can filter by it. The
// value is the record: its state (in progress or completed), the lease end
// or completion expiry as the writer's clock read it, the owner token, the
// fingerprint and the result.
//
// Claim is an atomic create: a publish to the key's subject that expects
// no message on it (Nats-Expected-Last-Subject-Sequence 0). When the key
// holds something, the claim reads it: a live record is the answer; a
// removed one (a delete marker) or, with ExpiryInValue, a lapsed one is
// taken over by a publish that expects exactly the revision read, so of
// any number of concurrent claimants one wins. Extend, Complete and
// Release read the record and act only if it carries the caller's token,
// writing with compare-and-set on the revision read, so a consumer whose
// lease ran out cannot overwrite the record of the one that took over. The
// store remembers the revision of each record it wrote for a claim it
// still holds, so a completion or release normally skips the read: a claim
// plus its completion is two round trips, as a raw Create plus Update is.
//
// # Expiry
//
// Records must expire: a lapsed lease lets another consumer take the key
// over, a completion is remembered for its TTL only. Options.Expiry picks
// how.
//
// ExpiryPerKey (the default) gives each record a per-message TTL
// (the Nats-TTL header, nats-server 2.11 or later, on a bucket created with
// LimitMarkerTTL, which is what turns per-message TTLs on): the lease while
// in progress, the completion TTL once completed. The server removes a
// record when its TTL ends, by the server's clock, so every consumer sees a
// lease end at the same moment whatever its own clock says, as with Redis's
// PX and PostgreSQL's now(). The server counts TTLs in whole seconds: leases
// and TTLs are rounded up (never shortened), and a record lives a moment
// past its end, until the server's expiry timer runs (a quarter second at
// the least). A release leaves a purge marker that lives a second.
// This is the default because one clock decides, and because a completed
// key costs nothing after its TTL.
//
// ExpiryInValue is for servers before 2.11, or a bucket that cannot have
// per-message TTLs: the record's own lease end or expiry, written by the
// claimant's clock, decides, and a claim that finds it passed takes the key
// over by compare-and-set. The bucket's max age (KeyValueConfig.TTL)
// removes old records by the server's clock, so it bounds every lease and
// TTL: a call whose lease or TTL exceeds it fails rather than let the record
// vanish early, and a bucket without a max age keeps every key it was ever
// given. Consumers' clocks must agree to well within a lease: a fast clock
// takes a live lease over early.
//
// Check refuses a setup that does not fit the mode: for ExpiryPerKey a
// server before 2.11 or a bucket without per-message TTLs or with a history
// above one (the server would stretch short TTLs to the marker TTL).
// EnsureBucket creates a bucket that fits either mode.
//
// # Errors
//
// Every error other than dedup.ErrLeaseLost means the store could not decide
// and wraps dedup.ErrStoreUnavailable (and nats.go's own error, so errors.Is
// also finds jetstream and nats errors), except that the caller's own
// cancelled or expired context is reported as that context's error, and a
// lease or TTL the mode cannot keep is refused as a plain error. A claim
// whose publish failed in a way that may have left it applied (the
// acknowledgement lost, the caller's context ended in flight) is released
// with its own token in the background, so that the key is not left in
// progress for a whole lease with no handler running.
//
// # What it cannot promise
//
// A bucket of one replica keeps acknowledged writes in the server's file
// store, which syncs to disk every two minutes by default: a crash of the
// server (not a restart) can forget recent claims and completions (a
// forgotten completion lets a later duplicate run its effect again). A
// bucket of three replicas acknowledges a write once a majority has it.
//
// JetStream domains and custom API prefixes are not supported: the store
// publishes to the bucket's subjects, $KV.<bucket>.<key>, directly.
package kvstore

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
)

// DefaultBucket is the bucket a Store uses when Options.Bucket is empty.
const DefaultBucket = "dedupq"

// Expiry is how records expire; see the package documentation.
type Expiry int

const (
	// ExpiryPerKey gives each record a per-message TTL that the server
	// enforces by its own clock. It needs nats-server 2.11 or later and a
	// bucket with per-message TTLs on (LimitMarkerTTL set).
	ExpiryPerKey Expiry = iota
	// ExpiryInValue decides expiry by the lease end or completion expiry
	// written in the record, by the claimant's clock, and leaves removal
	// to the bucket's max age. It works on any server with JetStream KV.
	ExpiryInValue
)

// String implements fmt.Stringer.
func (e Expiry) String() string {
	switch e {
	case ExpiryPerKey:
		return "per-key TTL"
	case ExpiryInValue:
		return "expiry in the value"
	}
	return fmt.Sprintf("Expiry(%d)", int(e))
}

// Options configure a Store. The zero value is usable.
type Options struct {
	// Bucket is the key-value bucket's name; "" means DefaultBucket. It
	// must exist: see EnsureBucket.
	Bucket string
	// Namespace separates the keys of tenants or consumer groups that
	// share a bucket; "" means "default". Letters, digits, '-' and '_'
	// only.
	Namespace string
	// Expiry is how records expire; the zero value is ExpiryPerKey.
	Expiry Expiry
	// Clock reads the time for lease ends and completion expiries, and,
	// with ExpiryInValue, for deciding that they passed; nil means the
	// wall clock. Tests of ExpiryInValue move a fake one.
	Clock clock.Clock
}

// Store is a dedup.Store in a JetStream key-value bucket, safe for
// concurrent use.
type Store struct {
	js     jetstream.JetStream
	bucket string
	ns     string
	expiry Expiry
	clock  clock.Clock
	// subjPrefix is "$KV.<bucket>.<namespace>.": a key's subject is this
	// plus its encoded dedup key.
	subjPrefix string

	// open is a one-slot semaphore around opening the bucket's stream,
	// so that a caller waiting for it can give up on its context.
	open   chan struct{}
	mu     sync.Mutex
	stream jetstream.Stream
	maxAge time.Duration
	// revs maps the token of every claim the store acquired or extended,
	// and has not completed or released, to the revision it wrote: the
	// record there is that claim's, in progress.
	revs map[string]uint64
}

var (
	bucketRe    = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	namespaceRe = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
)

// New returns a Store in the bucket o.Bucket of js. It does no I/O: the
// bucket is opened on first use; call Check (or let dedupq.NewConsumer
// call it through the Guard) to find out at startup whether it is there
// and fits o.Expiry. The store does not close js's connection.
func New(js jetstream.JetStream, o Options) (*Store, error) {
	if js == nil {
		return nil, errors.New("kvstore: nil JetStream")
	}
	o.Bucket = cmp.Or(o.Bucket, DefaultBucket)
	o.Namespace = cmp.Or(o.Namespace, "default")
	if !bucketRe.MatchString(o.Bucket) {
		return nil, fmt.Errorf("kvstore: bucket name %q: want letters, digits, '-' and '_' only", o.Bucket)
	}
	if !namespaceRe.MatchString(o.Namespace) {
		return nil, fmt.Errorf("kvstore: namespace %q: want letters, digits, '-' and '_' only", o.Namespace)
	}
	if o.Expiry != ExpiryPerKey && o.Expiry != ExpiryInValue {
		return nil, fmt.Errorf("kvstore: unknown %s", o.Expiry)
	}
	if jo := js.Options(); jo.Domain != "" || (jo.APIPrefix != "" && jo.APIPrefix != jetstream.DefaultAPIPrefix) {
		return nil, errors.New("kvstore: JetStream domains and custom API prefixes are not supported; use a JetStream made with jetstream.New")
	}
	return &Store{
		js:         js,
		bucket:     o.Bucket,
		ns:         o.Namespace,
		expiry:     o.Expiry,
		clock:      clock.Or(o.Clock),
		subjPrefix: "$KV." + o.Bucket + "." + o.Namespace + ".",
		open:       make(chan struct{}, 1),
		revs:       map[string]uint64{},
	}, nil
}

// Key is the KV key that holds the record of a dedup key, for inspecting
// it with `nats kv get <bucket> <key>`.
func (s *Store) Key(key string) string { return s.ns + "." + encodeKey(key) }

// encodeKey is key in unpadded base64url, whose alphabet KV keys allow;
// the empty key, which would encode to nothing, is "=", which no encoding
// of another key contains.
func encodeKey(key string) string {
	if key == "" {
		return "="
	}
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}

func (s *Store) subject(key string) string { return s.subjPrefix + encodeKey(key) }

// bucketStream returns the bucket's stream, opening it on first use (one
// round trip, which also reads the bucket's max age). A failed open is
// tried again by the next call.
func (s *Store) bucketStream(ctx context.Context) (jetstream.Stream, time.Duration, error) {
	s.mu.Lock()
	st, maxAge := s.stream, s.maxAge
	s.mu.Unlock()
	if st != nil {
		return st, maxAge, nil
	}
	select {
	case s.open <- struct{}{}:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	defer func() { <-s.open }()
	s.mu.Lock()
	st, maxAge = s.stream, s.maxAge
	s.mu.Unlock()
	if st != nil {
		return st, maxAge, nil
	}
	st, err := s.js.Stream(ctx, streamName(s.bucket))
	if err != nil {
		return nil, 0, err
	}
	maxAge = st.CachedInfo().Config.MaxAge
	s.mu.Lock()
	s.stream, s.maxAge = st, maxAge
	s.mu.Unlock()
	return st, maxAge, nil
}

// streamName is the stream behind a bucket.
func streamName(bucket string) string { return "KV_" + bucket }

// record is the stored value, laid out as redisstore's: state (1 byte: p
// in progress, c completed), lease end (in progress) or expiry (completed)
// in Unix nanoseconds (16 hex digits; a fake clock's exact time survives), the token's random part
// (claimtoken.RandLen hex digits), the fingerprint's length (8 hex
// digits), the fingerprint, then the result.
func record(state byte, until time.Time, token string, result []byte) []byte {
	fp, _ := claimtoken.Fingerprint(token)
	b := make([]byte, 0, headerLen+len(fp)+len(result))
	b = append(b, state)
	b = appendHex(b, uint64(until.UnixNano()), 16)
	b = append(b, token[:claimtoken.RandLen]...)
	b = appendHex(b, uint64(len(fp)), 8)
	b = append(b, fp...)
	return append(b, result...)
}

func appendHex(b []byte, v uint64, width int) []byte {
	const digits = "0123456789abcdef"
	for i := width - 1; i >= 0; i-- {
		b = append(b, digits[(v>>(4*uint(i)))&0xf])
	}
	return b
}

const headerLen = 1 + 16 + claimtoken.RandLen + 8

// stored is a record read back.
type stored struct {
	claim dedup.Claim
	until time.Time // lease end or completion expiry
	owner string    // the token's random part
}

func parseRecord(v []byte) (stored, error) {
	if len(v) < headerLen {
		return stored{}, fmt.Errorf("malformed record %q", v)
	}
	ns, err1 := strconv.ParseUint(string(v[1:17]), 16, 64)
	n, err2 := strconv.ParseUint(string(v[headerLen-8:headerLen]), 16, 32)
	if err1 != nil || err2 != nil || uint64(len(v)) < headerLen+n {
		return stored{}, fmt.Errorf("malformed record %q", v)
	}
	r := stored{
		claim: dedup.Claim{Fingerprint: string(v[headerLen : headerLen+int(n)])},
		until: time.Unix(0, int64(ns)),
		owner: string(v[17 : 17+claimtoken.RandLen]),
	}
	switch v[0] {
	case 'c':
		r.claim.State = dedup.Completed
		if res := v[headerLen+int(n):]; len(res) > 0 {
			r.claim.Result = append([]byte(nil), res...)
		}
	case 'p':
		r.claim.State, r.claim.LeaseUntil = dedup.InProgress, r.until
	default:
		return stored{}, fmt.Errorf("malformed record %q", v)
	}
	return r, nil
}

// found is what a key's subject holds.
type found struct {
	rev uint64 // 0: nothing at all
	rec *stored
}

// read returns the last message on subj: nothing, a marker (rec nil, rev
// set: a release, or the server's note that a TTL removed the record) or a
// record.
func (s *Store) read(ctx context.Context, st jetstream.Stream, subj string) (found, error) {
	m, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return found{}, nil
	}
	if err != nil {
		return found{}, err
	}
	if m.Header.Get(kvOperation) != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return found{rev: m.Sequence}, nil
	}
	r, err := parseRecord(m.Data)
	if err != nil {
		return found{}, err
	}
	return found{rev: m.Sequence, rec: &r}, nil
}

// The KV headers a delete or purge carries (nats.go's own names).
const (
	kvOperation = "KV-Operation"
	kvPurge     = "PURGE"
)

// releaseMarkerTTL is how long the marker a release leaves lives under
// ExpiryPerKey; under ExpiryInValue the bucket's max age removes it.
const releaseMarkerTTL = time.Second

// write publishes data on subj if the subject's last revision is rev (0:
// nothing there), with a TTL of ttl under ExpiryPerKey. A nil data writes
// a purge marker instead, as nats.go's Purge does. It returns the new
// revision.
func (s *Store) write(ctx context.Context, subj string, rev uint64, data []byte, ttl time.Duration) (uint64, error) {
	m := &nats.Msg{Subject: subj, Header: nats.Header{}, Data: data}
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
	if data == nil {
		m.Header.Set(kvOperation, kvPurge)
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		ttl = releaseMarkerTTL
	}
	if s.expiry == ExpiryPerKey {
		// Whole seconds: the server truncates a fraction, which would
		// shorten the lease (nats.go's WithMsgTTL sends "1.5s").
		m.Header.Set(jetstream.MsgTTLHeader, strconv.FormatInt(ttlSeconds(ttl), 10))
	}
	ack, err := s.js.PublishMsg(ctx, m)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// ttlSeconds is d in whole seconds, rounded up, at least one.
func ttlSeconds(d time.Duration) int64 {
	return max(1, int64((d+time.Second-1)/time.Second))
}

// span is how long a record written with lease or TTL d lasts: d rounded
// up to whole seconds under ExpiryPerKey (see write), d otherwise.
func (s *Store) span(d time.Duration) time.Duration {
	if s.expiry == ExpiryPerKey {
		return time.Duration(ttlSeconds(d)) * time.Second
	}
	return d
}

// wrongRevision says whether err is the server's refusal of a write that
// expected another revision: on one replica code 10071, on several 10164.
func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// maxAttempts bounds the compare-and-set loops. Each failed attempt means
// another writer changed the key in between; for a claim the second
// attempt almost always finds a live record, which is an answer.
const maxAttempts = 16

// errContended is the cause when every attempt lost a race.
var errContended = errors.New("the key changed under every attempt")

// fits refuses a lease or TTL the bucket's max age would cut short under
// ExpiryInValue.
func (s *Store) fits(op, key, what string, d, maxAge time.Duration) error {
	if s.expiry == ExpiryInValue && maxAge > 0 && d > maxAge {
		return fmt.Errorf("kvstore: %s %q: %s %s exceeds the max age %s of bucket %q, which would remove the record early; raise the bucket's max age (KeyValueConfig.TTL)",
			op, key, what, d, maxAge, s.bucket)
	}
	return nil
}

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.Claim, error) {
	if lease <= 0 {
		return dedup.Claim{}, fmt.Errorf("kvstore: claim %q: lease %s is not positive", key, lease)
	}
	if err := ctx.Err(); err != nil {
		return dedup.Claim{}, fmt.Errorf("kvstore: claim %q: %w", key, err)
	}
	st, maxAge, err := s.bucketStream(ctx)
	if err != nil {
		return dedup.Claim{}, s.fail(ctx, "claim", key, err)
	}
	if err := s.fits("claim", key, "lease", lease, maxAge); err != nil {
		return dedup.Claim{}, err
	}
	token := claimtoken.New(fingerprint)
	subj := s.subject(key)
	var rev uint64
	for range maxAttempts {
		rec := record('p', s.clock.Now().Add(s.span(lease)), token, nil)
		seq, err := s.write(ctx, subj, rev, rec, lease)
		if err == nil {
			s.remember(token, seq)
			return dedup.Claim{State: dedup.Acquired, Token: token}, nil
		}
		if !wrongRevision(err) {
			// The publish may have reached the server before the error (an
			// acknowledgement lost, or cut off by ctx): its caller is told
			// it failed, so it must not keep the key.
			go s.undoClaim(key, token)
			return dedup.Claim{}, s.fail(ctx, "claim", key, err)
		}
		f, err := s.read(ctx, st, subj)
		if err != nil {
			return dedup.Claim{}, s.fail(ctx, "claim", key, err)
		}
		rev = f.rev
		if f.rec == nil {
			continue // gone since, or a marker: take it
		}
		if s.expiry == ExpiryInValue && !s.clock.Now().Before(f.rec.until) {
			continue // lapsed lease or expired completion: take it over
		}
		return f.rec.claim, nil
	}
	return dedup.Claim{}, s.fail(ctx, "claim", key, errContended)
}

// remember records that the record at rev is token's, in progress.
func (s *Store) remember(token string, rev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A caller that never completes or releases its claims would grow the
	// map without end; past this size the store reads before it writes.
	if len(s.revs) < maxRemembered {
		s.revs[token] = rev
	}
}

// forget drops token's revision and returns it (0 if none).
func (s *Store) forget(token string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	rev := s.revs[token]
	delete(s.revs, token)
	return rev
}

const maxRemembered = 1 << 16

// undoTimeout bounds the release of a claim whose caller was told it
// failed.
const undoTimeout = 10 * time.Second

// undoClaim releases a claim whose caller was told it failed, as far as the
// server can be reached; if it cannot, the lease frees the key.
func (s *Store) undoClaim(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	_ = s.Release(ctx, key, token)
}

// Extend implements dedup.Store. Extending a claim its holder already
// completed leaves the completion as it is.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("kvstore: extend %q: lease %s is not positive", key, lease)
	}
	return s.owned(ctx, "extend", key, token, lease, func(cur *stored) ([]byte, bool) {
		if cur != nil && cur.claim.State == dedup.Completed {
			return nil, false
		}
		return record('p', s.clock.Now().Add(s.span(lease)), token, nil), true
	})
}

// Complete implements dedup.Store. An empty result is stored as none: a
// later Claim reports a nil Result.
func (s *Store) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if ttl <= 0 {
		return fmt.Errorf("kvstore: complete %q: ttl %s is not positive", key, ttl)
	}
	return s.owned(ctx, "complete", key, token, ttl, func(*stored) ([]byte, bool) {
		return record('c', s.clock.Now().Add(s.span(ttl)), token, result), true
	})
}

// Release implements dedup.Store. Releasing a key the same token already
// completed does nothing: forgetting a completed effect would let a
// redelivery repeat it.
func (s *Store) Release(ctx context.Context, key, token string) error {
	return s.owned(ctx, "release", key, token, 0, func(cur *stored) ([]byte, bool) {
		if cur == nil || cur.claim.State == dedup.Completed {
			return nil, false // gone already, or completed: leave it
		}
		return nil, true // a purge marker
	})
}

// owned writes what next returns over key's record, if that record is
// token's or gone: a record that is gone lapsed (or was released) and
// nobody took it over since, so its former holder may write it again.
// next gets the token's record, nil if gone, and returns the data to
// write (nil: a purge marker) and whether to write at all. d is the
// lease or TTL to write with (0 for a release).
func (s *Store) owned(ctx context.Context, op, key, token string, d time.Duration, next func(cur *stored) ([]byte, bool)) error {
	if _, ok := claimtoken.Fingerprint(token); !ok {
		return fmt.Errorf("kvstore: %s %q: malformed token: %w", op, key, dedup.ErrLeaseLost)
	}
	st, maxAge, err := s.bucketStream(ctx)
	if err != nil {
		return s.fail(ctx, op, key, err)
	}
	what := "ttl"
	if op == "extend" {
		what = "lease"
	}
	if err := s.fits(op, key, what, d, maxAge); err != nil {
		return err
	}
	subj := s.subject(key)
	// The remembered revision holds the token's record, in progress: write
	// over it without reading it first.
	rev := s.forget(token)
	cur := &stored{claim: dedup.Claim{State: dedup.InProgress}}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if rev == 0 || attempt > 0 {
			f, err := s.read(ctx, st, subj)
			if err != nil {
				return s.fail(ctx, op, key, err)
			}
			if f.rec != nil && f.rec.owner != token[:claimtoken.RandLen] {
				return fmt.Errorf("kvstore: %s %q: %w", op, key, dedup.ErrLeaseLost)
			}
			rev, cur = f.rev, f.rec
		}
		data, ok := next(cur)
		if !ok {
			return nil
		}
		seq, err := s.write(ctx, subj, rev, data, d)
		if err == nil {
			if op == "extend" {
				s.remember(token, seq)
			}
			return nil
		}
		if !wrongRevision(err) {
			return s.fail(ctx, op, key, err)
		}
	}
	return s.fail(ctx, op, key, errContended)
}

// fail wraps an error that left the store without an answer.
func (s *Store) fail(ctx context.Context, op, key string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("kvstore: %s %q: %w", op, key, err)
	}
	return fmt.Errorf("kvstore: %s %q: %w: %w", op, key, dedup.ErrStoreUnavailable, err)
}
