package actors_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/actors"
	"nymph/messages"
	"nymph/test/fakecp"
)

func singleJob(s *actors.Settings) { s.Poll.KeepAlive = 0 }

// A single-job daemon runs setups as they come, takes its one job, polls no
// more, and exits once the job's result is handed over, with a server that
// speaks the cursor and with one that does not. The fake holds empty polls
// forever, so a daemon that waited for a held poll would never exit.
func TestSingleJobStopsPollingOnceItHasItsJob(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []fakecp.Option
	}{
		{"cursor", []fakecp.Option{fakecp.WithHoldForever()}},
		{"legacy", []fakecp.Option{fakecp.WithHoldForever(), fakecp.WithLegacyCursor()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, setup{cpOpts: tc.opts, settings: singleJob})
			h.waitPolls(1)
			// A setup is not the job: the daemon keeps polling after it.
			mark := filepath.Join(h.workdir, "setup-ran")
			h.cp.QueueSetup(messages.Setup{Script: "touch " + mark})
			h.cp.Wait(10*time.Second, "the setup to run and a poll after it", func() bool {
				_, err := os.Stat(mark)
				return err == nil && h.d.SetupQueue().Idle() && len(h.cp.Polls()) >= 3
			})
			cmd := h.exec("only", "echo done")
			if err := h.wait(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			n, ok := h.cp.DeliveredBy(cmd)
			if !ok {
				t.Fatal("the exec was never delivered")
			}
			if got := len(h.cp.Polls()); got != n+1 {
				t.Fatalf("%d polls; the exec came with poll %d and none may follow it", got, n+1)
			}
			if r := h.cp.WaitResult("only", 10*time.Second); r.ExitCode != 0 || r.Stdout != "done\n" {
				t.Fatalf("result %+v", r)
			}
			if job := h.d.PollerState().SingleJob(); job != "exec only" {
				t.Fatalf("single job %q", job)
			}
		})
	}
}

// An old control plane may send a single-job daemon several jobs in one
// batch: it runs the first, refuses the others with an outcome each, and
// handles the other commands of the batch (a setup) as usual.
func TestSingleJobRefusesTheOtherJobsOfItsBatch(t *testing.T) {
	h := newHarness(t, setup{cpOpts: []fakecp.Option{fakecp.WithLegacyCursor(), fakecp.WithHoldForever()},
		settings: singleJob, noStart: true})
	mark := filepath.Join(h.workdir, "setup-ran")
	h.exec("first", "echo first")
	h.exec("second", "echo second")
	h.cp.QueueSetup(messages.Setup{Script: "touch " + mark})
	h.cp.QueueRun(messages.Run{InvocationID: "third", RunConfig: messages.RunConfig{Runner: ptr("echo")}})
	if err := h.d.Start(); err != nil {
		t.Fatal(err)
	}
	if err := h.wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := len(h.cp.Polls()); got != 1 {
		t.Fatalf("%d polls, want the one that brought the batch", got)
	}
	if r := h.cp.WaitResult("first", 10*time.Second); r.ExitCode != 0 || r.Stdout != "first\n" {
		t.Fatalf("first: %+v", r)
	}
	r := h.cp.WaitResult("second", 10*time.Second)
	if r.ExitCode != messages.ExitFailed || !strings.Contains(errOf(r), "single-job daemon") ||
		!strings.Contains(errOf(r), "exec first") || r.Stdout != "" {
		t.Fatalf("second: %+v (%s)", r, errOf(r))
	}
	h.cp.Wait(10*time.Second, "the run's ack", func() bool { return len(h.cp.Acks()) == 1 })
	a := h.cp.Acks()[0]
	if a.InvocationID != "third" || a.State != messages.StateFailed || a.Error == nil ||
		a.Error.Type != messages.ErrorTypeRefused || !strings.Contains(a.Error.Message, "already has its job (exec first)") {
		t.Fatalf("third: %+v %+v", a, a.Error)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the setup of the batch did not run: %v", err)
	}
	for id, rs := range h.cp.Results() {
		if len(rs) != 1 {
			t.Fatalf("exec %s reported %d times", id, len(rs))
		}
	}
}

// keep_alive_s > 0 against a legacy server: a wake does not abandon its
// held poll, and that poll must not put off the idle exit either. The fake
// holds it forever and the request timeout is long: only an exit that
// abandons the poll ends the daemon in time.
func TestIdleExitAbandonsAHeldLegacyPoll(t *testing.T) {
	h := newHarness(t, setup{
		cpOpts: []fakecp.Option{fakecp.WithHoldForever(), fakecp.WithLegacyCursor()},
		settings: func(s *actors.Settings) {
			s.Poll.KeepAlive = 300 * time.Millisecond
			s.Poll.RequestTimeout = time.Hour
		},
	})
	h.waitPolls(1)
	// The job outlasts keep_alive_s, so no idle timer is pending when it
	// ends.
	cmd := h.exec("job", "sleep 0.8")
	h.cp.Wait(10*time.Second, "a poll after the job was taken", func() bool {
		n, ok := h.cp.DeliveredBy(cmd)
		return ok && len(h.cp.Polls()) > n+1
	})
	if err := h.wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if r := h.cp.WaitResult("job", 10*time.Second); r.ExitCode != 0 {
		t.Fatalf("result %+v", r)
	}
}
