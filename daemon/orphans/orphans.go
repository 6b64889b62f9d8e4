// Package orphans owns the cleanup of job processes that outlived a nymph
// killed without a chance to stop them (SIGKILL, OOM, power loss of the
// daemon alone). Each daemon marks its own environment with a value derived
// from its workdir before it spawns anything; every job process inherits the
// mark. At the next start the daemon kills every process still carrying its
// mark, so a crash leaves nothing running for longer than one restart.
//
// The sweep runs only once the daemon holds its workdir's lock (package
// workdirlock), which a live daemon holds for its whole life: every process
// carrying the mark then belongs to an incarnation that is dead, never to a
// second daemon running on the same workdir.
package orphans

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// EnvVar is the environment variable that carries the mark.
const EnvVar = "NYMPH_OWNER"

// Marker is the mark of the daemon whose workdir is workdir: the same
// workdir gives the same mark across restarts, and two daemons with their
// own workdirs never share one.
func Marker(workdir string) string {
	abs, err := filepath.Abs(workdir)
	if err != nil {
		abs = workdir
	}
	sum := sha256.Sum256([]byte(abs))
	return "nymph-" + hex.EncodeToString(sum[:12])
}

// Mark puts the mark in this process's environment, so every child spawned
// afterwards inherits it. Call it before anything is spawned.
func Mark(marker string) error {
	if err := os.Setenv(EnvVar, marker); err != nil {
		return fmt.Errorf("set %s: %w", EnvVar, err)
	}
	return nil
}

// Reap kills every process under procRoot (normally /proc) whose initial
// environment carries marker, except this process, together with the
// process group it leads. It returns the pids it signalled. Processes that
// vanish meanwhile, or whose environment cannot be read (another user's),
// are skipped.
func Reap(procRoot, marker string) ([]int, error) {
	// A zombie leader still names its group, whose members may live on.
	pids, err := scan(procRoot, EnvVar+"="+marker, true)
	if err != nil {
		return nil, err
	}
	var killed []int
	for _, pid := range pids {
		// A job leads its own process group; kill the group so helpers
		// it started go too, then the process itself in case it is not
		// a leader.
		if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			continue
		}
		killed = append(killed, pid)
	}
	return killed, nil
}

// WithEnv lists the live (not zombie) processes under procRoot, other than
// this one and init, whose initial environment holds the exact entry kv
// ("KEY=VALUE"). Processes that vanish meanwhile, or whose environment
// cannot be read, are skipped.
func WithEnv(procRoot, kv string) ([]int, error) {
	return scan(procRoot, kv, false)
}

func scan(procRoot, kv string, withZombies bool) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", procRoot, err)
	}
	want := []byte(kv)
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid <= 1 {
			continue
		}
		env, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "environ"))
		if err != nil || !hasEntry(env, want) || !withZombies && zombie(filepath.Join(procRoot, e.Name(), "stat")) {
			continue
		}
		out = append(out, pid)
	}
	return out, nil
}

// zombie reports whether the process whose stat file is at path has exited
// and waits to be reaped (state Z, after the parenthesised command name).
func zombie(path string) bool {
	stat, err := os.ReadFile(path)
	if err != nil {
		return true // gone
	}
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// hasEntry reports whether the NUL-separated environment block env holds
// the exact entry want.
func hasEntry(env, want []byte) bool {
	for _, kv := range bytes.Split(env, []byte{0}) {
		if bytes.Equal(kv, want) {
			return true
		}
	}
	return false
}
