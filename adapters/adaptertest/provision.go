package adaptertest

import (
	"slices"
	"testing"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// testProvision: a driver that creates broker state (driver.Provisioner)
// reports, before it creates anything, the window and the redelivery
// policy the broker will report afterwards — the startup check runs on
// those, so a refused open can leave nothing behind — and Provision may be
// called again. Drivers that create nothing have nothing to check.
func testProvision(t *testing.T, s *suite) {
	ent := s.open(t, DefaultConfig())
	t.Cleanup(func() { ent.Topic.Close(); ent.Subscription.Close() })
	ctx := t.Context()
	_, pt := ent.Topic.(driver.Provisioner)
	_, ps := ent.Subscription.(driver.Provisioner)
	if !pt && !ps {
		t.Skip("the driver creates nothing on the broker")
	}
	type state struct {
		topic, sub window.Window
		r          window.RedeliveryPolicy
	}
	read := func() state {
		var st state
		var err error
		if st.topic, err = ent.Topic.Window(ctx); err != nil {
			t.Fatalf("Topic.Window: %v", err)
		}
		if st.sub, err = ent.Subscription.Window(ctx); err != nil {
			t.Fatalf("Subscription.Window: %v", err)
		}
		if st.r, err = ent.Subscription.Redelivery(ctx); err != nil {
			t.Fatalf("Subscription.Redelivery: %v", err)
		}
		return st
	}
	provision := func(round int) {
		for _, d := range []any{ent.Topic, ent.Subscription} {
			if p, ok := d.(driver.Provisioner); ok {
				if err := p.Provision(ctx); err != nil {
					t.Fatalf("Provision of %T (round %d): %v", d, round, err)
				}
			}
		}
	}
	planned := read()
	provision(1)
	live := read()
	same := func(a, b window.Window) bool {
		return a.Backend == b.Backend && a.Kind == b.Kind && a.Duration == b.Duration
	}
	if !same(planned.topic, live.topic) || !same(planned.sub, live.sub) {
		t.Errorf("windows before Provision %v / %v, after %v / %v: the check ran on another window than the broker's",
			planned.topic, planned.sub, live.topic, live.sub)
	}
	if planned.r.Unlimited() != live.r.Unlimited() || (!live.r.Unlimited() && planned.r.MaxDeliveries != live.r.MaxDeliveries) ||
		planned.r.AckWait != live.r.AckWait || !slices.Equal(planned.r.Backoff, live.r.Backoff) {
		t.Errorf("redelivery before Provision %+v, after %+v: the check ran on another policy than the broker's", planned.r, live.r)
	}
	provision(2) // idempotent
}
