package testutil

import "testing"

// RaceMarker starts the reason SkipUnderRace gives. internal/testall finds
// the tests that skipped with it and runs them again without the race
// detector, so that they count as passed only where they ran.
const RaceMarker = "runs without the race detector, as testall runs it again: "

// SkipUnderRace skips t when the race detector is on, saying why. For
// checks the detector makes meaningless, such as allocation counts that
// rely on a sync.Pool (the detector drops pooled items at random): testall
// runs every such test a second time without it.
func SkipUnderRace(t testing.TB, why string) {
	t.Helper()
	if RaceEnabled {
		t.Skip(RaceMarker + why)
	}
}
