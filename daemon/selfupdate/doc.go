// Package ota owns replacing the running nymph binary: the daemon side of the
// ota_update command.
//
// An update is two steps, kept separate so the daemon can drain in-flight
// work between them:
//
//  1. Install downloads the new binary into .nymph-ota-{pid}-{ulid}.tmp in
//     the directory of the running executable, hashing the raw bytes as they
//     arrive, and only when the sha256 matches (and the file is an executable
//     for this machine) chmods it to the current mode | 0o111, fsyncs it and
//     rename(2)s it over the executable. Any failure removes the temporary
//     file and leaves the running binary byte-for-byte untouched. Writing
//     next to the executable, never to /tmp, is what makes the rename atomic:
//     a crash leaves either the old binary or the new one, never a torn file.
//  2. Exec execve(2)s the executable path with the original argv and
//     environment, so the process keeps its PID and its parent (systemd, a
//     shell, a test harness) sees no restart.
//
// # Turning the self-exec off
//
// The spec gates the final exec on a build feature that is on by default.
// Here the same switch is a string set at link time:
//
//	go build -ldflags "-X nymph/daemon/selfupdate.selfExec=false" ./cmd/nymph
//
// or, equivalently, the build tag nymph_no_self_exec:
//
//	go build -tags nymph_no_self_exec ./cmd/nymph
//
// SelfExecDefault reports what the build chose; Options.DisableSelfExec
// turns it off at run time as well (never on). With the self-exec off,
// Install still replaces the file and Exec returns ErrSelfExecDisabled: the
// new version takes over at the next restart.
package selfupdate
