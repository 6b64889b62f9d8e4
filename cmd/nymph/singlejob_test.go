package main_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/messages"
	"nymph/test/fakecp"
)

// A real nymph with keep_alive_s = 0 takes one job, polls no more once it
// has it, posts its outcome and exits 0, against a control plane that
// speaks the cursor and one that does not. The fake holds every empty poll
// open for ever: a daemon whose exit waited on a held poll would not exit.
func TestSingleJobDaemonTakesOneJobAndExits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		legacy bool
		run    bool
	}{
		{"cursor/exec", false, false},
		{"cursor/run", false, true},
		{"legacy/exec", true, false},
		{"legacy/run", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []fakecp.Option{fakecp.WithHoldForever()}
			if tc.legacy {
				opts = append(opts, fakecp.WithLegacyCursor())
			}
			cp := fakecp.New(t, opts...)
			cfg, _ := writeConfig(t, cp, "keep_alive_s = 0")
			d := start(t, nil, "run", "--config", cfg)
			cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
			if h := cp.Hellos(); len(h) != 1 || !h[0].SingleJob {
				t.Fatalf("hello %+v: want single_job", h)
			}
			var cmd string
			if tc.run {
				cmd = cp.QueueRun(messages.Run{InvocationID: "only", Script: ptr("echo done")})
			} else {
				cmd = cp.QueueExec(messages.Exec{ExecID: "only", Command: "echo done"})
			}
			if code := d.wait(20 * time.Second); code != 0 {
				t.Fatalf("exit %d", code)
			}
			n, ok := cp.DeliveredBy(cmd)
			if !ok {
				t.Fatal("the job was never delivered")
			}
			if got := len(cp.Polls()); got != n+1 {
				t.Fatalf("%d polls; the job came with poll %d and none may follow it", got, n+1)
			}
			route := fakecp.RouteResult
			if tc.run {
				route = fakecp.RouteAck
				acks := cp.Acks()
				if len(acks) != 1 || acks[0].InvocationID != "only" || acks[0].State != messages.StateSucceeded {
					t.Fatalf("acks %+v", acks)
				}
			} else if r, ok := cp.Result("only"); !ok || r.ExitCode != 0 || r.Stdout != "done\n" {
				t.Fatalf("result %+v %v", r, ok)
			}
			var posted time.Time
			for _, r := range cp.Requests() {
				if r.Route == route {
					posted = r.At
				}
			}
			t.Logf("single-job nymph (%s): outcome posted -> process exit: %v", tc.name, d.exitedAt.Sub(posted).Round(time.Millisecond))
		})
	}
}

// An old control plane sends a single-job nymph three jobs in one batch:
// the first runs, the other two get refusals (exec -1, run failed
// Refused), and nothing is dropped.
func TestSingleJobDaemonRefusesTheRestOfAnOldBatch(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithLegacyCursor(), fakecp.WithHoldForever())
	cp.QueueExec(messages.Exec{ExecID: "first", Command: "echo first"})
	cp.QueueExec(messages.Exec{ExecID: "second", Command: "echo second"})
	cp.QueueRun(messages.Run{InvocationID: "third", Script: ptr("echo third")})
	cfg, _ := writeConfig(t, cp, "keep_alive_s = 0")
	d := start(t, nil, "run", "--config", cfg)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if got := len(cp.Polls()); got != 1 {
		t.Fatalf("%d polls, want only the one that brought the batch", got)
	}
	if r, ok := cp.Result("first"); !ok || r.ExitCode != 0 || r.Stdout != "first\n" {
		t.Fatalf("first: %+v %v", r, ok)
	}
	r, ok := cp.Result("second")
	if !ok || r.ExitCode != messages.ExitFailed || r.Error == nil || r.Stdout != "" ||
		!strings.Contains(*r.Error, "single-job daemon (keep_alive_s = 0) already has its job (exec first)") {
		t.Fatalf("second: %+v %v", r, ok)
	}
	acks := cp.Acks()
	if len(acks) != 1 || acks[0].InvocationID != "third" || acks[0].State != messages.StateFailed ||
		acks[0].Error == nil || acks[0].Error.Type != messages.ErrorTypeRefused ||
		!strings.Contains(acks[0].Error.Message, "already has its job (exec first)") {
		t.Fatalf("third: %+v", acks)
	}
	for id, rs := range cp.Results() {
		if len(rs) != 1 {
			t.Fatalf("exec %s reported %d times", id, len(rs))
		}
	}
}

// A single-job nymph SIGKILLed while it runs its job: the next start
// reports that job as interrupted by the restart and exits 0 without
// saying hello, so it never takes a second job.
func TestRestartedSingleJobDaemonReportsItsJobAndExits(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithHoldForever())
	cfg, dir := writeConfig(t, cp, "keep_alive_s = 0")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	mark := newJobMark(t)
	pidFile := filepath.Join(dir, "job.pid")
	cp.QueueExec(messages.Exec{ExecID: "only", Command: fmt.Sprintf("echo $$ > %s; exec sleep 120", pidFile), Env: mark.env()})
	readPID(t, pidFile)
	mark.waitAsleep(t, 1)
	_ = d.cmd.Process.Kill() // nymph alone: its job leads a group of its own
	d.wait(10 * time.Second)
	hellos := len(cp.Hellos())

	d2 := start(t, nil, "run", "--config", cfg)
	if code := d2.wait(30 * time.Second); code != 0 {
		t.Fatalf("restarted single-job nymph exit %d:\n%s", code, d2.stderr.String())
	}
	r, ok := cp.Result("only")
	if !ok || r.ExitCode != messages.ExitFailed || r.Error == nil || !strings.Contains(*r.Error, "restart") {
		t.Fatalf("interrupted job reported %+v %v", r, ok)
	}
	if n := len(cp.Results()["only"]); n != 1 {
		t.Fatalf("the job was reported %d times", n)
	}
	if n := len(cp.Hellos()); n != hellos {
		t.Fatalf("the restarted single-job nymph said hello (%d hellos, %d before): it may take another job", n, hellos)
	}
	if pids := mark.pids(); len(pids) != 0 {
		t.Fatalf("the interrupted job's processes %v outlived the restart", pids)
	}
}
