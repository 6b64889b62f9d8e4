package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// Output and outcomes reach the operator: a run's output while it runs and
// after, a setup's exit code, an update's refusal.

// newestInvocation is the id of the invocation submitted last.
func newestInvocation(t *testing.T, cp *harness.ControlPlane) string {
	t.Helper()
	r := cp.CLI(t, "invocations", "list", "--json", "--limit", "1")
	expectCode(t, r, 0)
	l := mustJSON[operatorapi.InvocationList](t, r)
	if len(l.Invocations) != 1 {
		t.Fatalf("invocations: %+v", l)
	}
	return l.Invocations[0].ID
}

// A short `lakeshore run --script` prints what the script wrote, stdout to
// stdout and stderr to stderr, and `invocations show` prints it afterwards.
func TestRunScriptOutputPrintedByRunAndShow(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "talker", Runners: []string{"process"}})
	script := writeTemp(t, "two-seconds.sh", []byte("echo starting the job\nsleep 2\necho 'a warning' >&2\necho job done\n"))
	start := time.Now()
	r := cp.CLI(t, "run", "--runner", "process", "--script", script)
	expectCode(t, r, 0)
	if r.Stdout != "starting the job\njob done\n" || !strings.Contains(r.Stderr, "a warning\n") {
		t.Fatalf("run printed stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
	t.Logf("run --script of a 2 s script returned after %v", time.Since(start).Round(time.Millisecond))

	id := newestInvocation(t, cp)
	r = cp.CLI(t, "invocations", "show", id)
	expectCode(t, r, 0)
	// The two streams are read apart, so lines written to each within an
	// instant may swap; each stream keeps its order.
	out := r.Stdout
	if !strings.Contains(out, "output:\n  starting the job\n") || !strings.Contains(out, "  a warning\n") ||
		!strings.Contains(out, "  job done\n") || strings.Index(out, "job done") < strings.Index(out, "starting the job") ||
		strings.Contains(out, "capped") {
		t.Fatalf("invocations show:\n%s", out)
	}
	r = cp.CLI(t, "invocations", "logs", id)
	expectCode(t, r, 0)
	if r.Stdout != "starting the job\njob done\n" || r.Stderr != "a warning\n" {
		t.Fatalf("invocations logs: stdout %q, stderr %q", r.Stdout, r.Stderr)
	}
}

// lockedBuffer collects a child's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// `invocations logs --follow` prints the output of a run that is still
// running, and returns once the run is over.
func TestLogsFollowWhileRunning(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "follower", Runners: []string{"process"}})
	gate := filepath.Join(t.TempDir(), "gate")
	id := submitInv(t, cp, "--runner", "process", "--script", writeTemp(t, "gated.sh", []byte(fmt.Sprintf(
		"echo tick-one\nwhile [ ! -e %s ]; do sleep 0.05; done\necho tick-two\n", gate))))

	var out, errs lockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cp.Bins.Lakeshore, "invocations", "logs", "--follow", id)
	cmd.Env, cmd.Stdout, cmd.Stderr = cp.Env, &out, &errs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	wait.For(t, 60*time.Second, "the follower to print the first line", func() bool { return strings.Contains(out.String(), "tick-one\n") })
	// The run is still going: the line came while it ran.
	if inv := showInv(t, cp, id); inv.State != operatorapi.InvocationRunning {
		t.Fatalf("the run is %s while its gate is shut", inv.State)
	}
	select {
	case err := <-exited:
		t.Fatalf("the follower returned while the run was running: %v (stdout %q)", err, out.String())
	default:
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the follower: %v (stderr %q)", err, errs.String())
		}
	case <-ctx.Done():
		t.Fatal("the follower did not return once the run was over")
	}
	if got := out.String(); got != "tick-one\ntick-two\n" {
		t.Fatalf("followed %q", got)
	}
	if inv := showInv(t, cp, id); inv.State != operatorapi.InvocationSucceeded {
		t.Fatalf("after the follow the run is %s", inv.State)
	}
}

// outcomes reads the daemon's recent outcomes through `daemon show --json`.
func outcomes(t *testing.T, cp *harness.ControlPlane, label string) operatorapi.Worker {
	t.Helper()
	r := cp.CLI(t, "daemon", "show", label, "--json")
	expectCode(t, r, 0)
	return mustJSON[operatorapi.Worker](t, r)
}

// A setup that exits 9 is reported: `daemon show` lists it with its exit
// code and output, `daemon list` shows the daemon's setup failed.
func TestFailingSetupIsReported(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "setup-fails"})
	script := writeTemp(t, "setup.sh", []byte("echo installing drivers\necho 'E: Unable to locate package nosuch' >&2\nexit 9\n"))
	r := cp.CLI(t, "daemon", "setup", "setup-fails", "--script", script, "--json")
	expectCode(t, r, 0)
	q := mustJSON[operatorapi.Queued](t, r)

	var w operatorapi.Worker
	wait.For(t, 60*time.Second, "the setup's outcome", func() bool {
		w = outcomes(t, cp, "setup-fails")
		return len(w.Outcomes) > 0
	})
	o := w.Outcomes[0]
	if o.Kind != messages.EventSetupFinished || o.CommandID != q.CommandID || o.Setup == nil || o.Setup.ExitCode != 9 ||
		o.Setup.State != messages.StateFailed || !strings.Contains(o.Setup.OutputTail, "installing drivers") ||
		!strings.Contains(o.Setup.OutputTail, "Unable to locate package nosuch") {
		t.Fatalf("outcome %+v (setup %+v)", o, o.Setup)
	}
	r = cp.CLI(t, "daemon", "show", "setup-fails")
	expectCode(t, r, 0)
	for _, want := range []string{"recent outcomes:", q.CommandID, "setup failed with exit 9", "| E: Unable to locate package nosuch"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("daemon show lacks %q:\n%s", want, r.Stdout)
		}
	}
	r = cp.CLI(t, "daemon", "list")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "setup failed (exit 9)") {
		t.Fatalf("daemon list does not show the failed setup:\n%s", r.Stdout)
	}
	r = cp.CLI(t, "daemon", "list", "--json")
	expectCode(t, r, 0)
	if l := mustJSON[operatorapi.WorkerList](t, r); len(l.Workers) != 1 || l.Workers[0].LastSetup == nil || l.Workers[0].LastSetup.Setup.ExitCode != 9 {
		t.Fatalf("daemon list --json: %s", r.Stdout)
	}
}

// A setup that ends while the control plane is down is reported once it is
// back: the outcome waits in the daemon's outbox.
func TestSetupOutcomeSurvivesControlPlaneDown(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "setup-waits"})
	dir := t.TempDir()
	started, gate, finished := filepath.Join(dir, "started"), filepath.Join(dir, "gate"), filepath.Join(dir, "finished")
	script := writeTemp(t, "setup.sh", []byte(fmt.Sprintf("touch %s\nwhile [ ! -e %s ]; do sleep 0.05; done\necho configured\ntouch %s\n",
		started, gate, finished)))
	r := cp.CLI(t, "daemon", "setup", "setup-waits", "--script", script, "--json")
	expectCode(t, r, 0)
	q := mustJSON[operatorapi.Queued](t, r)
	wait.For(t, 60*time.Second, "the setup to start", func() bool { _, err := os.Stat(started); return err == nil })
	cp.Kill()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "the setup to finish while the control plane is down", func() bool {
		_, err := os.Stat(finished)
		return err == nil
	})
	cp.Restart()
	var w operatorapi.Worker
	wait.For(t, 90*time.Second, "the outcome after the restart", func() bool {
		r := cp.CLI(t, "daemon", "show", "setup-waits", "--json")
		return r.Code == 0 && json.Unmarshal([]byte(r.Stdout), &w) == nil && len(w.Outcomes) > 0
	})
	if o := w.Outcomes[0]; o.CommandID != q.CommandID || o.Setup == nil || o.Setup.ExitCode != 0 || o.Setup.OutputTail != "configured\n" {
		t.Fatalf("outcome after the restart: %+v (setup %+v)", o, o.Setup)
	}
}

// An update whose checksum does not match is refused by the daemon, and the
// refusal, with why, is on `daemon show`.
func TestOTABadChecksumRefusalIsReported(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	bin, v1 := privateNymph(t, cp)
	v2Path, _ := v2Nymph(t)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "ota-refuses", Bin: bin})
	publish(t, cp, v2Path, v2Version)
	wrong := strings.Repeat("0", 64)
	r := cp.CLI(t, "daemon", "update", "ota-refuses", "--version", v2Version, "--sha256", wrong, "--json")
	expectCode(t, r, 0)
	q := mustJSON[operatorapi.UpdateQueued](t, r)

	var w operatorapi.Worker
	wait.For(t, 60*time.Second, "the update's outcome", func() bool {
		w = outcomes(t, cp, "ota-refuses")
		return len(w.Outcomes) > 0
	})
	o := w.Outcomes[0]
	if o.Kind != messages.EventOtaFinished || o.CommandID != q.CommandID || o.Ota == nil || o.Ota.Outcome != messages.OtaRefused ||
		o.Ota.Code != messages.OtaCodeChecksumMismatch || o.Ota.Reason == nil || !strings.Contains(*o.Ota.Reason, "sha256 mismatch") ||
		o.Ota.Version != v2Version || o.Ota.SHA256 != wrong {
		t.Fatalf("outcome %+v (ota %+v)", o, o.Ota)
	}
	r = cp.CLI(t, "daemon", "show", "ota-refuses")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "refused "+v2Version+": checksum mismatch (ota: sha256 mismatch") {
		t.Fatalf("daemon show lacks the refusal:\n%s", r.Stdout)
	}
	// Nothing changed on the host.
	assertImage(t, d, d.PID(), bin, v1)
}
