// Package memstore is an in-memory dedup.Store for tests, examples and
// single-process consumers.
//
// It remembers keys only as long as the process lives: after a restart every
// completed key is forgotten and its redeliveries run again. Use it where
// that is acceptable, or to test code against a Store on a fake clock; use
// the redisstore or pgstore package to survive restarts and to share keys
// between consumer processes.
package memstore

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/internal/claimtoken"
)

// sweepEvery is the fewest claims that pass between scans for expired
// records: often enough that keys never seen again do not pile up. Past it
// a scan waits for as many claims as it left records, so that its O(n)
// cost stays constant per claim however many records are live (a fixed
// interval made a store of 200k live keys 40× slower than one of 1k).
const sweepEvery = 1024

// Store is an in-memory dedup.Store. It is safe for concurrent use; the zero
// value is not usable, call New.
type Store struct {
	clock clock.Clock

	mu sync.Mutex
	// recs holds records by value: one allocation less per claim than a
	// pointer each, the price being a write back after each change.
	recs map[string]record
	// claims counts the claims since the last sweep, which left kept
	// records.
	claims, kept int
}

type record struct {
	token       string
	fingerprint string
	completed   bool
	// until is the lease end while in progress, the expiry of the
	// completion once completed.
	until  time.Time
	result []byte
}

// New returns an empty Store whose leases and TTLs run on c; nil means the
// real clock.
func New(c clock.Clock) *Store {
	return &Store{clock: clock.Or(c), recs: make(map[string]record)}
}

// Len is the number of records held, including expired ones not yet swept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (dedup.Claim, error) {
	if err := ctx.Err(); err != nil {
		return dedup.Claim{}, err
	}
	if lease <= 0 {
		return dedup.Claim{}, fmt.Errorf("memstore: Claim %q: lease %s is not positive", key, lease)
	}
	token := claimtoken.New(fingerprint)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if s.claims++; s.claims >= max(sweepEvery, s.kept) {
		s.sweep(now)
		s.claims, s.kept = 0, len(s.recs)
	}
	if r, ok := s.recs[key]; ok && r.until.After(now) {
		if r.completed {
			return dedup.Claim{State: dedup.Completed, Fingerprint: r.fingerprint, Result: bytes.Clone(r.result)}, nil
		}
		return dedup.Claim{State: dedup.InProgress, Fingerprint: r.fingerprint, LeaseUntil: r.until}, nil
	}
	s.recs[key] = record{token: token, fingerprint: fingerprint, until: now.Add(lease)}
	return dedup.Claim{State: dedup.Acquired, Token: token}, nil
}

// Extend implements dedup.Store. Extending a claim that was already
// completed with the same token leaves the completion as it is.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("memstore: Extend %q: lease %s is not positive", key, lease)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	if !r.completed {
		r.until = s.clock.Now().Add(lease)
	}
	s.recs[key] = r
	return nil
}

// Complete implements dedup.Store.
func (s *Store) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("memstore: Complete %q: ttl %s is not positive", key, ttl)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	r.completed, r.until, r.result = true, s.clock.Now().Add(ttl), bytes.Clone(result)
	s.recs[key] = r
	return nil
}

// Release implements dedup.Store. Releasing a key that the same token
// already completed does nothing: forgetting a completed effect would let a
// redelivery repeat it.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[key]
	switch {
	case !ok:
		return nil
	case r.token != token:
		return fmt.Errorf("memstore: Release %q: %w", key, dedup.ErrLeaseLost)
	case !r.completed:
		delete(s.recs, key)
	}
	return nil
}

// owned returns key's record if token holds it. A record that is gone
// (swept after its lease lapsed) means nobody took the key over since, so
// the holder still owns it: the record is rebuilt from the token.
//
// The caller stores the record back once changed.
func (s *Store) owned(key, token string) (record, error) {
	r, ok := s.recs[key]
	if !ok {
		fp, valid := claimtoken.Fingerprint(token)
		if !valid {
			return record{}, fmt.Errorf("memstore: %q: malformed token: %w", key, dedup.ErrLeaseLost)
		}
		return record{token: token, fingerprint: fp}, nil
	}
	if r.token != token {
		return record{}, fmt.Errorf("memstore: %q: %w", key, dedup.ErrLeaseLost)
	}
	return r, nil
}

// sweep drops records whose lease or completion has run out.
func (s *Store) sweep(now time.Time) {
	for k, r := range s.recs {
		if !r.until.After(now) {
			delete(s.recs, k)
		}
	}
}
