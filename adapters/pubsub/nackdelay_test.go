package pubsub_test

// A nack with a delay on pstest, through a Consumer: it holds the delivery
// (the Subscription is a driver.NackHolder), unsettled in the client, which
// keeps its lease, and nacks it when the delay has passed, or at once when
// its Run stops; the Consumer's Close leaves it to the Subscription's,
// which has the client nack it once its stream has closed.

import (
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/driver"
)

func openNackFixture(t *testing.T, ackExtension time.Duration) (*dpubsub.Topic, func() *dpubsub.Subscription) {
	t.Helper()
	srv := pstestServer()
	c := srv.client(t)
	f := srv.create(t.Context(), t, c, subConfig{})
	tp, err := dpubsub.OpenTopic(t.Context(), c, f.topic, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	open := func() *dpubsub.Subscription {
		sub, err := dpubsub.OpenSubscription(t.Context(), c, f.sub, &dpubsub.Options{AckExtension: ackExtension})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Close() })
		return sub
	}
	return tp, open
}

func TestNackDelayHeld(t *testing.T) {
	const lease = 2 * time.Second
	tp, open := openNackFixture(t, lease)
	// The delay is longer than the server's 1 s ack deadline: the
	// client's lease management must keep the message during the hold.
	adaptertest.NackHeld(t, adaptertest.HeldNack{Topic: tp, Sub: open(), Cap: lease}, 1800*time.Millisecond)
}

func TestNackDelayEndsWithRun(t *testing.T) {
	const lease = 10 * time.Second
	tp, open := openNackFixture(t, lease)
	adaptertest.NackHoldEndsWithRun(t, adaptertest.HeldNack{Topic: tp, Sub: open(), Cap: lease})
}

func TestNackDelayLeftToClose(t *testing.T) {
	const lease = 10 * time.Second
	tp, open := openNackFixture(t, lease)
	// A new Subscription counts attempts afresh: the redelivery's number
	// is not compared.
	adaptertest.NackHoldLeftToClose(t, adaptertest.HeldNack{Topic: tp, Sub: open(), Cap: lease},
		func() driver.Subscription { return open() })
}
