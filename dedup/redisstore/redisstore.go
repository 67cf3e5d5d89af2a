// Package redisstore is a dedup.Store on Redis (github.com/redis/go-redis/v9).
//
// # Layout
//
// Each dedup key is one Redis string, named Prefix + Namespace + ":{" + key
// + "}", holding the record: its state (in progress or completed), the
// claimant's lease end as the claimant's clock read it, the owner token, the
// fingerprint and the result (see record). Its Redis expiry is the lease
// while in progress and the TTL once completed, so Redis itself forgets
// lapsed claims and old completions, by the server's clock. The namespace
// (a tenant, a consumer group) keeps two consumers from sharing a key by
// accident. The dedup key is the hash tag: each record lives in one slot of
// a Redis Cluster, and the keys of a namespace spread over all slots instead
// of piling onto one node.
//
// Claim is one native command, SET key record NX GET PX lease (Redis 7.0 or
// later; on an older server the store falls back to a Lua script that does
// the same): it takes a free key, or returns the record that holds it, in
// one atomic round trip. Extend, Complete and Release are Lua scripts that
// act only if the record carries the caller's token, so a consumer whose
// lease ran out cannot overwrite the record of the one that took over. Calls
// made at the same time by concurrent deliveries are sent together in one
// pipeline (see Options.MaxBatch), which is how a claim plus a completion per
// message keeps up with one unpipelined SET NX per message.
//
// # When Redis fails
//
// Every error other than dedup.ErrLeaseLost means the store could not decide
// and wraps dedup.ErrStoreUnavailable (and the client's own error, so
// errors.Is also finds net and go-redis errors), except that the caller's
// own cancelled or expired context is reported as that context's error. The
// Guard turns ErrStoreUnavailable into a nack by default (fail-closed): the
// delivery comes back later and is never processed without a dedup
// decision. Processing it anyway (fail-open) is the Guard's explicit option,
// not the store's.
//
// A call's result depends on its own context only: it returns when that
// context ends, while the pipeline it rides in goes on for the other
// callers in it. A SET NX that Redis applied after its caller gave up, or
// whose caller was told it failed, is released with its own token as soon
// as the store learns of it (at once when it cannot learn), so that the key
// is not left in progress for a whole lease with no handler running.
//
// # Redis Cluster
//
// Every command names one key, so none can span slots, and the Cluster
// client splits a pipeline of concurrent calls into one part per master.
// The tests run the conformance suite on a three-master cluster and kill a
// master under load. Calls on its keys then fail with ErrStoreUnavailable,
// and so do calls on every key once the other masters mark it failed
// (after cluster-node-timeout: Redis's default
// cluster-require-full-coverage stops the whole cluster). Without a
// replica that lasts until the master is back; with one, the replica took
// over 1.5 to 2s after the kill in the tests (cluster-node-timeout 500ms).
// The store asks the client to reload its slot map whenever a call fails:
// go-redis would otherwise keep dialing the dead master for up to a minute.
// A pipeline returns when its last part is done, so calls to healthy
// masters wait as long as the dead master's part: up to 3.6s with
// go-redis's five dial attempts per try, about 0.3s with DialerRetries 1.
// A handler that held a key of the dead master across the failover
// recorded its completion on the replica. In the tests the replica had
// every write the master acknowledged, but replication is asynchronous, so
// that is luck, not a promise (see below).
//
// # What Redis cannot promise
//
// Redis acknowledges a write before it reaches disk: with the default
// persistence (RDB snapshots, or AOF with appendfsync everysec) a crash
// loses the last seconds of claims and completions, and replication is
// asynchronous, so a failover to a replica can forget keys the old primary
// had acknowledged. A forgotten completion lets a later duplicate run its
// effect again; a forgotten claim lets two handlers run at once. WAIT and
// appendfsync always narrow the gap but do not close it. Pick Redis when a
// rare repeat after a crash or failover is tolerable and speed matters; pick
// the pgstore package when it is not, and its transactional API when the
// effect itself lives in PostgreSQL.
package redisstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
	"github.com/dedupq/dedupq/dedup/internal/coalesce"
)

// Options configure a Store. The zero value is usable.
type Options struct {
	// Prefix starts every Redis key the store writes; "" means
	// "dedupq:".
	Prefix string
	// Namespace separates the keys of tenants or consumer groups that
	// share a Redis; "" means "default". Neither Prefix nor Namespace may
	// contain '{' or '}', which would move the hash tag.
	Namespace string
	// MaxBatch caps how many calls made at the same time share one
	// pipeline; 0 means 128, 1 sends each call on its own.
	MaxBatch int
	// MaxInFlight caps how many pipelines run at once; 0 means 2. Calls
	// arriving while all are busy wait and go out together in the next
	// one, so a lower number makes bigger batches and costs Redis fewer
	// reads and writes per call.
	MaxInFlight int
}

// Store is a dedup.Store on Redis, safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	batch  *coalesce.Batcher[*call]
	// noSetGet is set once the server refused SET NX GET (before 7.0).
	noSetGet atomic.Bool
}

// New returns a Store on rdb, which may be a single node, Sentinel or
// Cluster client. The store does not close rdb.
func New(rdb redis.UniversalClient, o Options) (*Store, error) {
	if o.Prefix == "" {
		o.Prefix = "dedupq:"
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if strings.ContainsAny(o.Prefix+o.Namespace, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q and namespace %q must not contain braces", o.Prefix, o.Namespace)
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 128
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 2
	}
	s := &Store{rdb: rdb, prefix: o.Prefix + o.Namespace + ":"}
	if o.MaxBatch > 1 {
		s.batch = coalesce.New(o.MaxBatch, o.MaxInFlight, s.flush, s.abandoned)
		// A pipeline whose callers all gave up still reads its answers, so
		// that a claim it made is released after Redis applied it: cut
		// short, the SET could reach Redis after the release had found
		// nothing.
		s.batch.Grace = undoTimeout
	}
	return s, nil
}

// Key is the Redis key that holds the record of a dedup key, for
// inspecting it with redis-cli.
func (s *Store) Key(key string) string { return s.prefix + "{" + key + "}" }

// record is the stored value: state (1 byte: p in progress, c completed),
// lease end in Unix milliseconds (16 hex digits; zeros once completed),
// the token's random part (claimtoken.RandLen hex digits), the fingerprint's
// length (8 hex digits), the fingerprint, then the result. Fixed-width
// fields let the scripts below compare tokens and rewrite the lease without
// parsing the rest.
func record(state byte, until time.Time, token string, result []byte) string {
	fp, _ := claimtoken.Fingerprint(token)
	var ms int64
	if !until.IsZero() {
		ms = until.UnixMilli()
	}
	// A Builder hands its buffer over as the string: one allocation per
	// record, where building a []byte and converting it made two.
	var b strings.Builder
	b.Grow(headerLen + len(fp) + len(result))
	b.WriteByte(state)
	writeHex(&b, uint64(ms), 16)
	b.WriteString(token[:claimtoken.RandLen])
	writeHex(&b, uint64(len(fp)), 8)
	b.WriteString(fp)
	b.Write(result)
	return b.String()
}

// writeHex writes v as width lowercase hex digits, zero-padded (v fits:
// a Unix millisecond or a fingerprint's length). fmt's %016x cost an
// allocation or two per record on every claim and completion.
func writeHex(b *strings.Builder, v uint64, width int) {
	const digits = "0123456789abcdef"
	for i := width - 1; i >= 0; i-- {
		b.WriteByte(digits[(v>>(4*uint(i)))&0xf])
	}
}

// hex16 is v as 16 hex digits, as writeHex writes it.
func hex16(v uint64) string {
	var b strings.Builder
	b.Grow(16)
	writeHex(&b, v, 16)
	return b.String()
}

const headerLen = 1 + 16 + claimtoken.RandLen + 8

// parseRecord reads what Claim found.
func parseRecord(v string) (dedup.Claim, error) {
	if len(v) < headerLen {
		return dedup.Claim{}, fmt.Errorf("malformed record %q", v)
	}
	ms, err1 := strconv.ParseInt(v[1:17], 16, 64)
	n, err2 := strconv.ParseInt(v[headerLen-8:headerLen], 16, 64)
	if err1 != nil || err2 != nil || n < 0 || int64(len(v)) < headerLen+n {
		return dedup.Claim{}, fmt.Errorf("malformed record %q", v)
	}
	c := dedup.Claim{Fingerprint: v[headerLen : headerLen+int(n)]}
	switch v[0] {
	case 'c':
		c.State = dedup.Completed
		if res := v[headerLen+int(n):]; res != "" {
			c.Result = []byte(res)
		}
	case 'p':
		c.State, c.LeaseUntil = dedup.InProgress, time.UnixMilli(ms)
	default:
		return dedup.Claim{}, fmt.Errorf("malformed record %q", v)
	}
	return c, nil
}

// The token's random part sits at bytes 18..49 (1-based, as Lua counts) of
// a record.

// script is a Lua script, sent by its SHA-1 (EVALSHA) and whole (EVAL)
// only when the server does not know it yet. The store builds the
// EVALSHA command itself, in one slice, instead of going through
// redis.Script, whose keys and argument slices cost three more
// allocations per call.
type script struct{ src, hash string }

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, hash: hex.EncodeToString(sum[:])}
}

// claimScript is SET NX GET PX for servers older than 7.0. KEYS[1]; ARGV
// record, lease ms. Answers nil when acquired, else the record found.
var claimScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`)

// A record that is gone has lapsed (or been released) and nobody took it
// over since, so the scripts below let its former holder write it again.

// extendScript: KEYS[1]; ARGV token's random part, lease ms, new lease end
// (16 hex digits), record to write if gone. 0 = lost.
var extendScript = newScript(`
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
  return 1
end
if string.sub(v, 18, 49) ~= ARGV[1] then return 0 end
if string.sub(v, 1, 1) == 'c' then return 1 end
redis.call('SET', KEYS[1], 'p' .. ARGV[3] .. string.sub(v, 18), 'PX', ARGV[2])
return 1
`)

// completeScript: KEYS[1]; ARGV token's random part, ttl ms, completed
// record. 0 = lost.
var completeScript = newScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 18, 49) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
return 1
`)

// releaseScript: KEYS[1]; ARGV token's random part. 0 = lost. A completion
// stays: its holder releasing it is a bug, and forgetting it would repeat
// the effect.
var releaseScript = newScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 1 end
if string.sub(v, 18, 49) ~= ARGV[1] then return 0 end
if string.sub(v, 1, 1) == 'p' then redis.call('DEL', KEYS[1]) end
return 1
`)

// call is one command, queued for a pipeline: EVALSHA of script, or a
// plain command when script is nil. args is the whole command.
type call struct {
	coalesce.Call
	script *script
	args   []any
	// claim is the dedup key and token of a Claim, for undoing it.
	claim struct{ key, token string }
	val   any
	err   error
	// gaveUp says that the caller stopped waiting while the call was
	// queued or in flight: abandoned settles it.
	gaveUp bool
}

// scriptCall makes the EVALSHA call of sc on key with the arguments argv.
func (s *Store) scriptCall(sc *script, key string, argv ...any) *call {
	args := make([]any, 4+len(argv))
	args[0], args[1], args[2], args[3] = "evalsha", sc.hash, 1, s.Key(key)
	copy(args[4:], argv)
	return &call{script: sc, args: args}
}

// noScript says whether err is the server's answer to an EVALSHA of a
// script it does not know.
func noScript(err error) bool {
	return err != nil && err != redis.Nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// whole turns the EVALSHA call c into the EVAL of its script's source,
// which also makes the server cache the script.
func (c *call) whole() {
	c.args[0], c.args[1] = "eval", c.script.src
}

// run sends c and waits for its answer or for ctx, whichever comes first.
func (s *Store) run(ctx context.Context, c *call) (any, error) {
	if s.batch == nil {
		v, err := s.rdb.Do(ctx, c.args...).Result()
		if c.script != nil && noScript(err) {
			c.whole()
			v, err = s.rdb.Do(ctx, c.args...).Result()
		}
		return v, err
	}
	if err := s.batch.Do(ctx, c); err != nil {
		c.gaveUp = true
		return nil, err
	}
	return c.val, c.err
}

// undoTimeout bounds the release of a claim whose caller was told it
// failed.
const undoTimeout = 10 * time.Second

// abandoned gets the calls that a pipeline answered after their callers
// had given up. A claim among them that was acquired, or may have been (its
// pipeline failed), holds its key under a token nobody has: release it, or
// the key would stay in progress for a whole lease with no handler
// running. The token is the claim's own, so the release cannot touch anyone
// else's record. The other calls need no undoing: a completion that lands
// after its caller gave up records an effect that did happen, with the
// token that ran it, which is what a redelivery must find; a late release
// frees a key its holder wanted freed; a late extension only keeps a key
// its holder still holds (it completes or releases it, or the extended
// lease runs out).
func (s *Store) abandoned(late []*call) {
	for _, c := range late {
		if c.claim.token == "" {
			continue
		}
		if _, found := c.val.(string); found && c.err == nil {
			continue // another's record: nothing taken
		}
		s.undoClaim(c.claim.key, c.claim.token)
	}
}

// undoClaim releases a claim whose caller was told it failed, as far as
// Redis can be reached; if it cannot, the lease frees the key.
func (s *Store) undoClaim(key, token string) {
	ctx, cancel := context.WithTimeout(context.Background(), undoTimeout)
	defer cancel()
	_ = s.Release(ctx, key, token)
}

// flush sends a batch of calls in one pipeline. ctx is the batch's own (see
// coalesce.Batcher): it ends only when every caller in the batch has given
// up.
func (s *Store) flush(ctx context.Context, batch []*call) {
	defer func() {
		for _, c := range batch {
			c.Settle()
		}
	}()
	pending := batch
	if len(pending) > 1 && pending[0].claim.token != "" {
		// go-redis checks whether a pipeline should be retried when its
		// first reply is an error, and redis.Nil counts as one: an
		// acquired claim's answer. That check costs some twenty
		// allocations; with another call first, it is skipped. The calls
		// of a batch are concurrent, so their order is free.
		for i, c := range pending {
			if c.claim.token == "" {
				pending[0], pending[i] = c, pending[0]
				break
			}
		}
	}
	// The first pass runs scripts by hash; one that the server does not
	// know yet (first use, SCRIPT FLUSH, a failover to a fresh replica) is
	// sent whole in a second pass, which also caches it.
	for pass := 0; pass < 2 && len(pending) > 0; pass++ {
		var cmds []*redis.Cmd
		if len(pending) == 1 {
			cmds = []*redis.Cmd{s.rdb.Do(ctx, pending[0].args...)}
		} else {
			pipe := s.rdb.Pipeline()
			cmds = make([]*redis.Cmd, len(pending))
			for i, c := range pending {
				cmds[i] = pipe.Do(ctx, c.args...)
			}
			_, _ = pipe.Exec(ctx) // each command carries its own error
		}
		var again []*call
		for i, c := range pending {
			c.val, c.err = cmds[i].Result()
			if pass == 0 && c.script != nil && noScript(c.err) {
				c.whole()
				again = append(again, c)
			}
		}
		pending = again
	}
}

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.Claim, error) {
	if lease <= 0 {
		return dedup.Claim{}, fmt.Errorf("redisstore: claim %q: lease %s is not positive", key, lease)
	}
	token := claimtoken.New(fingerprint)
	rec := record('p', time.Now().Add(lease), token, nil)
	var c *call
	if s.noSetGet.Load() {
		c = s.scriptCall(claimScript, key, rec, millis(lease))
	} else {
		c = &call{args: []any{"set", s.Key(key), rec, "nx", "get", "px", millis(lease)}}
	}
	c.claim.key, c.claim.token = key, token
	v, err := s.run(ctx, c)
	if err != nil && err != redis.Nil && c.script == nil && redis.HasErrorPrefix(err, "ERR syntax") {
		// Redis before 7.0 refuses NX with GET.
		s.noSetGet.Store(true)
		return s.Claim(ctx, key, fingerprint, lease)
	}
	if errors.Is(err, redis.Nil) {
		return dedup.Claim{State: dedup.Acquired, Token: token}, nil
	}
	if err != nil {
		if !c.gaveUp {
			// The SET may have reached Redis before the error (a reply
			// lost, or cut off by ctx when each call goes on its own):
			// its caller is told it failed, so it must not keep the
			// key. A batched call whose caller gave up is undone by
			// abandoned, once its answer is in.
			go s.undoClaim(key, token)
		}
		return dedup.Claim{}, s.fail(ctx, "claim", key, err)
	}
	found, _ := v.(string)
	cl, err := parseRecord(found)
	if err != nil {
		return dedup.Claim{}, s.fail(ctx, "claim", key, err)
	}
	return cl, nil
}

// Extend implements dedup.Store. Extending a claim its holder already
// completed leaves the completion as it is.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if lease <= 0 {
		return fmt.Errorf("redisstore: extend %q: lease %s is not positive", key, lease)
	}
	if _, ok := claimtoken.Fingerprint(token); !ok {
		return fmt.Errorf("redisstore: extend %q: malformed token: %w", key, dedup.ErrLeaseLost)
	}
	until := time.Now().Add(lease)
	return s.owned(ctx, "extend", key, s.scriptCall(extendScript, key,
		token[:claimtoken.RandLen], millis(lease), hex16(uint64(until.UnixMilli())), record('p', until, token, nil)))
}

// Complete implements dedup.Store. An empty result is stored as none: a
// later Claim reports a nil Result.
func (s *Store) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if ttl <= 0 {
		return fmt.Errorf("redisstore: complete %q: ttl %s is not positive", key, ttl)
	}
	if _, ok := claimtoken.Fingerprint(token); !ok {
		return fmt.Errorf("redisstore: complete %q: malformed token: %w", key, dedup.ErrLeaseLost)
	}
	return s.owned(ctx, "complete", key, s.scriptCall(completeScript, key, token[:claimtoken.RandLen], millis(ttl), record('c', time.Time{}, token, result)))
}

// Release implements dedup.Store. Releasing a key the same token already
// completed does nothing: forgetting a completed effect would let a
// redelivery repeat it.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if _, ok := claimtoken.Fingerprint(token); !ok {
		return fmt.Errorf("redisstore: release %q: malformed token: %w", key, dedup.ErrLeaseLost)
	}
	return s.owned(ctx, "release", key, s.scriptCall(releaseScript, key, token[:claimtoken.RandLen]))
}

// owned runs c, a script that acts only for the key's holder.
func (s *Store) owned(ctx context.Context, op, key string, c *call) error {
	v, err := s.run(ctx, c)
	if err != nil {
		return s.fail(ctx, op, key, err)
	}
	if n, _ := v.(int64); n == 0 {
		return fmt.Errorf("redisstore: %s %q: %w", op, key, dedup.ErrLeaseLost)
	}
	return nil
}

// fail wraps an error that left the store without an answer.
func (s *Store) fail(ctx context.Context, op, key string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
	}
	if c, ok := s.rdb.(slotMapper); ok {
		c.ReloadState(ctx)
	}
	return fmt.Errorf("redisstore: %s %q: %w: %w", op, key, dedup.ErrStoreUnavailable, err)
}

// slotMapper is a Cluster client. go-redis reloads its map of which node
// serves which slot when a node answers MOVED, but not when the node it
// has for a slot stops answering: after a failover it would go on dialing
// the dead master until its ClusterStateReloadInterval (a minute by
// default) had passed, and every call on that master's keys would fail
// until then. So a failed call asks for a reload; the client runs one at a
// time, in the background, at most every 200ms.
type slotMapper interface{ ReloadState(context.Context) }

// millis rounds d up to whole milliseconds, Redis's finest unit, so that a
// lease is never shorter than asked.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
