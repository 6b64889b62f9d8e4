package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/daemon/outbox"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

// readPID waits for a job to write its pid to file.
func readPID(t *testing.T, file string) int {
	t.Helper()
	var pid int
	wait.For(t, 30*time.Second, "a job to write "+file, func() bool {
		b, err := os.ReadFile(file)
		if err != nil {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	return pid
}

func lines(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// jobMark is an environment entry of a test's own, given to the jobs it
// starts: their processes are found by it, and killed by it at cleanup,
// never by a pid that may have been reused.
type jobMark struct{ key, value string }

func newJobMark(t *testing.T) jobMark {
	m := jobMark{"NYMPH_BIN_MARK", strconv.FormatInt(time.Now().UnixNano(), 36)}
	t.Cleanup(func() {
		for _, p := range m.pids() {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})
	return m
}

func (m jobMark) env() map[string]string { return map[string]string{m.key: m.value} }

// pids lists the live processes carrying the mark.
func (m jobMark) pids() []int {
	pids, _ := orphans.WithEnv("/proc", m.key+"="+m.value)
	return pids
}

// waitAsleep waits until n processes carry the mark, each of them a
// sleep: a job's shell has exec'd its sleep, and a process in the middle
// of that exec, which can read as unmarked for an instant, is not
// counted (nor missed by the next start's sweep).
func (m jobMark) waitAsleep(t *testing.T, n int) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%d marked jobs to be sleeping", n), func() bool {
		pids := m.pids()
		for _, p := range pids {
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err != nil || strings.TrimSpace(string(comm)) != "sleep" {
				return false
			}
		}
		return len(pids) == n
	})
}

// A nymph SIGKILLed while an exec and a run are going: the next start ends
// what they left, reports each once as interrupted by the restart, and
// does not run either again when its command comes a second time (as it
// does when the dead process never acknowledged it).
func TestRestartReportsInterruptedJobsOnce(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithLegacyCursor())
	cfg, dir := writeConfig(t, cp, "")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	mark := newJobMark(t)
	execPID, runPID, ran := filepath.Join(dir, "exec.pid"), filepath.Join(dir, "run.pid"), filepath.Join(dir, "ran")
	execCmd, _ := messages.EncodeCommand("cmd-exec", messages.KindExec, &messages.Exec{ExecID: "long-exec",
		Command: fmt.Sprintf("echo exec >> %s; echo $$ > %s; exec sleep 120", ran, execPID), Env: mark.env()})
	runCmd, _ := messages.EncodeCommand("cmd-run", messages.KindRun, &messages.Run{InvocationID: "long-run",
		Script:    ptr(fmt.Sprintf("echo run >> %s; echo $$ > %s; exec sleep 120", ran, runPID)),
		RunConfig: messages.RunConfig{Env: mark.env()}})
	cp.Queue(execCmd, runCmd)
	readPID(t, execPID)
	readPID(t, runPID)
	// By the jobs' mark, not their pids: a reaped pid may be another
	// process's by the time it is looked at.
	marked := func() int { return len(mark.pids()) }
	mark.waitAsleep(t, 2)

	_ = d.cmd.Process.Kill() // nymph alone: its jobs lead groups of their own
	d.wait(10 * time.Second)
	if n := marked(); n != 2 {
		t.Fatalf("%d of the jobs' 2 processes outlived the daemon; the test needs them all", n)
	}
	if _, ok := cp.Result("long-exec"); ok || len(cp.Acks()) != 0 {
		t.Fatal("an outcome was posted before the restart")
	}

	d2 := start(t, nil, "run", "--config", cfg)
	r := cp.WaitResult("long-exec", 30*time.Second)
	if r.ExitCode != messages.ExitFailed || r.Error == nil || !strings.Contains(*r.Error, "restart") {
		t.Fatalf("interrupted exec reported %+v (error %v)", r, r.Error)
	}
	cp.Wait(30*time.Second, "the interrupted run's ack", func() bool { return len(cp.Acks()) > 0 })
	a := cp.Acks()[0]
	if a.InvocationID != "long-run" || a.State != messages.StateFailed || a.Error == nil ||
		a.Error.Type != messages.ErrorTypeDaemonRestarted || !strings.Contains(a.Error.Message, "restart") {
		t.Fatalf("interrupted run acked %+v (error %+v)", a, a.Error)
	}
	wait.For(t, 10*time.Second, "the left-over jobs to be ended", func() bool { return marked() == 0 })

	// The same commands again, then a marker exec: once that one is done,
	// the poll that carried the repeats has been handled.
	cp.Queue(execCmd, runCmd)
	cp.QueueExec(messages.Exec{ExecID: "after", Command: "echo after", Env: map[string]string{}})
	if r := cp.WaitResult("after", 30*time.Second); r.ExitCode != 0 {
		t.Fatalf("after: %+v", r)
	}
	if n := lines(t, ran); n != 2 {
		t.Fatalf("the jobs ran %d times in all, want once each", n)
	}
	if n := len(cp.Results()["long-exec"]); n != 1 {
		t.Fatalf("the interrupted exec was reported %d times", n)
	}
	if n := len(cp.Acks()); n != 1 {
		t.Fatalf("%d acks, want the interrupted run's alone: %+v", n, cp.Acks())
	}
	out := d2.stderr.String()
	for _, line := range []string{"job was running when the previous process died",
		"exec already known; not run again", "invocation already known; not run again"} {
		if !strings.Contains(out, line) {
			t.Fatalf("no %q in the log:\n%s", line, out)
		}
	}
	_ = d2.cmd.Process.Signal(syscall.SIGTERM)
	if code := d2.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if open, err := outbox.ReadJournal(filepath.Join(dir, "work", "outbox")); err != nil || len(open) != 0 {
		t.Fatalf("journal left %+v %v", open, err)
	}
}

// Truncated and garbled outbox and journal files do not keep the daemon
// from starting: each is logged by name and set aside, and the daemon
// goes on working.
func TestCorruptFilesDoNotStopTheStart(t *testing.T) {
	cp := fakecp.New(t)
	cfg, dir := writeConfig(t, cp, "")
	box := filepath.Join(dir, "work", "outbox")
	if err := os.MkdirAll(box, 0o700); err != nil {
		t.Fatal(err)
	}
	bad := []string{filepath.Join(box, "0123abcd.msgpack"), filepath.Join(box, outbox.JournalFile)}
	if err := os.WriteFile(bad[0], []byte("\x83\xa3key\xa6exec:x\xa4pa"), 0o600); err != nil { // cut mid-write
		t.Fatal(err)
	}
	if err := os.WriteFile(bad[1], []byte{0, 0, 0, 90, 1, 2}, 0o600); err != nil { // a record torn mid-append
		t.Fatal(err)
	}
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	out := d.stderr.String()
	for _, p := range bad {
		if !strings.Contains(out, `"file":"`+p+`"`) || !strings.Contains(out, "set aside") {
			t.Fatalf("%s not logged by name:\n%s", p, out)
		}
		if p == bad[1] {
			// The journal starts again, clean.
			if open, err := outbox.ReadJournal(box); err != nil || len(open) != 0 {
				t.Fatalf("journal after the start: %+v %v", open, err)
			}
		} else if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s still in place", p)
		}
		if m, _ := filepath.Glob(p + ".corrupt-*"); len(m) != 1 {
			t.Fatalf("%s not set aside: %v", p, m)
		}
	}
	cp.QueueExec(messages.Exec{ExecID: "works", Command: "echo fine", Env: map[string]string{}})
	if r := cp.WaitResult("works", 20*time.Second); r.ExitCode != 0 || r.Stdout != "fine\n" {
		t.Fatalf("works: %+v", r)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// A second nymph on a workdir in use stops at once, names the first one's
// pid, and leaves the workdir as it was; the first one goes on.
func TestSecondNymphOnAWorkdirStopsAtOnce(t *testing.T) {
	cp := fakecp.New(t)
	cfg, dir := writeConfig(t, cp, "")
	first := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	work := filepath.Join(dir, "work")
	gate, started := filepath.Join(dir, "gate"), filepath.Join(dir, "started")
	cp.QueueExec(messages.Exec{ExecID: "long", Env: map[string]string{},
		Command: fmt.Sprintf("touch %s; while [ ! -e %s ]; do sleep 0.02; done; echo survived", started, gate)})
	wait.For(t, 20*time.Second, "the exec to start", func() bool { _, err := os.Stat(started); return err == nil })
	before := snapshot(t, work)
	hellos := len(cp.Hellos())

	second := start(t, nil, "run", "--config", cfg)
	if code := second.wait(10 * time.Second); code != 1 {
		t.Fatalf("second nymph exit %d, want 1:\n%s", code, second.stderr.String())
	}
	want := fmt.Sprintf("another nymph (pid %d) is using workdir %s", first.cmd.Process.Pid, work)
	if out := second.stderr.String(); !strings.Contains(out, want) {
		t.Fatalf("second nymph said %q, want %q", out, want)
	}
	if after := snapshot(t, work); after != before {
		t.Fatalf("the second nymph touched the workdir:\nbefore %s\nafter  %s", before, after)
	}
	if len(cp.Hellos()) != hellos {
		t.Fatal("the second nymph said hello")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if r := cp.WaitResult("long", 20*time.Second); r.ExitCode != 0 || r.Stdout != "survived\n" {
		t.Fatalf("the first nymph's exec: %+v", r)
	}
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	if code := first.wait(20 * time.Second); code != 0 {
		t.Fatalf("first nymph exit %d", code)
	}
}

// snapshot lists every path under dir with its size, mode and mtime.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %v %d; ", strings.TrimPrefix(p, dir), info.Size(), info.Mode(), info.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
