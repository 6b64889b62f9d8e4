package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/localdaemon"
	"nymph/test/harness"
)

// onTerminal runs the CLI in-process with its stdin and stderr on a real
// pseudo-terminal, as `lakeshore exec` runs in an operator's shell; the
// result arrives once Main returns. A test that fails before then
// interrupts it, and waits, before the terminal closes.
func (c *realCP) onTerminal(t *testing.T, ctx context.Context, term *harness.Terminal, args ...string) <-chan result {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan result, 1)
	finished := make(chan struct{})
	t.Cleanup(func() {
		cancel()
		<-finished
	})
	go func() {
		defer close(finished)
		var stdout syncBuf
		stdout.b = &bytes.Buffer{}
		code := cli.Main(ctx, args, cli.Env{
			Stdin: term.TTY, Stdout: &stdout, Stderr: term.TTY,
			Getenv:   func(k string) string { return c.env[k] },
			StdinTTY: true, StderrTTY: true,
			Now:   time.Now,
			Procs: localdaemon.Scanner{Name: "no-such-daemon-name-for-tests"},
		})
		stdout.mu.Lock()
		defer stdout.mu.Unlock()
		done <- result{stdout: stdout.b.String(), code: code}
	}()
	return done
}

func awaitResult(t *testing.T, done <-chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("lakeshore did not return within 30 s")
		return result{}
	}
}

// A fleet larger than the screen: typing narrows the list word by word,
// and Enter runs the command on the one daemon left.
func TestPickerFiltersAndRunsOnTheChosenDaemon(t *testing.T) {
	cp := newRealCP(t)
	ids := map[string]string{}
	for i := range 40 {
		label := fmt.Sprintf("%s-node-%02d", []string{"east", "west"}[i%2], i/2)
		ids[label] = cp.hello(label, "x86_64")
	}
	cp.hello("gpu-rig", "x86_64")
	term := harness.OpenTerminal(t, 16, 120)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := cp.onTerminal(t, ctx, term, "exec", "hostname")

	// Ten rows fit. Ids are hex, so these words match labels only.
	at := term.WaitFor(t, 0, "Pick a daemon")
	at = term.WaitFor(t, at, "41 of 41 daemons, 31 more below")
	term.Type(t, "WEST")
	at = term.WaitFor(t, at, "20 of 41 daemons, 10 more below")
	term.Type(t, " node-1")
	at = term.WaitFor(t, at, "10 of 41 daemons")
	term.Type(t, "7")
	at = term.WaitFor(t, at, "1 of 41 daemons")
	term.Type(t, "\r")
	want := "west-node-17 (" + ids["west-node-17"] + ")"
	at = term.WaitFor(t, at, "daemon: "+want)
	// The exec is queued for that daemon, which never polls: the progress
	// line names it, and an interrupt cancels it.
	term.WaitFor(t, at, "waiting for "+want)
	cancel()
	r := awaitResult(t, done)
	if r.code != cli.ExitInterrupted {
		t.Fatalf("exit %d, want %d", r.code, cli.ExitInterrupted)
	}
	term.WaitFor(t, at, "on "+want+" is being cancelled")
}

// Ctrl-C ends the picker at the first press, with exit 130 and a word;
// Esc ends it too; the arrow keys move, a filter matching nothing says so,
// and backspace widens it again.
func TestPickerKeys(t *testing.T) {
	cp := newRealCP(t)
	ids := map[string]string{}
	for _, label := range []string{"alpha", "beta", "gamma"} {
		ids[label] = cp.hello(label, "x86_64")
	}

	t.Run("ctrl-c", func(t *testing.T) {
		term := harness.OpenTerminal(t, 24, 100)
		done := cp.onTerminal(t, context.Background(), term, "exec", "hostname")
		at := term.WaitFor(t, 0, "3 of 3 daemons")
		term.Type(t, "\x03")
		r := awaitResult(t, done)
		if r.code != cli.ExitInterrupted {
			t.Fatalf("exit %d, want %d", r.code, cli.ExitInterrupted)
		}
		term.WaitFor(t, at, "lakeshore: interrupted; no daemon chosen, nothing ran")
	})

	t.Run("esc", func(t *testing.T) {
		term := harness.OpenTerminal(t, 24, 100)
		done := cp.onTerminal(t, context.Background(), term, "exec", "hostname")
		at := term.WaitFor(t, 0, "3 of 3 daemons")
		term.Type(t, "\x1b")
		r := awaitResult(t, done)
		if r.code != cli.ExitExecCLIFailed {
			t.Fatalf("exit %d, want %d", r.code, cli.ExitExecCLIFailed)
		}
		term.WaitFor(t, at, "lakeshore: no daemon chosen (Esc)")
	})

	t.Run("arrows and backspace", func(t *testing.T) {
		term := harness.OpenTerminal(t, 24, 100)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := cp.onTerminal(t, ctx, term, "exec", "hostname")
		at := term.WaitFor(t, 0, "3 of 3 daemons")
		term.Type(t, "zzz")
		at = term.WaitFor(t, at, `no daemon matches "zzz"`)
		// Enter with nothing listed does nothing.
		term.Type(t, "\r\x7f\x7f\x7f")
		at = term.WaitFor(t, at, "3 of 3 daemons")
		term.Type(t, "\x1b[B\x1b[B")
		at = term.WaitFor(t, at, "> gamma")
		term.Type(t, "\x1b[A\r")
		want := "beta (" + ids["beta"] + ")"
		at = term.WaitFor(t, at, "daemon: "+want)
		term.WaitFor(t, at, "waiting for "+want)
		cancel()
		if r := awaitResult(t, done); r.code != cli.ExitInterrupted {
			t.Fatalf("exit %d", r.code)
		}
	})

	// Without a terminal there is no picker, as before.
	r := cp.run(runOpts{}, "exec", "hostname")
	if r.code != cli.ExitExecCLIFailed || !strings.Contains(r.stderr, "pass --queue") {
		t.Fatalf("no terminal: %+v", r)
	}
}
