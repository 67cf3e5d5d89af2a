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

func TestRepeat(t *testing.T) {
	tests := []struct {
		name  string
		limit int // f returns false on this call; 0 never
		stops int // calls after which the test calls Stop
		want  int
	}{
		{"stopped after three calls", 0, 3, 3},
		{"f ends it on its second call", 2, 5, 2},
		{"stopped before the first call", 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(time.Unix(0, 0))
			calls := make(chan time.Time, 10)
			n := 0
			r := Repeat(f, 10*time.Second, func() bool {
				n++
				calls <- f.Now()
				return n != tt.limit
			})
			for i := 1; i <= tt.stops; i++ {
				if f.Waiters() != 1 {
					break // f ended it
				}
				f.Advance(10 * time.Second)
				if got := <-calls; !got.Equal(time.Unix(int64(10*i), 0)) {
					t.Fatalf("call %d at %v, want every 10s", i, got)
				}
				waitRearmed(t, f, r)
			}
			r.Stop()
			f.Advance(time.Minute)
			r.mu.Lock() // a call in flight has finished by now
			r.mu.Unlock()
			if n != tt.want || len(calls) != 0 {
				t.Fatalf("f called %d times (%d more after Stop), want %d", n, len(calls), tt.want)
			}
			if f.Waiters() != 0 {
				t.Fatalf("Waiters = %d after Stop", f.Waiters())
			}
		})
	}
}

// waitRearmed waits until the call that just ran has returned, re-arming
// r's timer or ending the repetition.
func waitRearmed(t *testing.T, f *Fake, r *Repeater) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		done := r.stopped || f.Waiters() == 1
		r.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the repeater neither re-armed nor stopped within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Stop waits for a call in progress: once it returns, f neither runs nor
// is running.
func TestRepeaterStopWaitsForCall(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	inside, release := make(chan struct{}), make(chan struct{})
	var running bool
	r := Repeat(f, time.Second, func() bool {
		running = true
		close(inside)
		<-release
		running = false
		return true
	})
	f.Advance(time.Second)
	<-inside
	stopped := make(chan struct{})
	go func() { r.Stop(); close(stopped) }()
	close(release)
	<-stopped
	if running {
		t.Fatal("Stop returned while f was running")
	}
}
