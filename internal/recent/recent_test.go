// Pure in-memory logic: no services.
package recent

import (
	"fmt"
	"testing"
	"time"

	"github.com/dedupq/dedupq/window"
)

func win(d time.Duration) window.Window {
	return window.Window{Backend: "test", Duration: d, Kind: window.KindFixed}
}

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
		if got := s.Observe(step.id, t0.Add(step.at), win(w)); got != step.want {
			t.Errorf("Observe(%q) at %s = %v, want %v", step.id, step.at, got, step.want)
		}
	}
}

// An entity that does not deduplicate stores every send, whatever length
// its window reports (Service Bus keeps a DuplicateDetectionHistoryTimeWindow
// on entities without RequiresDuplicateDetection).
func TestNoProtectionNoDuplicate(t *testing.T) {
	t0 := time.Unix(0, 0)
	for _, tc := range []struct {
		name string
		w    window.Window
	}{
		{"zero length", win(0)},
		{"KindNone with a length", window.Window{Backend: "test", Duration: 10 * time.Minute, Kind: window.KindNone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s IDs
			for i := range 2 {
				if s.Observe("c", t0.Add(time.Duration(i)*time.Second), tc.w) {
					t.Errorf("send %d of the same ID reported as a duplicate under %v", i+1, tc.w)
				}
			}
			if s.Len() != 0 {
				t.Errorf("%d IDs remembered for a window that does not protect", s.Len())
			}
		})
	}
}

func TestBoundedForgetsOldestFirst(t *testing.T) {
	t0 := time.Unix(0, 0)
	s := IDs{Max: 100}
	for i := range 110 {
		s.Observe(fmt.Sprint(i), t0.Add(time.Duration(i)), win(time.Hour))
	}
	if s.Len() > 100 {
		t.Errorf("%d remembered, want at most 100", s.Len())
	}
	if s.Observe("109", t0.Add(200), win(time.Hour)) != true {
		t.Error("the newest ID was forgotten")
	}
	if s.Observe("0", t0.Add(200), win(time.Hour)) {
		t.Error("the oldest ID is still remembered past Max")
	}
}
