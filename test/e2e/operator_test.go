package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/wait"
)

type execEnvelope struct {
	ExecID   string `json:"execId"`
	WorkerID string `json:"workerId"`
	State    string `json:"state"`
	Result   *struct {
		ExitCode   int32   `json:"exitCode"`
		Stdout     string  `json:"stdout"`
		Stderr     string  `json:"stderr"`
		DurationMs uint64  `json:"durationMs"`
		Error      *string `json:"error"`
	} `json:"result"`
}

func mustJSON[T any](t *testing.T, r harness.Result) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatalf("stdout is not the expected JSON (%v):\nstdout: %s\nstderr: %s", err, r.Stdout, r.Stderr)
	}
	return v
}

func expectCode(t *testing.T, r harness.Result, code int) {
	t.Helper()
	if r.Code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.Code, code, r.Stdout, r.Stderr)
	}
}

func TestListShowAndExec(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "alpha", Tags: []string{"role=test"}})

	r := cp.CLI(t, "daemon", "list")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "alpha") || !strings.Contains(r.Stdout, "active") {
		t.Fatalf("daemon list does not show alpha active:\n%s", r.Stdout)
	}
	list := mustJSON[operatorapi.WorkerList](t, cp.CLI(t, "daemon", "list", "--json"))
	if len(list.Workers) != 1 || list.Workers[0].Label != "alpha" || list.Workers[0].State != operatorapi.StateActive {
		t.Fatalf("daemon list --json: %+v", list)
	}
	w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "alpha", "--json"))
	if w.ID != list.Workers[0].ID || !contains(w.Tags, "role=test") || !contains(w.Runners, "process") {
		t.Fatalf("daemon show --json: %+v", w)
	}
	if r := cp.CLI(t, "daemon", "show", w.ID, "--id"); r.Code != 0 || !strings.Contains(r.Stdout, "alpha") {
		t.Fatalf("daemon show --id: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}

	r = cp.CLI(t, "daemon", "exec", "alpha", "echo", "hello", "world")
	expectCode(t, r, 0)
	if r.Stdout != "hello world\n" {
		t.Fatalf("exec stdout %q", r.Stdout)
	}
	expectCode(t, cp.CLI(t, "daemon", "exec", "alpha", "exit 7"), 7)

	env := mustJSON[execEnvelope](t, cp.CLI(t, "daemon", "exec", "--json", "--env", "GREETING=hi there", "--workdir", "/tmp", "alpha", `echo "$GREETING from $(pwd)"; echo oops >&2; exit 3`))
	if env.Result == nil || env.Result.ExitCode != 3 || env.Result.Stdout != "hi there from /tmp\n" || env.Result.Stderr != "oops\n" {
		t.Fatalf("exec --json envelope: %+v %+v", env, env.Result)
	}

	stdinFile := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(stdinFile, []byte("a\nb\nc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = cp.CLI(t, "daemon", "exec", "--stdin", stdinFile, "alpha", "wc -l")
	expectCode(t, r, 0)
	if strings.TrimSpace(r.Stdout) != "3" {
		t.Fatalf("exec --stdin file: %q", r.Stdout)
	}
	r = cp.CLIStdin(t, "x\ny\n", "daemon", "exec", "--stdin", "-", "alpha", "wc -l")
	if strings.TrimSpace(r.Stdout) != "2" {
		t.Fatalf("exec --stdin -: %q (%s)", r.Stdout, r.Stderr)
	}

	// Timeout: SIGTERM, then the sentinel -2 maps to exit 254.
	r = cp.CLI(t, "daemon", "exec", "--timeout", "0.5", "alpha", "sleep 30")
	expectCode(t, r, 254)
	env = mustJSON[execEnvelope](t, cp.CLI(t, "daemon", "exec", "--json", "--timeout", "0.5", "alpha", "sleep 30"))
	if env.Result == nil || env.Result.ExitCode != -2 {
		t.Fatalf("timeout envelope: %+v", env.Result)
	}

	// Unknown daemon: a clear error, the CLI's own failure code.
	r = cp.CLI(t, "daemon", "exec", "nosuch", "true")
	if r.Code != 125 || !strings.Contains(r.Stderr, "nosuch") {
		t.Fatalf("exec on unknown daemon: %d %q", r.Code, r.Stderr)
	}
	_ = d
}

func TestExecStreamsOutput(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "streamer"})
	gate := filepath.Join(t.TempDir(), "gate")

	cmd := exec.Command(cp.Bins.Lakeshore, "daemon", "exec", "streamer",
		fmt.Sprintf(`echo first; while [ ! -e %s ]; do sleep 0.02; done; echo second`, gate))
	cmd.Env = cp.Env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	rd := bufio.NewReader(stdout)
	line, err := rd.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first streamed line %q, %v", line, err)
	}
	// The command is still blocked on the gate, so "first" was streamed,
	// not delivered with the result.
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(rd)
	if string(rest) != "second\n" {
		t.Fatalf("rest of stream %q", rest)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec exit: %v", err)
	}
}

func TestQueueRouting(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "gpu-1", Queue: "gpu"})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "cpu-1", Queue: "cpu"})
	gpu := cp.WaitForWorker(t, "gpu-1")
	// A worker's queue is known once it has polled.
	wait.For(t, 30*time.Second, "gpu-1 to poll queue gpu", func() bool {
		for _, w := range cp.Workers(t) {
			if w.Label == "gpu-1" && w.PollQueue == "gpu" {
				return true
			}
		}
		return false
	})
	for i := 0; i < 3; i++ {
		env := mustJSON[execEnvelope](t, cp.CLI(t, "exec", "--queue", "gpu", "--json", "echo routed"))
		if env.WorkerID != gpu.ID || env.Result == nil || env.Result.Stdout != "routed\n" {
			t.Fatalf("exec --queue gpu went to %s (want %s): %+v", env.WorkerID, gpu.ID, env.Result)
		}
	}
	r := cp.CLI(t, "exec", "--queue", "tpu", "true")
	if r.Code == 0 || !strings.Contains(r.Stderr, "tpu") {
		t.Fatalf("exec to a queue nobody serves: %d %q", r.Code, r.Stderr)
	}
	// No --queue and no terminal: no picker, a clear error.
	r = cp.CLI(t, "exec", "true")
	if r.Code == 0 || r.Stderr == "" {
		t.Fatalf("exec without --queue on a non-terminal: %d %q", r.Code, r.Stderr)
	}
}

func TestSetupHibernateResetCancel(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "worker", WaitMaxS: 5})
	dir := t.TempDir()
	script := filepath.Join(dir, "setup.sh")
	marker := filepath.Join(dir, "marker")
	if err := os.WriteFile(script, []byte("#!/bin/bash\nset -e\necho \"ran as $(id -un)\" >> "+marker+"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	q := mustJSON[operatorapi.Queued](t, cp.CLI(t, "daemon", "setup", "worker", "--script", script, "--name", "marker", "--refresh-capabilities", "--json"))
	if q.Kind != "setup" || q.CommandID == "" {
		t.Fatalf("setup --json: %+v", q)
	}
	wait.For(t, 30*time.Second, "setup script to run", func() bool {
		b, _ := os.ReadFile(marker)
		return strings.Contains(string(b), "ran as")
	})
	wait.For(t, 30*time.Second, "worker to be active after setup", func() bool {
		w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "worker", "--json"))
		return w.State == operatorapi.StateActive && w.SetupPending == 0
	})
	r := cp.CLI(t, "daemon", "setup", "worker")
	if r.Code == 0 || !strings.Contains(r.Stderr, "script") {
		t.Fatalf("setup without --script: %d %q", r.Code, r.Stderr)
	}

	expectCode(t, cp.CLI(t, "daemon", "reset", "worker"), 0)

	r = cp.CLI(t, "daemon", "hibernate", "worker", "--until", "2020-01-01T00:00:00Z")
	if r.Code == 0 || !strings.Contains(strings.ToLower(r.Stderr), "past") {
		t.Fatalf("hibernate into the past: %d %q", r.Code, r.Stderr)
	}
	expectCode(t, cp.CLI(t, "daemon", "hibernate", "worker", "--until", "+3s"), 0)
	// An exec queued while the daemon sleeps runs once it wakes up.
	start := time.Now()
	r = cp.CLI(t, "daemon", "exec", "worker", "echo awake")
	expectCode(t, r, 0)
	if r.Stdout != "awake\n" {
		t.Fatalf("exec after hibernate: %q", r.Stdout)
	}
	if time.Since(start) < 2*time.Second {
		t.Fatalf("exec finished %v after a 3 s hibernate was queued: the daemon did not hibernate", time.Since(start))
	}

	// Cancel a running exec without stopping the daemon.
	acc := startExec(t, cp, "worker", "sleep 60")
	wait.For(t, 30*time.Second, "exec to start", func() bool {
		var e operatorapi.Exec
		return cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &e) == nil && e.State == operatorapi.ExecRunning
	})
	expectCode(t, cp.CLI(t, "daemon", "cancel", "worker", "--exec", acc.ExecID), 0)
	var e operatorapi.Exec
	wait.For(t, 30*time.Second, "cancelled exec to finish", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &e) == nil && e.State == operatorapi.ExecFinished
	})
	if e.Result.ExitCode != -1 {
		t.Fatalf("cancelled exec exit code %d, want -1", e.Result.ExitCode)
	}
	expectCode(t, cp.CLI(t, "daemon", "exec", "worker", "true"), 0)
}

func TestKillCleanupAndStale(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--stale-after", "2s"}})
	a := cp.StartDaemon(t, harness.DaemonOptions{Label: "fleet-a", WaitMaxS: 1})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "fleet-b", WaitMaxS: 1})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "keep", WaitMaxS: 1})

	// Stale is derived: stop a daemon and it reads back stale once its
	// lastSeenAt is older than the window, without anything being stored.
	a.Kill()
	wait.For(t, 30*time.Second, "fleet-a to read back stale", func() bool {
		w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "fleet-a", "--json"))
		return w.State == operatorapi.StateStale && w.StoredState == operatorapi.StateActive
	})

	// The live daemons poll every second; fleet-a has been silent for a
	// while. A 5 s threshold separates them with room for a loaded machine.
	wait.For(t, 30*time.Second, "fleet-a silent for 6 s", func() bool {
		w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "fleet-a", "--json"))
		return time.Since(w.LastSeenAt) > 6*time.Second
	})

	// Cleanup rules.
	for _, bad := range []string{"0", "-1h", "200h"} {
		r := cp.CLI(t, "daemon", "cleanup", "--older-than", bad, "--yes")
		if r.Code == 0 {
			t.Fatalf("cleanup --older-than %s accepted: %s", bad, r.Stdout)
		}
	}
	dry := mustJSON[operatorapi.CleanupResponse](t, cp.CLI(t, "daemon", "cleanup", "--older-than", "5s", "--dry-run", "--json"))
	if dry.Count != 1 || dry.Deleted[0].Label != "fleet-a" {
		t.Fatalf("cleanup --dry-run: %+v", dry)
	}
	r := cp.CLI(t, "daemon", "cleanup", "--older-than", "5s")
	expectCode(t, r, 0) // no terminal, no --yes: cancelled
	if len(cp.Workers(t)) != 3 {
		t.Fatalf("cleanup without --yes on a non-terminal deleted something")
	}
	done := mustJSON[operatorapi.CleanupResponse](t, cp.CLI(t, "daemon", "cleanup", "--older-than", "5s", "--yes", "--json"))
	if done.Count != 1 || len(cp.Workers(t)) != 2 {
		t.Fatalf("cleanup --yes: %+v", done)
	}

	// Kill by prefix needs --yes off a terminal; a positional kill does not.
	r = cp.CLI(t, "daemon", "kill", "--prefix", "fleet")
	expectCode(t, r, 0)
	if len(cp.Workers(t)) != 2 {
		t.Fatal("kill --prefix without --yes deleted something")
	}
	if r := cp.CLI(t, "daemon", "kill", "--prefix", "fleet", "keep"); r.Code == 0 {
		t.Fatal("kill with both --prefix and a daemon was accepted")
	}
	expectCode(t, cp.CLI(t, "daemon", "kill", "--prefix", "fleet", "--yes"), 0)
	ws := cp.Workers(t)
	if len(ws) != 1 || ws[0].Label != "keep" {
		t.Fatalf("after kill --prefix fleet: %+v", ws)
	}
	expectCode(t, cp.CLI(t, "daemon", "kill", "keep", "--no-terminate"), 0)
	if len(cp.Workers(t)) != 0 {
		t.Fatal("kill keep left its row")
	}
}

func TestLocalStatusStopAndCompletion(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "local"})
	var st struct {
		Running   bool `json:"running"`
		Processes []struct {
			PID int `json:"pid"`
		} `json:"processes"`
	}
	st = mustJSON[struct {
		Running   bool `json:"running"`
		Processes []struct {
			PID int `json:"pid"`
		} `json:"processes"`
	}](t, cp.CLI(t, "daemon", "status", "--json"))
	found := false
	for _, p := range st.Processes {
		found = found || p.PID == d.PID()
	}
	if !st.Running || !found {
		t.Fatalf("daemon status does not list pid %d: %+v", d.PID(), st)
	}
	// Stop only our own daemon: other tests' daemons run on this machine too.
	expectCode(t, cp.CLI(t, "daemon", "stop", "--timeout", "30", fmt.Sprint(d.PID())), 0)
	if code := waitExit(t, d, 30*time.Second); code != 0 {
		t.Fatalf("nymph exit code after SIGTERM: %d\n%s", code, d.Log())
	}

	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := cp.CLI(t, "completion", sh)
		if r.Code != 0 || len(r.Stdout) < 100 {
			t.Fatalf("completion %s: %d (%d bytes)", sh, r.Code, len(r.Stdout))
		}
	}
	_ = syscall.SIGTERM
}

func startExec(t *testing.T, cp *harness.ControlPlane, daemon, command string) operatorapi.ExecAccepted {
	t.Helper()
	w := cp.WaitForWorker(t, daemon)
	var acc operatorapi.ExecAccepted
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+w.ID+"/exec", operatorapi.ExecRequest{Command: command}, &acc); err != nil {
		t.Fatalf("queue exec: %v", err)
	}
	return acc
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
