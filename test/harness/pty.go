package harness

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"nymph/test/wait"
)

// Terminal is the controlling side of a real pseudo-terminal: tests type
// into it and read what the program on the other side drew, as a person at
// a terminal would.
type Terminal struct {
	// PTY is the master; TTY the slave, the program's terminal (nil once a
	// child started with Start holds it).
	PTY, TTY *os.File

	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
}

// OpenTerminal opens a pseudo-terminal of rows x cols and starts reading
// everything drawn on it. Both ends close at test cleanup.
func OpenTerminal(t testing.TB, rows, cols uint16) *Terminal {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		t.Fatalf("size the pseudo-terminal: %v", err)
	}
	term := &Terminal{PTY: ptmx, TTY: tty, done: make(chan struct{})}
	go term.read()
	t.Cleanup(func() {
		if term.TTY != nil {
			_ = term.TTY.Close()
		}
		_ = ptmx.Close()
		<-term.done
	})
	return term
}

func (term *Terminal) read() {
	defer close(term.done)
	buf := make([]byte, 4096)
	for {
		n, err := term.PTY.Read(buf)
		term.mu.Lock()
		term.out.Write(buf[:n])
		term.mu.Unlock()
		if err != nil {
			// EIO: every slave descriptor is closed.
			return
		}
	}
}

// Type sends keys as the terminal would: "\r" is Enter, "\x03" Ctrl-C,
// "\x1b" Esc, "\x1b[B" the down arrow.
func (term *Terminal) Type(t testing.TB, keys string) {
	t.Helper()
	if _, err := io.WriteString(term.PTY, keys); err != nil && !errors.Is(err, os.ErrClosed) {
		t.Fatalf("type %q: %v", keys, err)
	}
}

// escapes are the terminal control sequences a program draws with: CSI
// (cursor moves, erases, modes), OSC (titles) and two-byte escapes.
var escapes = regexp.MustCompile(`\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]|\r`)

// Text is everything drawn so far, control sequences taken out; each
// redrawn line reads as it was drawn.
func (term *Terminal) Text() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return escapes.ReplaceAllString(term.out.String(), "\n")
}

// WaitFor waits until want is drawn at or after position from of Text and
// returns the position just past it, so a later wait reads only what was
// drawn since.
func (term *Terminal) WaitFor(t testing.TB, from int, want string) int {
	t.Helper()
	at := -1
	if !wait.Until(30*time.Second, func() bool {
		s := term.Text()
		if from > len(s) {
			return false
		}
		if i := strings.Index(s[from:], want); i >= 0 {
			at = from + i + len(want)
			return true
		}
		return false
	}) {
		t.Fatalf("the terminal never showed %q; it shows, past %d:\n%s", want, from, tail(term.Text(), from))
	}
	return at
}

func tail(s string, from int) string {
	if from > len(s) {
		return ""
	}
	return s[from:]
}

// TerminalCLI is the lakeshore binary running with its standard input and
// error on a Terminal (its controlling terminal, in a session of its own),
// as in an operator's shell; standard output is kept apart.
type TerminalCLI struct {
	*Terminal
	cmd    *exec.Cmd
	stdout bytes.Buffer
	done   chan struct{}
	result Result
}

// CLIOnTerminal starts `lakeshore args...` against cp on a new terminal of
// rows x cols. It is killed at test cleanup if it is still running.
func (cp *ControlPlane) CLIOnTerminal(t testing.TB, rows, cols uint16, args ...string) *TerminalCLI {
	t.Helper()
	c := &TerminalCLI{Terminal: OpenTerminal(t, rows, cols), done: make(chan struct{})}
	cmd, err := StartCmd(func() *exec.Cmd {
		cmd := exec.Command(cp.Bins.Lakeshore, args...)
		cmd.Env = append(cp.Env, "TERM=xterm-256color")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = c.TTY, &c.stdout, c.TTY
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		return cmd
	})
	if err != nil {
		t.Fatalf("start lakeshore %v: %v", args, err)
	}
	c.cmd = cmd
	// Only the child holds the terminal now, so the reader sees its end.
	_ = c.TTY.Close()
	c.TTY = nil
	go func() {
		defer close(c.done)
		err := cmd.Wait()
		c.result = Result{Stdout: c.stdout.String(), Code: cmd.ProcessState.ExitCode()}
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			c.result.Code = -1
		}
	}()
	t.Cleanup(func() { KillGroup(cmd.Process.Pid, c.done) })
	return c
}

// Signal sends sig to the program, unless it has exited already.
func (c *TerminalCLI) Signal(sig syscall.Signal) {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Signal(sig)
	}
}

// Wait waits for the program to exit and returns its exit code and
// standard output; Result.Stderr is what the terminal showed.
func (c *TerminalCLI) Wait(t testing.TB) Result {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("lakeshore still runs after 60 s; the terminal shows:\n%s", c.Text())
	}
	<-c.Terminal.done
	r := c.result
	r.Stderr = c.Text()
	return r
}

// Cooked reports whether the terminal is back in its usual line mode
// (canonical input, echo, signals from Ctrl-C), as a program that put it in
// raw mode must leave it.
func (term *Terminal) Cooked(t testing.TB) bool {
	t.Helper()
	tio, err := unix.IoctlGetTermios(int(term.PTY.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatalf("read the terminal's mode: %v", err)
	}
	const want = unix.ICANON | unix.ECHO | unix.ISIG
	return tio.Lflag&want == want
}
