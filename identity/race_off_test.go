//go:build !race

package identity

// raceDetector says the race detector is on; see race_on_test.go.
const raceDetector = false
