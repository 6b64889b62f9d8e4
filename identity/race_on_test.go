//go:build race

package identity

// raceDetector says the race detector is on. It makes Ed25519 about ten
// times slower, so the flood test signs and verifies a tenth as much.
const raceDetector = true
