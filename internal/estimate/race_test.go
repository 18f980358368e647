//go:build race

package estimate

// raceEnabled: the race detector drops sync.Pool items at random, so allocation
// counts are not the program's.
const raceEnabled = true
