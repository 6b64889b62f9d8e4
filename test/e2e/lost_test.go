package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"nymph/daemon/outbox"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// waitingCLI is a lakeshore verb running in the background, as an operator
// leaves one waiting in a terminal.
type waitingCLI struct {
	args           []string
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer // read only once done
	done           chan struct{}
	code           int
}

func startCLI(t *testing.T, cp *harness.ControlPlane, args ...string) *waitingCLI {
	t.Helper()
	c := &waitingCLI{args: args, done: make(chan struct{})}
	cmd, err := harness.StartCmd(func() *exec.Cmd {
		cmd := exec.Command(cp.Bins.Lakeshore, args...)
		cmd.Env = cp.Env
		cmd.Stdout, cmd.Stderr = &c.stdout, &c.stderr
		return cmd
	})
	if err != nil {
		t.Fatalf("start lakeshore %v: %v", args, err)
	}
	c.cmd = cmd
	go func() {
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.code = ee.ExitCode()
		} else if err != nil {
			c.code = -1
		}
		close(c.done)
	}()
	t.Cleanup(c.stop)
	return c
}

// stop kills the verb if it is still running (only then: once reaped, its
// pid may be another process's) and waits for it.
func (c *waitingCLI) stop() {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// end waits for the verb to exit on its own; within bounds a wait far
// shorter than the verb's own (600 s for an exec, none for a run).
func (c *waitingCLI) end(t *testing.T, within time.Duration) harness.Result {
	t.Helper()
	select {
	case <-c.done:
		return harness.Result{Stdout: c.stdout.String(), Stderr: c.stderr.String(), Code: c.code}
	case <-time.After(within):
		c.stop()
		t.Fatalf("lakeshore %v still waiting after %v; its stderr:\n%s", c.args, within, c.stderr.String())
		return harness.Result{}
	}
}

// A nymph SIGKILLed while operators wait on its jobs, then started again:
// each waiting `daemon exec` and `run` ends at once, non-zero, saying the
// daemon restarted, with the error in --json output too. (Either the
// control plane, seeing the new process say hello, or the daemon's own
// account of what it was running may tell first: both say "restart".)
func TestDaemonCrashEndsTheJobsOperatorsWaitOn(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	// Runs report their output on polls: poll often.
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "phoenix", Runners: []string{"process"}, WaitMaxS: 1})
	w := cp.WaitForWorker(t, "phoenix")
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	env := key + "=" + value
	long := writeTemp(t, "long.sh", []byte("echo started; sleep 120"))

	execText := startCLI(t, cp, "daemon", "exec", "--env", env, "phoenix", "sleep 120")
	execJSON := startCLI(t, cp, "daemon", "exec", "--json", "--env", env, "phoenix", "sleep 121")
	runText := startCLI(t, cp, "run", "--runner", "process", "--env", env, "--script", long)
	runJSON := startCLI(t, cp, "run", "--json", "--runner", "process", "--env", env, "--script", long)

	// All four are running and the daemon has acknowledged all four
	// commands: a command it was sent but never acknowledged would go to
	// the new process again instead.
	wait.For(t, 60*time.Second, "the daemon to acknowledge two execs and two runs", func() bool {
		var cmds []operatorapi.CommandInfo
		if cp.GetJSON("/v1/namespaces/default/workers/"+w.ID+"/commands", &cmds) != nil {
			return false
		}
		acked := map[string]int{}
		for _, c := range cmds {
			if c.State == "acked" {
				acked[c.Kind]++
			}
		}
		return acked["exec"] == 2 && acked["run"] == 2
	})
	var invs operatorapi.InvocationList
	wait.For(t, 30*time.Second, "both runs to report output", func() bool {
		if cp.GetJSON("/v1/namespaces/default/invocations?state=running", &invs) != nil || len(invs.Invocations) != 2 {
			return false
		}
		for _, inv := range invs.Invocations {
			if !strings.Contains(inv.StdoutTail, "started") {
				return false
			}
		}
		return true
	})

	d.Kill()
	restarted := time.Now()
	d.Start(d.Bin, nil)

	for _, c := range []*waitingCLI{execText, runText} {
		r := c.end(t, 30*time.Second)
		if r.Code == 0 || !strings.Contains(r.Stderr, "restart") {
			t.Fatalf("lakeshore %v: exit %d\nstdout: %s\nstderr: %s", c.args, r.Code, r.Stdout, r.Stderr)
		}
		t.Logf("lakeshore %s ended %v after the restart began: exit %d: %s", c.args[0], time.Since(restarted).Round(time.Millisecond),
			r.Code, strings.TrimSpace(r.Stderr))
	}
	r := execJSON.end(t, 30*time.Second)
	ex := mustJSON[execEnvelope](t, r)
	if r.Code == 0 || ex.State != operatorapi.ExecFinished || ex.Result == nil || ex.Result.ExitCode != -1 ||
		ex.Result.Error == nil || !strings.Contains(*ex.Result.Error, "restart") {
		out, _ := json.Marshal(ex)
		t.Fatalf("daemon exec --json: exit %d: %s (stderr %s)", r.Code, out, r.Stderr)
	}
	r = runJSON.end(t, 30*time.Second)
	inv := mustJSON[operatorapi.Invocation](t, r)
	if r.Code == 0 || inv.State != operatorapi.InvocationFailed || inv.Error == nil || !strings.Contains(inv.Error.Message, "restart") {
		t.Fatalf("run --json: exit %d: %+v %+v (stderr %s)", r.Code, inv, inv.Error, r.Stderr)
	}

	// The daemon is back and takes work.
	back := cp.CLI(t, "daemon", "exec", "phoenix", "echo", "back")
	expectCode(t, back, 0)
	if back.Stdout != "back\n" {
		t.Fatalf("exec after the restart: %q", back.Stdout)
	}
}

// namelessProxy forwards to target with the incarnation taken out of every
// hello, so a real nymph reads as a daemon that names none (the original
// one); stripped counts the hellos it changed.
func namelessProxy(t *testing.T, target string) (proxyURL string, stripped *atomic.Int32) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	stripped = new(atomic.Int32)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0) // long-polls cut short by a SIGKILL are routine
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/daemon/hello" {
			body, err := io.ReadAll(r.Body)
			var m map[string]any
			if err == nil && messages.Unmarshal(body, &m) == nil && m["incarnation"] != nil {
				delete(m, "incarnation")
				if b, err := messages.Marshal(m); err == nil {
					body = b
					stripped.Add(1)
				}
			}
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, stripped
}

// A daemon that names no incarnation and keeps no journal (as the original
// one) comes back without a run it had reported: its polls no longer list the run, and after the stale window
// the waiting `run` ends, non-zero, saying the daemon restarted or lost it.
func TestRunLeftOutOfPollsAfterARestartFails(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--stale-after", "2s"}})
	proxy, stripped := namelessProxy(t, cp.URL)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "nameless", Runners: []string{"process"}, WaitMaxS: 1, ServerURL: proxy})
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	run := startCLI(t, cp, "run", "--runner", "process", "--env", key+"="+value, "--script",
		writeTemp(t, "long.sh", []byte("echo started; sleep 120")))
	var invs operatorapi.InvocationList
	wait.For(t, 60*time.Second, "the daemon to report the run", func() bool {
		return cp.GetJSON("/v1/namespaces/default/invocations?state=running", &invs) == nil && len(invs.Invocations) == 1 &&
			strings.Contains(invs.Invocations[0].StdoutTail, "started")
	})
	d.Kill()
	// The original daemon keeps no journal: without this one's, the
	// restarted nymph cannot report the run itself, and the control plane
	// has only the polls to go by.
	if err := os.Remove(filepath.Join(d.Workdir, "outbox", outbox.JournalFile)); err != nil {
		t.Fatalf("remove the job journal: %v", err)
	}
	restarted := time.Now()
	d.Start(d.Bin, nil)
	r := run.end(t, 60*time.Second)
	if r.Code == 0 || !strings.Contains(r.Stderr, "restart") {
		t.Fatalf("run: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
	if n := stripped.Load(); n < 2 {
		t.Fatalf("the proxy took the incarnation out of %d hellos, want both processes'", n)
	}
	t.Logf("run ended %v after the restart began (the stale window is 2s): exit %d: %s",
		time.Since(restarted).Round(time.Millisecond), r.Code, strings.TrimSpace(r.Stderr))
}
