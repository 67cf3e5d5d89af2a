//go:build !race

package settlectx

const raceEnabled = false
