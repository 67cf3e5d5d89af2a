// Scheduler on the Fake clock: no services.
package clock

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// queued is the number of jobs waiting in s's heap.
func queued(s *Scheduler) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jobs)
}

// waitQueued waits until n jobs are queued: the calls that just ran have
// returned and re-queued their jobs (or ended them).
func waitQueued(t *testing.T, s *Scheduler, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queued(s) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d jobs queued after 10s, want %d", queued(s), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSchedulerRepeat(t *testing.T) {
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
			s := NewScheduler(f)
			calls := make(chan time.Time, 10)
			n := 0
			var j Job
			s.Repeat(&j, 10*time.Second, func() bool {
				n++
				calls <- f.Now()
				return n != tt.limit
			})
			for i := 1; i <= tt.stops; i++ {
				if queued(s) != 1 {
					break // f ended it
				}
				f.Advance(10 * time.Second)
				if got := <-calls; !got.Equal(time.Unix(int64(10*i), 0)) {
					t.Fatalf("call %d at %v, want every 10s", i, got)
				}
				if i == tt.limit {
					waitQueued(t, s, 0) // f ended it
				} else {
					waitQueued(t, s, 1)
				}
			}
			j.Stop()
			f.Advance(time.Minute)
			j.running.Lock() // a call in flight has finished by now
			j.running.Unlock()
			if n != tt.want || len(calls) != 0 {
				t.Fatalf("f called %d times (%d more after Stop), want %d", n, len(calls), tt.want)
			}
			if queued(s) != 0 {
				t.Fatalf("%d jobs queued after Stop", queued(s))
			}
		})
	}
}

// Many jobs of different periods share one timer, and each runs exactly
// when due, whatever the order they were started and stopped in.
func TestSchedulerManyJobs(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			const jobs, steps = 12, 30
			f := NewFake(time.Unix(0, 0))
			s := NewScheduler(f)
			var mu sync.Mutex
			var got []string // "period@second"
			js := make([]Job, jobs+1)
			periods := rand.New(rand.NewPCG(seed, 0)).Perm(jobs)
			for _, p := range periods {
				p++ // job p runs every p seconds
				s.Repeat(&js[p], time.Duration(p)*time.Second, func() bool {
					mu.Lock()
					defer mu.Unlock()
					got = append(got, fmt.Sprintf("%d@%d", p, f.Now().Unix()))
					return true
				})
			}
			if w := f.Waiters(); w != 1 {
				t.Fatalf("%d timers for %d jobs, want one", w, jobs)
			}
			stopAt := jobs / 2 // job stopAt is stopped at that second, before it runs
			var want []string
			for sec := 1; sec <= steps; sec++ {
				live := jobs
				if sec >= stopAt {
					live--
				}
				if sec == stopAt {
					js[stopAt].Stop()
				}
				f.Advance(time.Second)
				for p := 1; p <= jobs; p++ {
					if sec%p == 0 && (p != stopAt || sec < stopAt) {
						want = append(want, fmt.Sprintf("%d@%d", p, sec))
					}
				}
				// The calls due have been made and their jobs re-queued.
				deadline := time.Now().Add(10 * time.Second)
				for {
					mu.Lock()
					n := len(got)
					mu.Unlock()
					if n == len(want) && queued(s) == live {
						break
					}
					if n > len(want) || time.Now().After(deadline) {
						t.Fatalf("after %ds: %d calls, want %d", sec, n, len(want))
					}
					time.Sleep(time.Millisecond)
				}
			}
			for p := 1; p <= jobs; p++ {
				js[p].Stop()
			}
			s.Stop()
			mu.Lock()
			defer mu.Unlock()
			slices.Sort(got)
			slices.Sort(want)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("calls:\n%v\nwant:\n%v", got, want)
			}
			if w := f.Waiters(); w != 0 {
				t.Fatalf("%d timers left after Stop", w)
			}
		})
	}
}

// Stop waits for a call in progress: once it returns, f neither runs nor
// is running.
func TestSchedulerStopWaitsForCall(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	s := NewScheduler(f)
	inside, release := make(chan struct{}), make(chan struct{})
	var running bool
	var j Job
	s.Repeat(&j, time.Second, func() bool {
		running = true
		close(inside)
		<-release
		running = false
		return true
	})
	f.Advance(time.Second)
	<-inside
	stopped := make(chan struct{})
	go func() { j.Stop(); close(stopped) }()
	close(release)
	<-stopped
	if running {
		t.Fatal("Stop returned while f was running")
	}
	if queued(s) != 0 {
		t.Fatal("the job was queued again after Stop")
	}
}

// A job stopped and repeated again (reused, as a worker reuses its lease
// job) runs its new f on the new period only: a call of the old repetition
// already taken off the heap when Stop came does nothing.
func TestSchedulerJobReuse(t *testing.T) {
	for i := range 50 {
		f := NewFake(time.Unix(0, 0))
		s := NewScheduler(f)
		var j Job
		var mu sync.Mutex
		var calls []string
		record := func(what string) func() bool {
			return func() bool {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, fmt.Sprintf("%s@%d", what, f.Now().Unix()))
				return true
			}
		}
		s.Repeat(&j, time.Second, record("old"))
		f.Advance(time.Second) // the old call is popped; it may or may not have run
		j.Stop()
		mu.Lock()
		before := len(calls)
		mu.Unlock()
		s.Repeat(&j, 10*time.Second, record("new"))
		f.Advance(9 * time.Second)
		waitQueued(t, s, 1)
		f.Advance(time.Second)
		waitQueued(t, s, 1)
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := len(calls)
			mu.Unlock()
			if n > before || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		j.Stop()
		mu.Lock()
		got := slices.Clone(calls)
		mu.Unlock()
		want := []string{"new@11"}
		if before == 1 {
			want = []string{"old@1", "new@11"}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: calls %v, want %v", i, got, want)
		}
	}
}

// RepeatAfter's first call comes after its own delay, the later ones every
// period after the previous call, as Repeat's.
func TestSchedulerRepeatAfter(t *testing.T) {
	for _, tt := range []struct {
		name  string
		first time.Duration
		want  []time.Duration // the first two calls, from the start
	}{
		{"sooner than the period", 3 * time.Second, []time.Duration{3 * time.Second, 13 * time.Second}},
		{"later than the period", 25 * time.Second, []time.Duration{25 * time.Second, 35 * time.Second}},
		{"overdue: at once", -time.Second, []time.Duration{0, 10 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(time.Unix(0, 0))
			s := NewScheduler(f)
			calls := make(chan time.Time, 10)
			var j Job
			s.RepeatAfter(&j, tt.first, 10*time.Second, func() bool { calls <- f.Now(); return true })
			defer j.Stop()
			for i, want := range tt.want {
				f.Advance(want - f.Now().Sub(time.Unix(0, 0)))
				if got := <-calls; got.Sub(time.Unix(0, 0)) != want {
					t.Fatalf("call %d at %v, want %v", i+1, got.Sub(time.Unix(0, 0)), want)
				}
				waitQueued(t, s, 1)
			}
		})
	}
}
