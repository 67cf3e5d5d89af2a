package servicebus_test

// The session Subscription over fakes of the SDK's session receiver (no
// broker): when it renews a session's lock itself, and what a failed
// settlement does to the session.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/dedupq/dedupq/adapters/servicebus"
)

// fakeSession is one accepted session holding msgs.
type fakeSession struct {
	id       string
	lock     time.Duration
	mu       sync.Mutex
	msgs     []*azservicebus.ReceivedMessage
	until    time.Time
	renewals atomic.Int64
	closed   atomic.Bool
	failAck  bool
}

func (f *fakeSession) SessionID() string { return f.id }
func (f *fakeSession) LockedUntil() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.until
}

func (f *fakeSession) ReceiveMessages(ctx context.Context, _ int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	f.mu.Lock()
	if len(f.msgs) > 0 {
		m := f.msgs[0]
		f.msgs = f.msgs[1:]
		f.mu.Unlock()
		return []*azservicebus.ReceivedMessage{m}, nil
	}
	f.mu.Unlock()
	<-ctx.Done()
	return nil, ctx.Err()
}

func (f *fakeSession) CompleteMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.CompleteMessageOptions) error {
	if f.failAck {
		return errors.New("the settlement's answer was lost")
	}
	return nil
}

func (f *fakeSession) AbandonMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.AbandonMessageOptions) error {
	return nil
}

func (f *fakeSession) DeadLetterMessage(context.Context, *azservicebus.ReceivedMessage, *azservicebus.DeadLetterOptions) error {
	return nil
}

func (f *fakeSession) RenewSessionLock(context.Context, *azservicebus.RenewSessionLockOptions) error {
	f.renewals.Add(1)
	f.mu.Lock()
	f.until = time.Now().Add(f.lock)
	f.mu.Unlock()
	return nil
}

func (f *fakeSession) Close(context.Context) error {
	f.closed.Store(true)
	return nil
}

// fakeAcceptor hands out its sessions in turn, then waits.
type fakeAcceptor struct {
	sessions chan *fakeSession
}

func (a *fakeAcceptor) AcceptNext(ctx context.Context) (servicebus.SessionReceiver, error) {
	select {
	case s := <-a.sessions:
		return s, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (a *fakeAcceptor) Close(context.Context) error { return nil }

func openFakeSessions(t *testing.T, lock time.Duration, sessions ...*fakeSession) (*servicebus.Subscription, *fakeAcceptor) {
	t.Helper()
	acc := &fakeAcceptor{sessions: make(chan *fakeSession, len(sessions)+1)}
	for _, s := range sessions {
		s.lock = lock
		s.until = time.Now().Add(lock)
		acc.sessions <- s
	}
	p := servicebus.EntityProperties{RequiresSession: true, LockDuration: lock, MaxDeliveryCount: 10}
	sub, err := servicebus.OpenSessionSubscriptionWith(t.Context(), acc, servicebus.Entity{Queue: "q"}, &servicebus.Options{Stated: &p, SessionIdle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	return sub, acc
}

func msg(id string) *azservicebus.ReceivedMessage {
	return &azservicebus.ReceivedMessage{MessageID: id, DeliveryCount: 1}
}

// TestSessionLockRenewedOnlyWhileNothingIsOut: the Subscription keeps an
// idle session's lock itself, but not while a delivery of it is out: then
// only the Consumer's extensions keep it, so a delivery the Consumer stops
// extending lets the session go, as the Consumer counts on.
func TestSessionLockRenewedOnlyWhileNothingIsOut(t *testing.T) {
	const lock = 200 * time.Millisecond
	fs := &fakeSession{id: "g", msgs: []*azservicebus.ReceivedMessage{msg("m1")}}
	sub, _ := openFakeSessions(t, lock, fs)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if err != nil || len(ds) != 1 {
		t.Fatalf("Receive = %d, %v", len(ds), err)
	}
	if ds[0].Message.GroupKey != "g" || ds[0].Lease <= 0 || ds[0].Lease > lock || ds[0].Received.IsZero() {
		t.Errorf("delivery group %q lease %s received %v, want g, at most the session lock, and when it arrived", ds[0].Message.GroupKey, ds[0].Lease, ds[0].Received)
	}
	before := fs.renewals.Load()
	// Five lock durations with the delivery out: a renewal in them would be
	// the Subscription's own. The wait can only hide a wrong renewal that
	// comes later still, never fail a right Subscription.
	time.Sleep(5 * lock)
	if n := fs.renewals.Load() - before; n != 0 {
		t.Errorf("%d renewals while the delivery was out and the Consumer did not extend it, want 0", n)
	}
	if err := sub.Extend(ctx, ds[0], lock); err != nil || fs.renewals.Load() != before+1 {
		t.Errorf("Extend = %v with %d renewals, want one renewal of the session lock", err, fs.renewals.Load()-before)
	}
	if err := sub.Ack(ctx, ds[0]); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * lock)
	for fs.renewals.Load() < before+3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals in %s after the ack, want the idle session's lock kept", fs.renewals.Load()-before-1, 10*lock)
		}
		time.Sleep(lock / 10)
	}
}

// TestSessionLetGoAfterFailedSettle: a settlement whose answer is lost
// leaves the message's state unknown, so the session is closed (Service
// Bus gives its unsettled messages back, in order, to its next holder)
// rather than its next message handed out, and the Subscription takes
// another session.
func TestSessionLetGoAfterFailedSettle(t *testing.T) {
	first := &fakeSession{id: "a", msgs: []*azservicebus.ReceivedMessage{msg("a1"), msg("a2")}, failAck: true}
	sub, acc := openFakeSessions(t, time.Minute, first)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ds, err := sub.Receive(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].Message.ID != "a1" {
		t.Fatalf("Receive = %v, %v; want a1", ds, err)
	}
	if err := sub.Ack(ctx, ds[0]); err == nil {
		t.Fatal("Ack succeeded; the fake fails it")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !first.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the session was not closed within 5s of its failed settlement")
		}
		time.Sleep(10 * time.Millisecond)
	}
	second := &fakeSession{id: "b", msgs: []*azservicebus.ReceivedMessage{msg("b1")}, lock: time.Minute, until: time.Now().Add(time.Minute)}
	acc.sessions <- second
	ds, err = sub.Receive(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].Message.ID != "b1" {
		t.Fatalf("Receive after the failed settlement = %v, %v; want b1 from the next session", ds, err)
	}
}
