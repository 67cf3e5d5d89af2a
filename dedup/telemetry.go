package dedup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	mnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/dedupq/dedupq/internal/oteloff"
)

// instrumentationName names the dedup package's meter.
const instrumentationName = "github.com/dedupq/dedupq/dedup"

// Decisions, as dedupq.outcome on dedupq.dedup.decisions. Each matches a
// field of Stats.
const (
	outcomeRan         = "ran"
	outcomeFailed      = "failed"
	outcomeSuppressed  = "suppressed_duplicate"
	outcomeDeferred    = "deferred_in_progress"
	outcomeConflict    = "fingerprint_conflict"
	outcomeBypassed    = "bypassed"
	outcomeUnrecorded  = "unrecorded"
	outcomeUnavailable = "unavailable"
	outcomeEmptyKey    = "empty_key"
)

// Decision is a consumer-side dedup decision: one field of Stats, and the
// dedupq.outcome of the metric dedupq.dedup.decisions.
type Decision string

// The decisions, one per Stats field.
const (
	DecisionRan         Decision = outcomeRan
	DecisionFailed      Decision = outcomeFailed
	DecisionSuppressed  Decision = outcomeSuppressed
	DecisionDeferred    Decision = outcomeDeferred
	DecisionConflict    Decision = outcomeConflict
	DecisionBypassed    Decision = outcomeBypassed
	DecisionUnrecorded  Decision = outcomeUnrecorded
	DecisionUnavailable Decision = outcomeUnavailable
	DecisionEmptyKey    Decision = outcomeEmptyKey
)

// DecisionCounter counts decisions as the metric dedupq.dedup.decisions,
// so that a deduplicator outside this package (pgstore.TxGuard) reports in
// the Guard's terms. The zero value counts nothing.
type DecisionCounter struct{ gm guardMetrics }

// NewDecisionCounter returns a counter on mp (nil: the global provider),
// labelled with store's name (see StoreName).
func NewDecisionCounter(mp metric.MeterProvider, store Store) DecisionCounter {
	gm, _ := newGuardMetrics(mp, store)
	return DecisionCounter{gm: gm}
}

// Add counts one decision.
func (c DecisionCounter) Add(ctx context.Context, d Decision) {
	c.gm.add(ctx, string(d))
}

// guardMetrics are a Guard's instruments; decisions is nil when metrics
// are off (see metricsOff).
type guardMetrics struct {
	decisions metric.Int64Counter
	store     attribute.KeyValue
	// outcomes holds each decision's attributes, built once so that
	// counting one allocates nothing.
	outcomes map[string][]metric.AddOption
}

// metricsOff reports a meter provider under which the Guard records
// nothing: the API's no-op provider, or the one dedupq's benchmarks use
// as their baseline. Then it makes no call for metrics at all, and its
// store is not timed.
func metricsOff(mp metric.MeterProvider) bool {
	switch mp.(type) {
	case oteloff.MeterProvider, *oteloff.MeterProvider, mnoop.MeterProvider, *mnoop.MeterProvider:
		return true
	}
	return false
}

// newGuardMetrics returns the instruments on mp (nil: the global
// provider) and its meter, nil when metrics are off.
func newGuardMetrics(mp metric.MeterProvider, store Store) (guardMetrics, metric.Meter) {
	var gm guardMetrics
	gm.store = attribute.String("dedupq.store", StoreName(store))
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if metricsOff(mp) {
		return gm, nil
	}
	m := mp.Meter(instrumentationName)
	gm.decisions, _ = m.Int64Counter("dedupq.dedup.decisions", metric.WithUnit("{delivery}"),
		metric.WithDescription("What consumer-side dedup did with a delivery, by dedupq.outcome (one per Stats field)."))
	gm.outcomes = map[string][]metric.AddOption{}
	for _, o := range []string{outcomeRan, outcomeFailed, outcomeSuppressed, outcomeDeferred, outcomeConflict,
		outcomeBypassed, outcomeUnrecorded, outcomeUnavailable, outcomeEmptyKey} {
		gm.outcomes[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(gm.store, attribute.String("dedupq.outcome", o)))}
	}
	return gm, m
}

func (gm guardMetrics) add(ctx context.Context, outcome string) {
	if gm.decisions == nil {
		return
	}
	opts, ok := gm.outcomes[outcome]
	if !ok {
		opts = []metric.AddOption{metric.WithAttributes(gm.store, attribute.String("dedupq.outcome", outcome))}
	}
	gm.decisions.Add(ctx, 1, opts...)
}

// StoreName is the name a store's metrics carry as dedupq.store: its
// package name ("redisstore", "pgstore", "memstore"), read from its type.
func StoreName(s Store) string {
	name := strings.TrimLeft(fmt.Sprintf("%T", s), "*")
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return name
}

// StoreOp is a store operation, as dedupq.store.op on the histogram
// dedupq.store.duration.
type StoreOp int

// The operations of the Store interface; a deduplicator that does not call
// a Store (pgstore.TxGuard) times its statements as the one each does the
// work of.
const (
	OpClaim StoreOp = iota
	OpExtend
	OpComplete
	OpRelease
	numOps
)

// String is the operation's dedupq.store.op.
func (op StoreOp) String() string {
	switch op {
	case OpClaim:
		return "claim"
	case OpExtend:
		return "extend"
	case OpComplete:
		return "complete"
	}
	return "release"
}

// StoreTimer times store operations as the histogram
// dedupq.store.duration: every call a Guard makes to its Store, and the
// statements of a deduplicator outside this package (pgstore.TxGuard). An
// operation is timed only while the histogram is enabled (Enabled: an SDK
// installed that keeps it): under the API's global provider before an SDK
// is installed, which cannot be told from one that will be, that saves two
// clock reads and a Record per operation. The zero value times nothing.
type StoreTimer struct{ t *storeTimer }

// NewStoreTimer returns a timer on mp (nil: the global provider) labelled
// with store's name (see StoreName).
func NewStoreTimer(mp metric.MeterProvider, store Store) StoreTimer {
	gm, m := newGuardMetrics(mp, store)
	return StoreTimer{t: newStoreTimer(m, gm.store)}
}

// Start starts timing one operation, to be ended by the Timing's Done.
func (s StoreTimer) Start(ctx context.Context) Timing {
	if s.t == nil || !s.t.duration.Enabled(ctx) {
		return Timing{}
	}
	return Timing{t: s.t, start: time.Since(s.t.epoch)}
}

// Timing is one operation being timed (StoreTimer.Start).
type Timing struct {
	t     *storeTimer
	start time.Duration // since t.epoch
}

// Done records the operation op, which ended with err (its error.type:
// lease_lost, unavailable, canceled or error).
func (m Timing) Done(ctx context.Context, op StoreOp, err error) {
	if m.t != nil {
		m.t.record(ctx, op, m.start, err)
	}
}

// storeTimer is a StoreTimer's histogram and the attributes it records
// with.
type storeTimer struct {
	duration metric.Float64Histogram
	// attrs holds each op's store and op attributes, built once: a map
	// looked up per operation cost a string hash each time.
	attrs [numOps][]metric.RecordOption
	store attribute.KeyValue
	// epoch is what an operation's start and end are read against:
	// time.Since(epoch) reads the monotonic clock alone, where time.Now
	// reads the wall clock as well (170 ns instead of 50 on a 2-core VM),
	// and a duration needs only the monotonic one.
	epoch time.Time
}

// newStoreTimer returns the timer of store's operations on m, nil when m
// is (metrics off).
func newStoreTimer(m metric.Meter, store attribute.KeyValue) *storeTimer {
	if m == nil {
		return nil
	}
	t := &storeTimer{store: store, epoch: time.Now()}
	t.duration, _ = m.Float64Histogram("dedupq.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of dedup store operations, by dedupq.store, dedupq.store.op and, on failure, error.type."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
	for op := range numOps {
		t.attrs[op] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(store, attribute.String("dedupq.store.op", op.String())))}
	}
	return t
}

// record times op, started at start (time.Since(t.epoch) then).
func (t *storeTimer) record(ctx context.Context, op StoreOp, start time.Duration, err error) {
	d := (time.Since(t.epoch) - start).Seconds()
	if err == nil {
		t.duration.Record(ctx, d, t.attrs[op]...)
		return
	}
	kind := "error"
	switch {
	case errors.Is(err, ErrLeaseLost):
		kind = "lease_lost"
	case errors.Is(err, ErrStoreUnavailable):
		kind = "unavailable"
	case ctx.Err() != nil:
		kind = "canceled"
	}
	t.duration.Record(ctx, d, metric.WithAttributes(t.store, attribute.String("dedupq.store.op", op.String()), attribute.String("error.type", kind)))
}

// timedStore wraps a Store to time every operation and count its errors,
// once for all stores.
type timedStore struct {
	Store
	timer StoreTimer
}

// newTimedStore returns s timed on m, or s itself when m is nil (metrics
// off).
func newTimedStore(s Store, m metric.Meter, store attribute.KeyValue) Store {
	if m == nil {
		return s
	}
	return &timedStore{Store: s, timer: StoreTimer{t: newStoreTimer(m, store)}}
}

func (t *timedStore) Claim(ctx context.Context, key, fingerprint string, lease time.Duration) (Claim, error) {
	m := t.timer.Start(ctx)
	c, err := t.Store.Claim(ctx, key, fingerprint, lease)
	m.Done(ctx, OpClaim, err)
	return c, err
}

func (t *timedStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	m := t.timer.Start(ctx)
	err := t.Store.Extend(ctx, key, token, lease)
	m.Done(ctx, OpExtend, err)
	return err
}

func (t *timedStore) Complete(ctx context.Context, key, token string, ttl time.Duration, result []byte) error {
	m := t.timer.Start(ctx)
	err := t.Store.Complete(ctx, key, token, ttl, result)
	m.Done(ctx, OpComplete, err)
	return err
}

func (t *timedStore) Release(ctx context.Context, key, token string) error {
	m := t.timer.Start(ctx)
	err := t.Store.Release(ctx, key, token)
	m.Done(ctx, OpRelease, err)
	return err
}
