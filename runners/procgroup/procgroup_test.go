package procgroup_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"nymph/runners/procgroup"
	"nymph/test/wait"
	"nymph/timerslack"
)

func run(t *testing.T, ctx context.Context, c procgroup.Command) procgroup.Result {
	t.Helper()
	if c.Env == nil {
		c.Env = os.Environ()
	}
	res, err := procgroup.Run(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestExitCodeAndStderrTail(t *testing.T) {
	res := run(t, context.Background(), procgroup.Command{
		Argv: []string{"sh", "-c", "echo one >&2; echo two >&2; exit 4"},
	})
	if res.ExitCode != 4 || res.Stopped != procgroup.NotStopped {
		t.Fatalf("result %+v", res)
	}
	if got := string(res.StderrTail); got != "one\ntwo\n" {
		t.Fatalf("stderr tail %q", got)
	}
}

func TestStderrTailIsBounded(t *testing.T) {
	res := run(t, context.Background(), procgroup.Command{
		Argv: []string{"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2"},
	})
	if len(res.StderrTail) > 8<<10 || !strings.HasSuffix(string(res.StderrTail), "xEND\n") {
		t.Fatalf("tail of %d bytes ending %q", len(res.StderrTail), res.StderrTail[len(res.StderrTail)-10:])
	}
}

func TestStdinFromFile(t *testing.T) {
	in := t.TempDir() + "/in"
	if err := os.WriteFile(in, []byte("payload"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir() + "/out"
	res := run(t, context.Background(), procgroup.Command{Argv: []string{"sh", "-c", "cat > " + out}, Stdin: in})
	b, _ := os.ReadFile(out)
	if res.ExitCode != 0 || string(b) != "payload" {
		t.Fatalf("result %+v, stdin copy %q", res, b)
	}
}

func TestCancelRunsStopHookThenKillsGroup(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	var stopped atomic.Bool
	ready := make(chan struct{})
	go func() {
		<-ready
		cancel(errors.New("why"))
	}()
	res := run(t, ctx, procgroup.Command{
		Argv:      []string{"sh", "-c", "echo go; sleep 30"},
		Output:    writerFunc(func(p []byte) { closeOnce(ready, p) }),
		KillGrace: 200 * time.Millisecond,
		Stop:      func(context.Context) error { stopped.Store(true); return nil },
	})
	if res.Stopped != procgroup.Cancelled || res.Cause == nil || res.Cause.Error() != "why" || !stopped.Load() {
		t.Fatalf("result %+v, stop hook ran %v", res, stopped.Load())
	}
}

func TestDoneContextStartsNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	marker := t.TempDir() + "/started"
	res := run(t, ctx, procgroup.Command{Argv: []string{"touch", marker}})
	if res.Stopped != procgroup.Cancelled {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("command ran despite a done context")
	}
}

// A process that leaves the group (setsid) keeps the output pipe open;
// Run must still return, after a bounded drain.
func TestEscapedProcessDoesNotHangRun(t *testing.T) {
	marker := "procgroup-escape-" + t.Name()
	t.Cleanup(func() {
		pids, _ := procgroup.WithCmdline(marker)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	flag := t.TempDir() + "/escaped"
	start := time.Now()
	res := run(t, context.Background(), procgroup.Command{
		Argv: []string{"sh", "-c", "setsid sh -c 'touch " + flag + "; sleep 30; :' " + marker +
			" & while [ ! -e " + flag + " ]; do sleep 0.01; done; exit 0"},
	})
	if res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	if pids, _ := procgroup.WithCmdline(marker); len(pids) == 0 {
		t.Fatal("the escaped process is gone; the test proves nothing")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Run took %s", el)
	}
}

func TestMembersAndWaitGone(t *testing.T) {
	cmd := []string{"sh", "-c", "sleep 30 & sleep 30"}
	done := make(chan procgroup.Result, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		res, _ := procgroup.Run(ctx, procgroup.Command{Argv: cmd, Env: os.Environ(), KillGrace: time.Second})
		done <- res
	}()
	// Find the group by its unusual command line.
	var pgid int
	wait.For(t, 10*time.Second, "the leader", func() bool {
		pids, _ := procgroup.WithCmdline("sleep 30 & sleep 30")
		if len(pids) == 1 {
			pgid = pids[0]
		}
		return pgid != 0
	})
	wait.For(t, 10*time.Second, "the leader and two sleeps", func() bool {
		m, _ := procgroup.Members(pgid)
		return len(m) == 3
	})
	cancel()
	<-done
	if m, _ := procgroup.Members(pgid); len(m) != 0 {
		t.Fatalf("members left: %v", m)
	}
}

func TestInputAndSeparateCappedStreams(t *testing.T) {
	stdout := &procgroup.Capped{Limit: 4}
	stderr := &procgroup.Capped{Limit: 100}
	res := run(t, context.Background(), procgroup.Command{
		Argv:   []string{"sh", "-c", "cat; echo err >&2"},
		Input:  strings.NewReader("piped"),
		Stdout: stdout, Stderr: stderr,
	})
	if res.ExitCode != 0 || string(stdout.Bytes()) != "pipe" || !stdout.Truncated() ||
		string(stderr.Bytes()) != "err\n" || stderr.Truncated() {
		t.Fatalf("result %+v, stdout %q (%v), stderr %q (%v)", res, stdout.Bytes(), stdout.Truncated(), stderr.Bytes(), stderr.Truncated())
	}
}

func TestStartErrorSaysWhatFailed(t *testing.T) {
	_, err := procgroup.Run(context.Background(), procgroup.Command{Argv: []string{"no-such-program-here"}, Env: os.Environ()})
	var se *procgroup.StartError
	if !errors.As(err, &se) || !strings.HasPrefix(err.Error(), "procgroup: start no-such-program-here: ") {
		t.Fatalf("error %v", err)
	}
}

// A working directory that is not there is named as such, not reported as
// the program failing to exec.
func TestStartErrorNamesAMissingDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		"/nonexistent/dir": "procgroup: workdir: workdir /nonexistent/dir does not exist",
		file:               "procgroup: workdir: workdir " + file + " is not a directory",
	} {
		_, err := procgroup.Run(context.Background(), procgroup.Command{Argv: []string{"true"}, Dir: dir, Env: os.Environ()})
		var se *procgroup.StartError
		if !errors.As(err, &se) || err.Error() != want {
			t.Fatalf("dir %s: error %v, want %q", dir, err, want)
		}
	}
}

// A hard kill during the grace does not wait for the grace to run out.
func TestHardKillCutsTheGraceShort(t *testing.T) {
	ctx, abort := procgroup.WithKill(context.Background())
	ready := make(chan struct{})
	go func() {
		<-ready
		abort(errors.New("soft"), false)
		abort(errors.New("hard"), true)
	}()
	start := time.Now()
	res := run(t, ctx, procgroup.Command{
		Argv:      []string{"sh", "-c", "trap '' TERM; echo go; sleep 30"},
		Output:    writerFunc(func(p []byte) { closeOnce(ready, p) }),
		KillGrace: time.Minute,
	})
	if res.Stopped != procgroup.Cancelled || res.Cause == nil || res.Cause.Error() != "soft" {
		t.Fatalf("result %+v", res)
	}
	if el := time.Since(start); el > 30*time.Second {
		t.Fatalf("Run took %s: the hard kill waited for the grace", el)
	}
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

func closeOnce(ch chan struct{}, _ []byte) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// A command name may hold spaces and parentheses that look like the stat
// fields after it; Members must still read the real state and group.
func TestMembersReadsANameThatLooksLikeFields(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	bin := filepath.Join(t.TempDir(), "x) Z 1 1 (y")
	if err := os.Symlink(sleep, bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	m, err := procgroup.Members(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m[0] != pid {
		t.Fatalf("members of group %d: %v, want [%d]", pid, m, pid)
	}
}

// A leader that exits on its own, leaving a member of its group running
// with its output elsewhere (so the pipes say nothing of it): Run kills
// the member and returns only once it is gone.
func TestMemberLeftBehindIsKilledBeforeRunReturns(t *testing.T) {
	marker := "procgroup-left-" + t.Name()
	pidFile := filepath.Join(t.TempDir(), "pid")
	res := run(t, context.Background(), procgroup.Command{
		Argv: []string{"bash", "-c", "(exec -a " + marker + " sleep 30) >/dev/null 2>&1 </dev/null & " +
			"until grep -qs " + marker + " /proc/$!/cmdline; do :; done; echo $! > " + pidFile + "; exit 0"},
	})
	if res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil || strings.TrimSpace(string(b)) == "" {
		t.Fatalf("the member's pid was not written: %v", err)
	}
	if live, err := procgroup.WithCmdline(marker); err != nil || len(live) != 0 {
		t.Fatalf("member still alive after Run returned: %v (%v)", live, err)
	}
}

// A daemon that runs with a coarse timer slack (package timerslack) starts
// its commands with the slack it began with.
func TestTheChildKeepsTheSlackTheDaemonBeganWith(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("coarsening every thread's timer slack needs CAP_SYS_NICE (run as root)")
	}
	before, err := os.ReadFile("/proc/self/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := timerslack.Coarsen(20 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	res, err := procgroup.Run(context.Background(), procgroup.Command{
		Argv: []string{"cat", "/proc/self/timerslack_ns"}, Env: os.Environ(), Stdout: &out,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("run: %+v %v", res, err)
	}
	if got := strings.TrimSpace(out.String()); got != strings.TrimSpace(string(before)) && got != "50000" {
		t.Fatalf("the child's timer slack is %s ns; the process began with %s", got, strings.TrimSpace(string(before)))
	}
	if got := strings.TrimSpace(out.String()); got == "20000000" {
		t.Fatal("the child took the daemon's coarse slack")
	}
}
