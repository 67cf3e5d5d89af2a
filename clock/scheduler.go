package clock

import (
	"sync"
	"time"
)

// Scheduler runs many periodic jobs (the lease extensions of the
// deliveries in flight) on a single timer of its Clock: starting and
// stopping a job costs a heap push and pop under a mutex, not a timer, a
// closure and a goroutine. The timer is armed for the earliest due job;
// each job due when it fires runs in its own goroutine, so that one slow
// job (a lease extension waiting on a broker) does not hold up the others.
// The zero value is not usable; call NewScheduler.
type Scheduler struct {
	c    Clock
	fire func() // s.run, bound once so that re-arming does not allocate it again

	mu   sync.Mutex
	jobs []*Job    // a min-heap on due
	t    Timer     // armed for at; nil when none is
	at   time.Time // when t fires
	done bool      // Stop was called: arm nothing more
}

// Job is one periodic job of a Scheduler. Its zero value is ready for
// Scheduler.Repeat; a Job can be embedded in its owner's struct and, once
// stopped, repeated again, so that a job set up per delivery allocates
// nothing.
type Job struct {
	s     *Scheduler
	every time.Duration
	f     func() bool
	due   time.Time
	i     int // 1 + its index in s.jobs, 0 when not queued; guarded by s.mu
	// gen counts the job's Repeat and Stop calls (guarded by s.mu), so that
	// a run popped from the heap before a Stop does nothing.
	gen uint64
	// running is held while f runs, so that Stop waits for a call in
	// progress.
	running sync.Mutex
}

// NewScheduler returns a Scheduler on c (nil means the real clock).
func NewScheduler(c Clock) *Scheduler {
	s := &Scheduler{c: Or(c)}
	s.fire = s.run
	return s
}

// Repeat calls f every d (each time d after the previous call returned,
// the first d from now) until f returns false or j.Stop is called. j must
// be new or stopped.
func (s *Scheduler) Repeat(j *Job, d time.Duration, f func() bool) {
	s.RepeatAfter(j, d, d, f)
}

// RepeatAfter is Repeat with the first call first from now (at once when
// first ≤ 0) rather than d: a job that takes over another's repetition
// (the lease of a delivery whose nack is held, renewed by a new job) keeps
// its rhythm instead of restarting it.
func (s *Scheduler) RepeatAfter(j *Job, first, d time.Duration, f func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j.s, j.every, j.f = s, d, f
	j.gen++
	j.due = s.c.Now().Add(max(first, 0))
	s.push(j)
	s.armLocked()
}

// Stop ends the repetition. It waits for a call of f in progress, so that
// none runs once Stop has returned; f must therefore not call Stop. Stop
// of a job never repeated, or already stopped, does nothing.
func (j *Job) Stop() {
	if j.s == nil {
		return
	}
	j.running.Lock()
	defer j.running.Unlock()
	s := j.s
	s.mu.Lock()
	defer s.mu.Unlock()
	j.gen++
	if j.i > 0 {
		s.remove(j.i - 1)
	}
	// Left armed when no job is left: it fires once for nothing, where
	// stopping it would make the next Repeat allocate a new timer.
}

// Stop stops s's timer and arms no other: the jobs still queued never run.
// Stop the jobs first to have their calls in progress waited for.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	if s.t != nil {
		s.t.Stop()
		s.t = nil
	}
}

// run is the timer's: it starts the jobs that are due and re-arms.
func (s *Scheduler) run() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.c.Now()
	if now.Before(s.at) {
		return // a timer that was replaced by an earlier one; the current one is armed
	}
	s.t = nil
	for len(s.jobs) > 0 && !s.jobs[0].due.After(now) {
		j := s.jobs[0]
		s.remove(0)
		go j.run(s, j.gen)
	}
	s.armLocked()
}

// run calls j.f once for the repetition gen, and queues the next call. It
// is given s rather than reading j.s, which a Repeat of a reused j writes.
func (j *Job) run(s *Scheduler, gen uint64) {
	j.running.Lock()
	defer j.running.Unlock()
	s.mu.Lock()
	live := j.gen == gen
	s.mu.Unlock()
	if !live || !j.f() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Stop waits for j.running, so the repetition is still gen's.
	j.due = s.c.Now().Add(j.every)
	s.push(j)
	s.armLocked()
}

// armLocked makes sure a timer fires by the earliest due job.
func (s *Scheduler) armLocked() {
	if len(s.jobs) == 0 || s.done {
		return
	}
	due := s.jobs[0].due
	if s.t != nil {
		if !s.at.After(due) {
			return
		}
		s.t.Stop()
	}
	s.t, s.at = s.c.AfterFunc(due.Sub(s.c.Now()), s.fire), due
}

// The heap, by hand rather than through container/heap: its interface
// boxes and calls through methods on every push and pop.

func (s *Scheduler) push(j *Job) {
	s.jobs = append(s.jobs, j)
	j.i = len(s.jobs)
	s.up(j.i - 1)
}

func (s *Scheduler) remove(i int) {
	last := len(s.jobs) - 1
	gone := s.jobs[i]
	if i != last {
		s.swap(i, last)
	}
	s.jobs[last] = nil
	s.jobs = s.jobs[:last]
	gone.i = 0
	if i != last {
		if !s.down(i) {
			s.up(i)
		}
	}
}

func (s *Scheduler) less(a, b int) bool { return s.jobs[a].due.Before(s.jobs[b].due) }

func (s *Scheduler) swap(a, b int) {
	s.jobs[a], s.jobs[b] = s.jobs[b], s.jobs[a]
	s.jobs[a].i, s.jobs[b].i = a+1, b+1
}

func (s *Scheduler) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (s *Scheduler) down(i int) bool {
	start := i
	for {
		c := 2*i + 1
		if c >= len(s.jobs) {
			break
		}
		if r := c + 1; r < len(s.jobs) && s.less(r, c) {
			c = r
		}
		if !s.less(c, i) {
			break
		}
		s.swap(i, c)
		i = c
	}
	return i > start
}
