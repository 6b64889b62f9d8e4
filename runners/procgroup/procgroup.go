// Package procgroup owns the lifetime of one child command and everything it
// spawns: the command runs as the leader of its own process group, its
// stdout and stderr are streamed as they are produced, a timeout or a
// cancelled context stops it (SIGTERM to the group, SIGKILL after a settle
// grace), and the group is killed when the leader exits so that orphaned
// grandchildren never outlive the run.
//
// The leader is not reaped until the group has been killed: while it is an
// unreaped zombie its pid cannot be reused, so signalling the group by that
// pid can never hit an unrelated process.
package procgroup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

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

// readerDrain bounds how long output readers may run after the group is
// gone; only a process that left the group (setsid) can hold a pipe open
// that long.
const readerDrain = 2 * time.Second

// Command is one child command.
type Command struct {
	Argv []string
	// Env is the complete environment of the child.
	Env []string
	Dir string
	// Stdin, when non-empty, is a file opened as the child's stdin;
	// otherwise stdin is /dev/null.
	Stdin string
	// Output, when non-nil, receives stdout and stderr as they arrive; it
	// must be safe for concurrent use.
	Output io.Writer
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
// An error means the command could not be started. A context that is
// already done starts nothing and reports Cancelled.
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

	stdin, err := openStdin(c.Stdin)
	if err != nil {
		return Result{}, err
	}
	defer stdin.Close()

	outR, outW, err := os.Pipe()
	if err != nil {
		return Result{}, fmt.Errorf("procgroup: stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return Result{}, fmt.Errorf("procgroup: stderr pipe: %w", err)
	}

	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = c.Env
	cmd.Dir = c.Dir
	cmd.Stdin = stdin
	cmd.Stdout = outW
	cmd.Stderr = errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	startErr := cmd.Start()
	// The child has its own copies now; the parent's write ends must go so
	// that the readers see EOF when the group is gone.
	outW.Close()
	errW.Close()
	if startErr != nil {
		outR.Close()
		errR.Close()
		return Result{}, fmt.Errorf("procgroup: start %s: %w", c.Argv[0], startErr)
	}
	pgid := cmd.Process.Pid

	tail := &tailBuffer{max: stderrTailSize}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() { defer readers.Done(); copyOut(outR, c.Output, nil) }()
	go func() { defer readers.Done(); copyOut(errR, c.Output, tail) }()

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
		Terminate(pgid, grace)
	}
	// Orphans left behind by a leader that exited on its own die here too.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-exited
	WaitGone(pgid, grace)

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(readerDrain):
		// Something outside the group still holds a pipe; stop reading.
		outR.Close()
		errR.Close()
		<-drained
	}
	outR.Close()
	errR.Close()

	waitErr := cmd.Wait()
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
		return nil, fmt.Errorf("procgroup: open stdin: %w", err)
	}
	return f, nil
}

// waitExitNoReap blocks until the process has exited, leaving it a zombie.
func waitExitNoReap(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil || !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// Terminate sends SIGTERM to the group, waits up to grace for its live
// members to exit, then sends SIGKILL and waits for them to be gone.
func Terminate(pgid int, grace time.Duration) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	if !WaitGone(pgid, grace) {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		WaitGone(pgid, grace)
	}
}

// WaitGone waits up to limit until no live (non-zombie) process is left in
// the group, and reports whether that happened.
func WaitGone(pgid int, limit time.Duration) bool {
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
		time.Sleep(pause)
		if pause < 50*time.Millisecond {
			pause *= 2
		}
	}
}

func copyOut(r *os.File, out io.Writer, tail *tailBuffer) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if out != nil {
				// A failing sink must not stall the child on a full pipe.
				if _, werr := out.Write(buf[:n]); werr != nil {
					out = nil
				}
			}
			if tail != nil {
				tail.Write(buf[:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
}

func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}
