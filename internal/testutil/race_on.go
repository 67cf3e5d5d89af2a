//go:build race

package testutil

// RaceEnabled reports a build with the race detector.
const RaceEnabled = true
