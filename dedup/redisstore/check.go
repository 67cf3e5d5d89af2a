package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
)

var _ dedup.Checker = (*Store)(nil)

// checkKey is the dedup key of the record Check writes. A control
// character keeps it apart from any dedup ID a dedupq Publisher can send;
// and since the probe never overwrites a key and lives a second, even a
// foreign message carrying exactly this ID could at worst be nacked once.
const checkKey = "\x01dedupq-ready-check"

// checkScript proves that the server runs scripts, which Extend, Complete
// and Release need on every version. It reads and writes nothing.
var checkScript = redis.NewScript(`return 1`)

// Check implements dedup.Checker with three round trips: PING; the claim's
// own command, SET NX GET PX, on a reserved key (which proves the server
// accepts writes, as a read-only replica does not, and finds out whether
// it is Redis 7.0 or later; before that the claim uses its Lua fallback,
// which is fine); and a trivial script, since the other operations are
// scripts on every version. It does not write any dedup key: the probe
// record expires after a second and never overwrites an existing key.
//
// New takes no context, so it does no I/O; call Check (or let
// dedupq.NewConsumer call it through the Guard) to find out at startup.
func (s *Store) Check(ctx context.Context) error {
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return s.checkFail(ctx, "PING", err)
	}
	err := s.rdb.Do(ctx, "set", s.Key(checkKey), "ready-check", "nx", "get", "px", 1000).Err()
	switch {
	case err == nil || errors.Is(err, redis.Nil):
	case redis.HasErrorPrefix(err, "ERR syntax"):
		// Before 7.0: claims run claimScript instead.
		s.noSetGet.Store(true)
	case redis.HasErrorPrefix(err, "READONLY"):
		return fmt.Errorf("redisstore: the server is a read-only replica (%w); point the client at the primary", err)
	case redis.HasErrorPrefix(err, "NOPERM"), redis.HasErrorPrefix(err, "NOAUTH"):
		return fmt.Errorf("redisstore: the client may not write keys under %q (%w); grant its Redis user SET, GET, DEL, EVAL and EVALSHA on them", s.prefix, err)
	default:
		return s.checkFail(ctx, "SET NX GET", err)
	}
	if err := checkScript.Run(ctx, s.rdb, []string{s.Key(checkKey)}).Err(); err != nil {
		if redis.HasErrorPrefix(err, "NOPERM") || redis.HasErrorPrefix(err, "ERR unknown command") {
			return fmt.Errorf("redisstore: the server refuses Lua scripts (%w), which Extend, Complete and Release need; allow EVAL and EVALSHA for the client's user", err)
		}
		return s.checkFail(ctx, "EVAL", err)
	}
	return nil
}

// checkFail words a failed probe: a server that did not answer is
// unavailable (it may come back), anything else is reported as it is.
func (s *Store) checkFail(ctx context.Context, op string, err error) error {
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return fmt.Errorf("redisstore: check (%s): %w", op, err)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return fmt.Errorf("redisstore: check (%s): Redis refused it: %w", op, err)
	}
	return fmt.Errorf("redisstore: check (%s): %w: cannot reach Redis (is it running, and is the client's address right?): %w", op, dedup.ErrStoreUnavailable, err)
}
