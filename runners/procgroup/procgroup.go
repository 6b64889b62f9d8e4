// Package procgroup owns the lifetime of one child command and everything it
// spawns: the command runs as the leader of its own process group, its
// stdout and stderr are streamed as they are produced, a timeout or a
// cancelled context stops it (SIGTERM to the group, SIGKILL after a settle
// grace), and the group is killed when the leader exits so that orphaned
// grandchildren never outlive the run. A context made by WithKill can also
// ask for a hard kill: SIGKILL at once, even in the middle of the grace.
//
// The leader is not reaped until the group has been sent its last signal:
// while it is an unreaped zombie its pid cannot be reused, so signalling
// the group by that pid can never hit an unrelated process. After the
// reap the group is only probed (a null signal) and waited for.
package procgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"nymph/timerslack"

	"golang.org/x/sys/unix"
)

// DefaultKillGrace is how long a stopped group gets between SIGTERM and
// SIGKILL.
const DefaultKillGrace = 5 * time.Second

// StopReason says why a command did not end on its own.
type StopReason string

// Stop reasons.
const (
	NotStopped StopReason = ""
	Timeout    StopReason = "timeout"
	Cancelled  StopReason = "cancelled"
)

// stderrTailSize bounds the stderr kept for error messages.
const stderrTailSize = 8 << 10

// readSize is the size of each read from the child's stdout and stderr
// (the spec's 8 KiB reads).
const readSize = 8 << 10

// readerDrain bounds how long output readers may wait for the end of their
// pipe after the group is gone; only a process that left the group (setsid)
// can hold a pipe open that long. What is already in the pipe is read in
// any case (see stopReading).
const readerDrain = 2 * time.Second

// drainCap bounds what a stopped reader still reads, should whatever holds
// the pipe keep writing.
const drainCap = 1 << 20

// Command is one child command.
type Command struct {
	// Path, when set, is the program to run, Argv[0] being only its name;
	// "" looks Argv[0] up in $PATH, as exec.Command does.
	Path string
	Argv []string
	// Env is the complete environment of the child.
	Env []string
	Dir string
	// Stdin, when non-empty, is a file opened as the child's stdin;
	// otherwise stdin is /dev/null.
	Stdin string
	// Input, when non-nil, takes the place of Stdin: it is piped to the
	// child, whose stdin is closed at its end. An *os.File is the child's
	// stdin itself (os/exec hands it over): Run does not close it.
	Input io.Reader
	// Output, when non-nil, receives stdout and stderr as they arrive; it
	// must be safe for concurrent use.
	Output io.Writer
	// Stdout and Stderr, when non-nil, receive that stream alone as it
	// arrives (and Output still gets both). A writer that fails is
	// dropped rather than left to stall the child on a full pipe.
	Stdout, Stderr io.Writer
	// Timeout, when positive, bounds the run.
	Timeout time.Duration
	// KillGrace is the time between SIGTERM and SIGKILL; zero means
	// DefaultKillGrace.
	KillGrace time.Duration
	// Stop, when non-nil, runs first whenever the command is stopped early.
	// It is for what the process group does not own: a container, a batch
	// job. Its error is returned in Result.StopErr and does not prevent the
	// group from being killed.
	Stop func(ctx context.Context) error
	// Started, when non-nil, is called once the process exists, before
	// Run waits for it (not when it fails to start): for a caller with
	// something to do as soon as the command is under way.
	Started func()
}

// StartError is an error of a command that never started.
type StartError struct {
	// Step is what failed ("start bash", "stdout pipe").
	Step string
	Err  error
}

func (e *StartError) Error() string { return "procgroup: " + e.Step + ": " + e.Err.Error() }

func (e *StartError) Unwrap() error { return e.Err }

// checkDir says what is wrong with dir as a working directory, if
// anything. Go reports a chdir that fails in the child as a failure to
// exec the program ("fork/exec /usr/bin/bash: no such file or
// directory"), which names the wrong file; this names the directory.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("workdir %s does not exist", dir)
	case err != nil:
		return fmt.Errorf("workdir %s: %w", dir, err)
	case !st.IsDir():
		return fmt.Errorf("workdir %s is not a directory", dir)
	}
	return nil
}

// Result is how a command ended.
type Result struct {
	// ExitCode is the leader's exit status, or -1 when a signal ended it.
	ExitCode int
	// State is the leader's final state.
	State *os.ProcessState
	// Stopped is set when a timeout or cancellation ended the run.
	Stopped StopReason
	// Cause is context.Cause of the cancelled context when Stopped is
	// Cancelled.
	Cause error
	// StderrTail is the last few KiB of stderr.
	StderrTail []byte
	// StopErr is what Command.Stop returned, if it ran.
	StopErr error
}

// Run starts the command in its own process group and returns once the
// leader has exited and every process left in the group has been killed.
// An error means the command could not be started (a *StartError, but for
// an empty argv) or not be waited for. A context that is already done starts nothing and
// reports Cancelled.
func Run(ctx context.Context, c Command) (Result, error) {
	if len(c.Argv) == 0 {
		return Result{}, errors.New("procgroup: empty argv")
	}
	grace := c.KillGrace
	if grace <= 0 {
		grace = DefaultKillGrace
	}
	if ctx.Err() != nil {
		// Nothing to stop yet: do not start at all.
		return Result{ExitCode: -1, Stopped: Cancelled, Cause: context.Cause(ctx)}, nil
	}

	var cmd *exec.Cmd
	if c.Path != "" {
		cmd = &exec.Cmd{Path: c.Path, Args: c.Argv}
	} else {
		cmd = exec.Command(c.Argv[0], c.Argv[1:]...)
	}
	cmd.Stdin = c.Input
	if c.Input == nil {
		stdin, err := openStdin(c.Stdin)
		if err != nil {
			return Result{}, err
		}
		defer stdin.Close()
		cmd.Stdin = stdin
	}

	outR, outW, err := os.Pipe()
	if err != nil {
		return Result{}, &StartError{Step: "stdout pipe", Err: err}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return Result{}, &StartError{Step: "stderr pipe", Err: err}
	}

	cmd.Env = c.Env
	cmd.Dir = c.Dir
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The child gets the timer slack the daemon started with, not the
	// coarser one the daemon may run with (package timerslack).
	startErr := timerslack.Child(cmd.Start)
	// The child has its own copies now; the parent's write ends must go so
	// that the readers see EOF when the group is gone.
	outW.Close()
	errW.Close()
	if startErr != nil {
		outR.Close()
		errR.Close()
		if err := checkDir(c.Dir); err != nil {
			return Result{}, &StartError{Step: "workdir", Err: err}
		}
		return Result{}, &StartError{Step: "start " + c.Argv[0], Err: startErr}
	}
	pgid := cmd.Process.Pid
	if c.Started != nil {
		c.Started()
	}

	tail := &tailBuffer{max: stderrTailSize}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); copyOut(outR, c.Output, c.Stdout) }()
	go func() { defer readers.Done(); copyOut(errR, c.Output, c.Stderr, tail) }()

	exited := make(chan struct{})
	go func() {
		waitExitNoReap(pgid)
		close(exited)
	}()

	var timer <-chan time.Time
	if c.Timeout > 0 {
		t := time.NewTimer(c.Timeout)
		defer t.Stop()
		timer = t.C
	}

	res := Result{}
	select {
	case <-exited:
	case <-ctx.Done():
		res.Stopped = Cancelled
		res.Cause = context.Cause(ctx)
	case <-timer:
		res.Stopped = Timeout
	}
	if res.Stopped != NotStopped {
		if c.Stop != nil {
			// The stop hook must run even though ctx is done.
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace+10*time.Second)
			res.StopErr = c.Stop(stopCtx)
			cancel()
		}
		terminate(pgid, grace, hardKill(ctx))
	}
	// Orphans left behind by a leader that exited on its own die here too.
	// This is the last signal the group gets: the leader is reaped next.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-exited
	waitErr := cmd.Wait()
	// A pgid stays allocated while any process has it as its group, so
	// once the leader is reaped a null signal that finds no such group
	// proves it empty: the common end (nothing left behind) needs no scan
	// of /proc. Anything else, members dying of the SIGKILL above, is
	// waited for as before. Neither the null signal nor the scan sends
	// anything, so a pid reused meanwhile could at worst be waited on.
	if err := syscall.Kill(-pgid, 0); !errors.Is(err, syscall.ESRCH) {
		waitGone(pgid, grace, nil)
	}

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(readerDrain):
		// Something outside the group still holds a pipe; stop reading
		// once what is in it has been read.
		for _, r := range []*os.File{outR, errR} {
			if !stopReading(r) {
				r.Close()
			}
		}
		<-drained
	}
	outR.Close()
	errR.Close()

	res.State = cmd.ProcessState
	if res.State != nil {
		res.ExitCode = res.State.ExitCode()
	} else {
		res.ExitCode = -1
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return res, fmt.Errorf("procgroup: wait %s: %w", c.Argv[0], waitErr)
	}
	res.StderrTail = tail.Bytes()
	return res, nil
}

func openStdin(path string) (*os.File, error) {
	if path == "" {
		path = os.DevNull
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, &StartError{Step: "open stdin", Err: err}
	}
	return f, nil
}

// waitExitNoReap blocks until the process has exited, leaving it a zombie.
//
// It waits in the runtime's poller on a pidfd where the kernel offers a
// non-blocking one (Linux 5.10 and later). A goroutine blocked in waitid
// instead holds a thread in a syscall for the whole run, and while it does
// the runtime's monitor thread wakes every 20 µs: on a two-core host that
// was a quarter of the daemon's CPU per short exec, taken from the very
// command it was waiting for.
func waitExitNoReap(pid int) {
	if waitExitPolled(pid) {
		return
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil || !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// waitExitPolled is waitExitNoReap through a pidfd and the poller. It
// reports false, having waited for nothing, when that is not possible.
// The pid cannot have been reused: it is an unreaped child.
func waitExitPolled(pid int) bool {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	exited := false
	err = rc.Read(func(fd uintptr) bool {
		for {
			var info unix.Siginfo
			err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT, nil)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return false // still running: wait for the pidfd to be readable
			}
			// Exited, or an error no further wait would mend (ECHILD).
			exited = true
			return true
		}
	})
	return err == nil && exited
}

// terminate sends SIGTERM to the group, waits up to grace for its live
// members to exit, then sends SIGKILL and waits for them to be gone. A
// closed kill skips or cuts short the wait for SIGTERM to work.
func terminate(pgid int, grace time.Duration, kill <-chan struct{}) {
	select {
	case <-kill:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		if waitGone(pgid, grace, kill) {
			return
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	waitGone(pgid, grace, nil)
}

// waitGone waits up to limit, or until kill is closed, for no live
// (non-zombie) process to be left in the group, and reports whether that
// happened.
func waitGone(pgid int, limit time.Duration, kill <-chan struct{}) bool {
	deadline := time.Now().Add(limit)
	pause := time.Millisecond
	for {
		live, err := Members(pgid)
		if err == nil && len(live) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-kill:
			return false
		case <-time.After(pause):
		}
		if pause < 50*time.Millisecond {
			pause *= 2
		}
	}
}

// copyOut copies r to every sink until r ends, or until stopReading and
// then what was in the pipe by then; a sink that fails is dropped, so that
// it cannot stall the child on a full pipe.
func copyOut(r *os.File, sinks ...io.Writer) {
	buf := make([]byte, readSize)
	write := func(b []byte) {
		for i, w := range sinks {
			if w != nil {
				if _, werr := w.Write(b); werr != nil {
					sinks[i] = nil
				}
			}
		}
	}
	for {
		n, err := r.Read(buf)
		if n > 0 {
			write(buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			drainPending(r, buf, write)
			return
		}
		if err != nil {
			return
		}
	}
}

// stopReading makes the reader of r (copyOut) read what is in the pipe now
// and return, rather than wait for the end of the pipe. Closing r instead
// dropped output already written: a reader goroutine that the scheduler
// had not run yet (a loaded host) found the pipe closed, and an exec
// exited 0 with its stdout lost, which the chaos soak caught. It reports
// false when r takes no deadline (not a pollable pipe).
func stopReading(r *os.File) bool {
	return r.SetReadDeadline(time.Now()) == nil
}

// drainPending reads from r, without waiting, until the pipe is empty or
// ends (or drainCap bytes came), and hands each read to write.
func drainPending(r *os.File, buf []byte, write func([]byte)) {
	rc, err := r.SyscallConn()
	if err != nil || r.SetReadDeadline(time.Time{}) != nil {
		return
	}
	for total := 0; total < drainCap; {
		var n int
		var rerr error
		// The callback returns true: one read, no wait for readiness.
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf)
			return true
		}); err != nil || rerr != nil || n <= 0 {
			return
		}
		write(buf[:n])
		total += n
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

// Capped keeps the first Limit bytes written to it and notes whether more
// came; it never fails a write. Read it once Run has returned.
type Capped struct {
	Limit     int
	buf       []byte
	truncated bool
}

func (c *Capped) Write(p []byte) (int, error) {
	b := p
	if room := c.Limit - len(c.buf); len(b) > room {
		c.truncated = true
		b = b[:max(room, 0)]
	}
	c.buf = append(c.buf, b...)
	return len(p), nil
}

// Bytes is what was kept.
func (c *Capped) Bytes() []byte { return c.buf }

// Truncated reports whether more than Limit bytes were written.
func (c *Capped) Truncated() bool { return c.truncated }

type killKey struct{}

// WithKill returns a copy of parent that Run also watches for a hard kill,
// and the function that ends it: abort cancels the context with cause
// (the first cause given wins); hard, now or on a later call, also makes a
// Run stopping the command kill its group at once, without the grace or
// what is left of it.
func WithKill(parent context.Context) (ctx context.Context, abort func(cause error, hard bool)) {
	kill := make(chan struct{})
	var once sync.Once
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, killKey{}, kill))
	return ctx, func(cause error, hard bool) {
		cancel(cause)
		if hard {
			once.Do(func() { close(kill) })
		}
	}
}

// hardKill is the channel of the nearest WithKill, or nil.
func hardKill(ctx context.Context) <-chan struct{} {
	kill, _ := ctx.Value(killKey{}).(chan struct{})
	return kill
}
