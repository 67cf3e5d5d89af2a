//go:build !race

package dedupq

const raceEnabled = false
