// Package buildinfo owns the version stamped into the binaries at build time:
//
//	go build -ldflags "-X nymph/buildinfo.Version=1.2.3" ./cmd/nymph
//
// Both nymph and lakeshore report it; nymph also sends it as
// versions.daemon on hello.
package buildinfo

// Version is overwritten by the linker; "dev" marks an unstamped build.
var Version = "dev"
