package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// marked counts the live processes carrying key=value in their
// environment.
func marked(key, value string) int {
	pids, _ := orphans.WithEnv("/proc", key+"="+value)
	return len(pids)
}

// A nymph SIGKILLed mid-exec and started again: the exec gets exit -1 with
// an error that says the daemon restarted, posted once, and the job the
// dead process left is gone.
func TestDaemonRestartReportsInterruptedExecOnce(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	proxy := harness.StartProxy(t, cp.URL)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "lazarus", ServerURL: proxy.URL})
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	w := cp.WaitForWorker(t, "lazarus")
	var acc operatorapi.ExecAccepted
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+w.ID+"/exec",
		operatorapi.ExecRequest{Command: "exec sleep 120", Env: map[string]string{key: value}}, &acc); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the exec's process", func() bool { return marked(key, value) == 1 })

	d.Kill() // SIGKILL to nymph's process group; the job leads its own
	if marked(key, value) != 1 {
		t.Fatal("the job died with the daemon; the test needs it to outlive the crash")
	}
	d.Start(d.Bin, nil)
	var e operatorapi.Exec
	wait.For(t, 60*time.Second, "the interrupted exec to finish", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &e) == nil && e.State == operatorapi.ExecFinished
	})
	if e.Result == nil || e.Result.ExitCode != -1 || e.Result.Error == nil || !strings.Contains(*e.Result.Error, "restart") {
		t.Fatalf("interrupted exec: %+v", e.Result)
	}
	t.Logf("reported: %s", *e.Result.Error)
	wait.For(t, 30*time.Second, "the left-over job to be ended", func() bool { return marked(key, value) == 0 })

	// The daemon goes on; by the time a later exec is done, every post of
	// the interrupted one has been made.
	r := cp.CLI(t, "daemon", "exec", "lazarus", "echo", "back")
	expectCode(t, r, 0)
	if r.Stdout != "back\n" {
		t.Fatalf("exec after the restart: %q", r.Stdout)
	}
	if posts := proxy.Requests("/v1/daemon/exec/"+acc.ExecID+"/result", time.Time{}); len(posts) != 1 {
		t.Fatalf("the interrupted exec's result was posted %d times, want once", len(posts))
	}
	if n := strings.Count(d.Log(), "job was running when the previous process died"); n != 1 {
		t.Fatalf("%d recoveries logged, want 1:\n%s", n, d.Log())
	}
}

// The same mid-run: `lakeshore run` with a long script, nymph SIGKILLed
// and started again; the run is acked failed {type: DaemonRestarted}.
func TestDaemonRestartFailsInterruptedRun(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	proxy := harness.StartProxy(t, cp.URL)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "phoenix-run", Runners: []string{"process"}, ServerURL: proxy.URL})
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	// Nothing on stdout: with the daemon gone a write there would end the
	// script with SIGPIPE, and the test needs it to outlive the crash.
	started := filepath.Join(t.TempDir(), "started")
	id := submitInv(t, cp, "--runner", "process", "--env", key+"="+value, "--script",
		writeTemp(t, "long.sh", []byte("touch "+started+"; exec sleep 120")))
	waitInvState(t, cp, id, operatorapi.InvocationRunning, 30*time.Second)
	wait.For(t, 30*time.Second, "the run's script to start", func() bool { _, err := os.Stat(started); return err == nil })

	d.Kill()
	if marked(key, value) == 0 {
		t.Fatal("the run died with the daemon; the test needs it to outlive the crash")
	}
	d.Start(d.Bin, nil)
	inv := waitInvState(t, cp, id, operatorapi.InvocationFailed, 60*time.Second)
	if inv.Error == nil || inv.Error.Type != messages.ErrorTypeDaemonRestarted || !strings.Contains(inv.Error.Message, "restart") {
		t.Fatalf("interrupted run: %+v", inv.Error)
	}
	t.Logf("reported: %s: %s", inv.Error.Type, inv.Error.Message)
	wait.For(t, 30*time.Second, "the left-over run to be ended", func() bool { return marked(key, value) == 0 })
	r := cp.CLI(t, "run", "--runner", "process", "--script", writeTemp(t, "after.sh", []byte("true")))
	expectCode(t, r, 0)
	if posts := proxy.Requests("/v1/daemon/ack", time.Time{}); len(posts) != 2 {
		t.Fatalf("%d acks posted, want the interrupted run's and the later one's", len(posts))
	}
}

// Two nymphs on one workdir: the second exits non-zero at once naming the
// first, which goes on: its running exec completes and its log is not
// touched.
func TestSecondNymphOnTheSameWorkdirLeavesTheFirstAlone(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	a := cp.StartDaemon(t, harness.DaemonOptions{Label: "first"})
	dir := t.TempDir()
	started, gate := filepath.Join(dir, "started"), filepath.Join(dir, "gate")
	long := startExec(t, cp, "first", fmt.Sprintf(`touch %s; while [ ! -e %s ]; do sleep 0.02; done; echo survived`, started, gate))
	wait.For(t, 30*time.Second, "the long exec to start", func() bool { _, err := os.Stat(started); return err == nil })
	logBefore := a.Log()

	var out strings.Builder
	b, err := harness.StartCmd(func() *exec.Cmd {
		out.Reset()
		cmd := exec.Command(a.Bin, "run", "--config", a.ConfigPath)
		cmd.Stdout, cmd.Stderr = &out, &out
		return cmd
	})
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- b.Wait() }()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = b.Process.Kill()
		<-exited
		t.Fatal("the second nymph did not exit")
	}
	want := fmt.Sprintf("another nymph (pid %d) is using workdir %s", a.PID(), a.Workdir)
	if b.ProcessState.ExitCode() == 0 || !strings.Contains(out.String(), want) {
		t.Fatalf("second nymph: %v, said %q; want a failure saying %q", b.ProcessState, out.String(), want)
	}
	if logAfter := a.Log(); !strings.HasPrefix(logAfter, logBefore) {
		t.Fatal("the first nymph's log was truncated or rewritten")
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var e operatorapi.Exec
	wait.For(t, 60*time.Second, "the first nymph's exec to finish", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+long.ExecID, &e) == nil && e.State == operatorapi.ExecFinished
	})
	if e.Result == nil || e.Result.ExitCode != 0 || e.Result.Stdout != "survived\n" {
		t.Fatalf("the first nymph's exec: %+v", e.Result)
	}
	if strings.Contains(a.Log(), "killed processes left running by a previous run") {
		t.Fatal("an orphan sweep ran against the live daemon's jobs")
	}
	a.Signal(syscall.SIGTERM)
	<-a.Done()
}
