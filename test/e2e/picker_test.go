package e2e

import (
	"strings"
	"syscall"
	"testing"

	"nymph/lakeshore/cli"
	"nymph/test/harness"
)

// The daemon picker of `lakeshore exec CMD` on a real terminal, with real
// daemons: typing filters, Enter runs the command on the one chosen, and
// Ctrl-C or a SIGINT ends it at once with exit 130 and a word.
func TestExecPickerOnATerminal(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "picker-north"})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "picker-south"})

	term := cp.CLIOnTerminal(t, 24, 100, "exec", "echo", "ran on south")
	at := term.WaitFor(t, 0, "2 of 2 daemons")
	if term.Cooked(t) {
		t.Fatal("the terminal is in line mode while the picker shows; keys would wait for Enter")
	}
	term.Type(t, "south")
	at = term.WaitFor(t, at, "1 of 2 daemons")
	term.Type(t, "\r")
	term.WaitFor(t, at, "daemon: picker-south (")
	r := term.Wait(t)
	expectCode(t, r, 0)
	if r.Stdout != "ran on south\n" {
		t.Fatalf("stdout %q", r.Stdout)
	}

	// The first Ctrl-C ends it: the terminal is raw while the picker
	// shows, so it arrives as a key.
	term = cp.CLIOnTerminal(t, 24, 100, "exec", "echo", "never")
	at = term.WaitFor(t, 0, "2 of 2 daemons")
	term.Type(t, "\x03")
	r = term.Wait(t)
	expectCode(t, r, cli.ExitInterrupted)
	if r.Stdout != "" || !strings.Contains(r.Stderr[at:], "lakeshore: interrupted; no daemon chosen, nothing ran") {
		t.Fatalf("after Ctrl-C: stdout %q, terminal:\n%s", r.Stdout, r.Stderr[at:])
	}
	if !term.Cooked(t) {
		t.Fatal("the terminal was left raw")
	}

	// A SIGINT from elsewhere (kill -INT) ends it the same way, and gives
	// the terminal back as it was.
	term = cp.CLIOnTerminal(t, 24, 100, "exec", "echo", "never")
	at = term.WaitFor(t, 0, "2 of 2 daemons")
	term.Signal(syscall.SIGINT)
	r = term.Wait(t)
	expectCode(t, r, cli.ExitInterrupted)
	if !strings.Contains(r.Stderr[at:], "lakeshore: interrupted; no daemon chosen, nothing ran") {
		t.Fatalf("after SIGINT: terminal:\n%s", r.Stderr[at:])
	}
	if !term.Cooked(t) {
		t.Fatal("the terminal was left raw")
	}

	// A yes/no question reads a cooked terminal, where Ctrl-C is a
	// SIGINT: the first one ends it too, and nothing is killed.
	term = cp.CLIOnTerminal(t, 24, 100, "daemon", "kill", "--prefix", "picker-")
	at = term.WaitFor(t, 0, "Kill 2 daemons? [y/N]: ")
	term.Type(t, "\x03")
	r = term.Wait(t)
	expectCode(t, r, cli.ExitInterrupted)
	if !strings.Contains(r.Stderr[at:], "lakeshore: interrupted; nothing was done") {
		t.Fatalf("after Ctrl-C at the question: terminal:\n%s", r.Stderr[at:])
	}
	if ws := cp.Workers(t); len(ws) != 2 {
		t.Fatalf("%d workers left, want both: %+v", len(ws), ws)
	}
}
