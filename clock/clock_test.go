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

func TestFakeAfterFunc(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	fired := make(chan time.Time, 3)
	f.AfterFunc(time.Second, func() { fired <- f.Now() })
	stopped := f.AfterFunc(time.Second, func() { fired <- time.Time{} })
	if !stopped.Stop() {
		t.Fatal("Stop of a pending AfterFunc should report true")
	}
	f.AfterFunc(0, func() { fired <- time.Unix(-1, 0) })
	if got := <-fired; !got.Equal(time.Unix(-1, 0)) {
		t.Fatalf("a zero AfterFunc ran with %v, want at once", got)
	}
	if f.Waiters() != 1 {
		t.Fatalf("Waiters = %d, want the one pending AfterFunc", f.Waiters())
	}
	f.Advance(999 * time.Millisecond)
	if f.Waiters() != 1 {
		t.Fatal("an AfterFunc fired before it was due")
	}
	f.Advance(time.Millisecond)
	if got := <-fired; !got.Equal(time.Unix(1, 0)) {
		t.Fatalf("AfterFunc ran at %v, want 1s", got)
	}
	if f.Waiters() != 0 {
		t.Fatalf("Waiters = %d after the AfterFunc fired", f.Waiters())
	}
	select {
	case <-fired:
		t.Fatal("a stopped AfterFunc ran")
	default:
	}
}

func TestRealAfterFunc(t *testing.T) {
	done := make(chan struct{})
	if tm := Real().AfterFunc(time.Millisecond, func() { close(done) }); tm.C() != nil {
		t.Error("an AfterFunc timer's C should be nil")
	}
	<-done
	if Real().AfterFunc(time.Hour, func() { t.Error("a stopped AfterFunc ran") }).Stop() != true {
		t.Error("Stop of a pending AfterFunc should report true")
	}
}
