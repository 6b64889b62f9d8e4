package workdirlock

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the helper process of the tests below: with
// helperEnv set it takes the lock of the directory helperDir names and acts
// as helperEnv says, instead of running the tests.
const (
	helperEnv = "WORKDIRLOCK_HELPER"
	helperDir = "WORKDIRLOCK_DIR"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := helper(mode, os.Getenv(helperDir)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helper modes: "hold" takes the lock, says "locked PID" and holds it until
// stdin closes; "exec" takes it and execs this binary again in mode
// "adopted", which takes it once more (from the inherited descriptor), says
// "adopted PID cloexec=BOOL" and holds it until stdin closes.
func helper(mode, dir string) error {
	l, err := Acquire(dir)
	if err != nil {
		return err
	}
	switch mode {
	case "hold":
		fmt.Println("locked", os.Getpid())
	case "exec":
		if _, err := l.InheritOnExec(); err != nil {
			return err
		}
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, helperEnv+"=") {
				env = append(env, kv)
			}
		}
		return syscall.Exec("/proc/self/exe", os.Args, append(env, helperEnv+"=adopted"))
	case "adopted":
		flags, err := unix.FcntlInt(l.f.Fd(), unix.F_GETFD, 0)
		if err != nil {
			return err
		}
		fmt.Println("adopted", os.Getpid(), "cloexec="+strconv.FormatBool(flags&unix.FD_CLOEXEC != 0))
	default:
		return fmt.Errorf("unknown helper mode %q", mode)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return l.Release()
}

type helperProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	line  string
	done  chan struct{}
}

// startHelper runs the helper in mode on dir and returns once it printed
// its first line.
func startHelper(t *testing.T, mode, dir string) *helperProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperDir+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go func() { _ = cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		select {
		case <-h.done:
		default:
			_ = cmd.Process.Kill()
			<-h.done
		}
	})
	if err != nil {
		t.Fatalf("helper %s: %v (printed %q)", mode, err, line)
	}
	h.line = strings.TrimSpace(line)
	return h
}

// stop closes the helper's stdin and waits for it to exit.
func (h *helperProc) stop(t *testing.T) {
	t.Helper()
	h.stdin.Close()
	<-h.done
	if !h.cmd.ProcessState.Success() {
		t.Fatalf("helper exited %v", h.cmd.ProcessState)
	}
}

func expectHeld(t *testing.T, dir string, pid int) {
	t.Helper()
	l, err := Acquire(dir)
	var held *HeldError
	if !errors.As(err, &held) {
		if l != nil {
			l.Release()
		}
		t.Fatalf("Acquire while held: %v, want a HeldError", err)
	}
	want := fmt.Sprintf("another nymph (pid %d) is using workdir %s", pid, dir)
	if held.PID != pid || err.Error() != want {
		t.Fatalf("error %q (pid %d), want %q", err, held.PID, want)
	}
}

func expectFree(t *testing.T, dir string) {
	t.Helper()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire once free: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestSecondAcquireNamesTheHolder(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil || string(b) != strconv.Itoa(os.Getpid())+"\n" {
		t.Fatalf("lock file %q %v, want this pid", b, err)
	}
	// A second open of the file in the same process is another lock
	// holder to the kernel: refused too.
	expectHeld(t, dir, os.Getpid())
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	expectFree(t, dir)
}

func TestHeldByAnotherProcessUntilItDies(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, "hold", dir)
	if want := fmt.Sprintf("locked %d", h.cmd.Process.Pid); h.line != want {
		t.Fatalf("helper said %q, want %q", h.line, want)
	}
	before, _ := os.ReadFile(filepath.Join(dir, FileName))
	expectHeld(t, dir, h.cmd.Process.Pid)
	if after, _ := os.ReadFile(filepath.Join(dir, FileName)); string(after) != string(before) {
		t.Fatalf("a refused Acquire changed the lock file: %q -> %q", before, after)
	}
	// SIGKILL: the kernel drops the lock; the file, with the dead pid in
	// it, does not block the next daemon.
	_ = h.cmd.Process.Kill()
	<-h.done
	expectFree(t, dir)
}

func TestLockSurvivesTheExecOfAnUpdate(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, "exec", dir)
	want := fmt.Sprintf("adopted %d cloexec=true", h.cmd.Process.Pid)
	if h.line != want {
		t.Fatalf("after exec the helper said %q, want %q", h.line, want)
	}
	expectHeld(t, dir, h.cmd.Process.Pid)
	h.stop(t)
	expectFree(t, dir)
}

// Job processes do not inherit the lock: one that outlives its daemon
// must not keep the lock from the restart that is to end it.
func TestChildrenDoNotInheritTheLock(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "1000")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	expectFree(t, dir)
}

// A restore after a failed exec puts close-on-exec back.
func TestInheritOnExecRestore(t *testing.T) {
	l, err := Acquire(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	restore, err := l.InheritOnExec()
	if err != nil {
		t.Fatal(err)
	}
	if flags, _ := unix.FcntlInt(l.f.Fd(), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC != 0 {
		t.Fatal("still close-on-exec inside the exec window")
	}
	restore()
	if flags, _ := unix.FcntlInt(l.f.Fd(), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Fatal("not close-on-exec after restore")
	}
}
