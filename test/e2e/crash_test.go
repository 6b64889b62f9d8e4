package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/wait"
)

// A control plane killed with SIGKILL while commands are queued and execs
// are running loses no command and runs none twice; the daemon reconnects
// by itself.
func TestControlPlaneCrashLosesNothing(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "survivor"})
	dir := t.TempDir()
	logf := filepath.Join(dir, "ran.log")
	gate := filepath.Join(dir, "gate")

	running := startExec(t, cp, "survivor", fmt.Sprintf(`echo start >> %[1]s; while [ ! -e %[2]s ]; do sleep 0.02; done; echo long >> %[1]s`, logf, gate))
	wait.For(t, 30*time.Second, "the long exec to start", func() bool {
		b, _ := os.ReadFile(logf)
		return strings.Contains(string(b), "start")
	})
	ids := []string{running.ExecID}
	for i := 0; i < 8; i++ {
		acc := startExec(t, cp, "survivor", fmt.Sprintf("echo quick-%d >> %s", i, logf))
		ids = append(ids, acc.ExecID)
	}
	cp.Kill()
	// The long exec finishes while nobody is there to take its result.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the long exec to finish on the daemon", func() bool {
		b, _ := os.ReadFile(logf)
		return strings.Contains(string(b), "long")
	})
	cp.Restart()

	for _, id := range ids {
		var e operatorapi.Exec
		wait.For(t, 60*time.Second, "exec "+id+" to finish after the restart", func() bool {
			return cp.GetJSON("/v1/namespaces/default/execs/"+id, &e) == nil && e.State == operatorapi.ExecFinished
		})
		if e.Result == nil || e.Result.ExitCode != 0 {
			t.Fatalf("exec %s: %+v", id, e.Result)
		}
	}
	b, err := os.ReadFile(logf)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Fields(string(b)) {
		counts[line]++
	}
	want := []string{"start", "long"}
	for i := 0; i < 8; i++ {
		want = append(want, fmt.Sprintf("quick-%d", i))
	}
	for _, w := range want {
		if counts[w] != 1 {
			t.Errorf("%s ran %d times, want exactly once (log:\n%s)", w, counts[w], b)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("unexpected lines in the log: %v", counts)
	}
	// The daemon came back by itself and still takes work.
	r := cp.CLI(t, "daemon", "exec", "survivor", "echo still here")
	expectCode(t, r, 0)
	if r.Stdout != "still here\n" {
		t.Fatalf("exec after restart: %q", r.Stdout)
	}
}

// A daemon killed with SIGKILL cannot stop its jobs; the next start of the
// same daemon (same workdir) ends whatever they left running, and the
// daemon goes on taking work.
func TestDaemonRestartEndsJobsLeftByACrash(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "phoenix"})
	pidFile := filepath.Join(t.TempDir(), "job.pid")
	startExec(t, cp, "phoenix", fmt.Sprintf("echo $$ > %s; exec sleep 300", pidFile))
	var pid int
	wait.For(t, 30*time.Second, "the job to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), &pid)
		return err == nil && pid > 0
	})
	t.Cleanup(func() {
		// By pid only while it still carries the daemon's mark: once the job
		// is gone its pid may be another test's process.
		left, _ := orphans.WithEnv("/proc", orphans.EnvVar+"="+orphans.Marker(d.Workdir))
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	})

	d.Kill() // SIGKILL to nymph's own process group; the job has its own
	if !processAlive(pid) {
		t.Fatalf("job %d died with the daemon; the test needs it to outlive the crash", pid)
	}
	d.Start(d.Bin, nil)
	wait.For(t, 30*time.Second, "the restarted daemon to end the left-over job", func() bool { return !processAlive(pid) })
	if !strings.Contains(d.Log(), "killed processes left running by a previous run") {
		t.Fatalf("no log line about the left-over job:\n%s", d.Log())
	}
	r := cp.CLI(t, "daemon", "exec", "phoenix", "echo", "back")
	expectCode(t, r, 0)
	if r.Stdout != "back\n" {
		t.Fatalf("exec after restart: %q", r.Stdout)
	}
}
