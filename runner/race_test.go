//go:build race

package runner_test

// raceEnabled: the race detector's shadow memory multiplies a process's
// RSS, so RSS bounds are measured without it.
const raceEnabled = true
