// Package workdirlock owns the rule of one daemon per workdir: nymph holds
// an exclusive flock(2) on a lock file in its workdir for its whole life,
// taken before anything else touches the workdir. A second nymph started on
// the same workdir (the same config twice, `make run` twice) finds the lock
// held and stops at once, naming the holder's pid, which the file holds;
// without the lock its orphan sweep would kill the first one's jobs.
//
// The lock is tied to the open file, not to the pid: the kernel drops it
// when the holder dies, however it dies, so a stale file never blocks a
// restart. The descriptor is close-on-exec, so job processes never inherit
// it (a job that outlived a SIGKILLed daemon would otherwise keep the lock
// and block the restart that is to end it). Only across the daemon's own
// exec(2) of an update is it inherited, on purpose: InheritOnExec opens that
// window, and Acquire in the new image adopts the descriptor it finds.
package workdirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// FileName is the lock file's name in the workdir.
const FileName = "nymph.lock"

// HeldError is returned by Acquire when another process holds the lock.
type HeldError struct {
	Workdir string
	// PID is the holder's pid as its lock file says (0: not readable yet).
	PID int
}

func (e *HeldError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("another nymph (pid %d) is using workdir %s", e.PID, e.Workdir)
	}
	return fmt.Sprintf("another nymph is using workdir %s", e.Workdir)
}

// Lock is a held workdir lock.
type Lock struct {
	f    *os.File
	path string
}

// Acquire takes the lock of workdir, which must exist, without waiting.
// When another process holds it, it returns a *HeldError and has changed
// nothing. The lock file then holds this process's pid.
func Acquire(workdir string) (*Lock, error) {
	abs, err := filepath.Abs(workdir)
	if err != nil {
		abs = workdir
	}
	path := filepath.Join(abs, FileName)
	if l, err := adopt(path); err != nil || l != nil {
		return l, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("workdir lock: %w", err)
	}
	if err := flock(f); err != nil {
		var held *HeldError
		if errors.As(err, &held) {
			held.Workdir, held.PID = abs, readPID(f)
		}
		f.Close()
		return nil, err
	}
	l := &Lock{f: f, path: path}
	if err := l.writePID(); err != nil {
		l.Release()
		return nil, err
	}
	return l, nil
}

// adopt looks among this process's descriptors for one open on the lock
// file and not close-on-exec: one inherited across the exec of an update,
// which still holds the lock (this package's own descriptors are
// close-on-exec outside InheritOnExec). It returns nil when there is none.
func adopt(path string) (*Lock, error) {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return nil, nil // no file yet: nothing to inherit
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, nil
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Dev != want.Dev || st.Ino != want.Ino {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC != 0 {
			continue
		}
		// Still the holder? A descriptor on the file that does not hold
		// the lock is not ours to take (and not ours to close).
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
			continue
		}
		// Close-on-exec again: from here on only jobs are spawned.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("workdir lock: %w", err)
		}
		l := &Lock{f: os.NewFile(uintptr(fd), path), path: path}
		if err := l.writePID(); err != nil {
			return nil, err
		}
		return l, nil
	}
	return nil, nil
}

// flock takes the exclusive lock on f without blocking.
func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return &HeldError{}
		}
		return fmt.Errorf("workdir lock %s: %w", f.Name(), err)
	}
}

func (l *Lock) writePID() error {
	data := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("workdir lock: %w", err)
	}
	if _, err := l.f.WriteAt(data, 0); err != nil {
		return fmt.Errorf("workdir lock: %w", err)
	}
	return nil
}

// readPID reads the holder's pid from the lock file (0 when it has not
// written it yet).
func readPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Path is the lock file.
func (l *Lock) Path() string { return l.path }

// InheritOnExec lets the lock's descriptor survive the process's next
// exec(2), so the new image (the update) keeps the lock with no moment
// where another daemon could take it. Until restore is called no child
// process is spawned (it holds syscall.ForkLock, which every fork in Go
// takes), so no job can inherit the lock meanwhile. Call restore when the
// exec failed; after a successful exec nothing of this process is left.
func (l *Lock) InheritOnExec() (restore func(), err error) {
	syscall.ForkLock.Lock()
	fd := l.f.Fd()
	if _, err := unix.FcntlInt(fd, unix.F_SETFD, 0); err != nil {
		syscall.ForkLock.Unlock()
		return nil, fmt.Errorf("workdir lock: %w", err)
	}
	return func() {
		_, _ = unix.FcntlInt(fd, unix.F_SETFD, unix.FD_CLOEXEC)
		syscall.ForkLock.Unlock()
	}, nil
}

// Release drops the lock. The file stays: removing it would let a daemon
// that opened it a moment before lock a file no other daemon can see.
func (l *Lock) Release() error {
	return l.f.Close()
}
