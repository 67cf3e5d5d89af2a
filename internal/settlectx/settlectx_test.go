// The settle context against the real clock: no services.
package settlectx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupq/dedupq/internal/testutil"
)

type settleCtxKey struct{}

func TestSettleCtx(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), settleCtxKey{}, "v"))
	cancel() // a settle outlives its handler's context
	tests := []struct {
		name    string
		timeout time.Duration
		doneFst bool // ask for Done before Err
		wantErr error
	}{
		{"running, Err only", time.Hour, false, nil},
		{"running, Done armed", time.Hour, true, nil},
		{"expired, Err only", 0, false, context.DeadlineExceeded},
		{"expired, Done first", 0, true, context.DeadlineExceeded},
		{"expired, Done after Err", -time.Second, false, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := New(parent, tt.timeout)
			defer c.Release()
			if tt.doneFst {
				c.Done()
			}
			if err := c.Err(); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Err() = %v, want %v", err, tt.wantErr)
			}
			select {
			case <-c.Done():
				if tt.wantErr == nil {
					t.Fatal("Done closed before the deadline")
				}
			default:
				if tt.wantErr != nil {
					t.Fatal("Done open after the deadline")
				}
			}
			// The parent was cancelled: its cause is not the settle's.
			if err := context.Cause(c); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Cause = %v, want %v", err, tt.wantErr)
			}
			if v := c.Value(settleCtxKey{}); v != "v" {
				t.Fatalf("Value = %v, want the parent's", v)
			}
			if d, ok := c.Deadline(); !ok || d.IsZero() {
				t.Fatalf("Deadline() = %v, %v", d, ok)
			}
		})
	}
}

// TestSettleCtxTimerFires checks that a Done asked for before the deadline
// closes when it passes.
func TestSettleCtxTimerFires(t *testing.T) {
	c := New(context.Background(), 10*time.Millisecond)
	defer c.Release()
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed a minute after a 10ms deadline")
	}
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err() = %v", err)
	}
	if err := context.Cause(c); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Cause = %v", err)
	}
}

// TestTimersReused: a timer given back by Release expires the next Ctx it
// is armed for, at that Ctx's deadline, and not the Ctx it served before.
func TestTimersReused(t *testing.T) {
	var timers Timers
	parent := context.WithoutCancel(context.Background())
	first := new(Ctx)
	first.InitDetached(parent, time.Hour, &timers)
	first.Done()
	first.Release()
	second := new(Ctx)
	second.InitDetached(parent, 10*time.Millisecond, &timers)
	defer second.Release()
	select {
	case <-second.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed a minute after a 10ms deadline on a reused timer")
	}
	if err := first.Err(); err != nil {
		t.Fatalf("the released Ctx expired with its timer's next use: %v", err)
	}
}

// TestArmedSettleAllocations: a Done armed from a Timers whose timer was
// given back costs its channel only.
func TestArmedSettleAllocations(t *testing.T) {
	testutil.SkipUnderRace(t, "the timers come from a sync.Pool, which the race detector empties at random")
	var timers Timers
	parent := context.WithoutCancel(context.Background())
	var c Ctx
	allocs := testing.AllocsPerRun(100, func() {
		c = Ctx{}
		c.InitDetached(parent, time.Hour, &timers)
		c.Done()
		c.Release()
	})
	if allocs > 1 {
		t.Errorf("%.0f allocations per armed settle, want 1 (the done channel)", allocs)
	}
}

// TestNewAllocatesOnlyTheCtx: a settle that asks for no value and does not
// wait costs its Ctx alone; the parent is detached only when a Value needs
// it. No pool is involved, so this holds under the race detector as well.
func TestNewAllocatesOnlyTheCtx(t *testing.T) {
	parent := context.WithValue(context.Background(), settleCtxKey{}, "v")
	allocs := testing.AllocsPerRun(100, func() {
		c := New(parent, time.Hour)
		_ = c.Err()
		c.Release()
	})
	if allocs > 1 {
		t.Errorf("%.0f allocations per settle context, want 1 (the Ctx)", allocs)
	}
}
