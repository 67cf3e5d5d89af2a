// Fake and real clocks: no services.
package clock

import (
	"testing"
	"time"
)

func TestFakeFiresInOrderOnlyWhenDue(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	late, early := f.NewTimer(2*time.Second), f.NewTimer(time.Second)
	stopped := f.NewTimer(time.Second)
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	if f.Waiters() != 2 {
		t.Fatalf("Waiters = %d, want 2", f.Waiters())
	}
	f.Advance(time.Second)
	select {
	case got := <-early.C():
		if !got.Equal(time.Unix(1, 0)) {
			t.Errorf("early fired at %v", got)
		}
	default:
		t.Fatal("the due timer did not fire")
	}
	select {
	case <-late.C():
		t.Fatal("a timer fired before it was due")
	default:
	}
	f.Advance(time.Second)
	<-late.C()
	if f.Waiters() != 0 {
		t.Errorf("Waiters = %d after all fired", f.Waiters())
	}
}

func TestSleep(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	done := make(chan struct{})
	if !Sleep(f, 0, done) {
		t.Error("a zero sleep with done open should complete")
	}
	close(done)
	if Sleep(f, time.Hour, done) || Sleep(Real(), 0, done) {
		t.Error("a sleep with done closed should report false")
	}
	if !Sleep(Real(), time.Millisecond, make(chan struct{})) {
		t.Error("a real 1ms sleep should complete")
	}
}
