// Pure in-memory logic: no services.
package recent

import (
	"fmt"
	"testing"
	"time"
)

func TestObserve(t *testing.T) {
	const w = 5 * time.Minute
	t0 := time.Unix(0, 0)
	var s IDs
	for _, step := range []struct {
		id   string
		at   time.Duration
		want bool
	}{
		{"a", 0, false},
		{"a", time.Second, true},
		{"b", time.Minute, false},
		{"a", w - time.Nanosecond, true},
		{"a", w, false}, // forgotten with the window; seen anew
		{"b", w, true},
		{"", w, false},
		{"", w, false},
	} {
		if got := s.Observe(step.id, t0.Add(step.at), w); got != step.want {
			t.Errorf("Observe(%q) at %s = %v, want %v", step.id, step.at, got, step.want)
		}
	}
	if s.Observe("c", t0, 0) || s.Observe("c", t0, 0) {
		t.Error("with no window nothing is a duplicate")
	}
}

func TestBoundedForgetsOldestFirst(t *testing.T) {
	t0 := time.Unix(0, 0)
	s := IDs{Max: 100}
	for i := range 110 {
		s.Observe(fmt.Sprint(i), t0.Add(time.Duration(i)), time.Hour)
	}
	if s.Len() > 100 {
		t.Errorf("%d remembered, want at most 100", s.Len())
	}
	if s.Observe("109", t0.Add(200), time.Hour) != true {
		t.Error("the newest ID was forgotten")
	}
	if s.Observe("0", t0.Add(200), time.Hour) {
		t.Error("the oldest ID is still remembered past Max")
	}
}
