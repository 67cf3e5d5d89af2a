//go:build race

package settlectx

// raceEnabled: the race detector drops sync.Pool items at random, so
// allocation counts that rely on a pool are not checked under it.
const raceEnabled = true
