package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// Function runs end to end: `lakeshore run` through a real control plane
// to a real nymph, on each runner's real backend (podman with a local
// busybox image, runsc, a private SLURM cluster, python3).

// runMark returns a unique KEY=VALUE marker: passed with --env, it tags
// every process of a run (container processes too), so /proc tells whether
// any is left.
func runMark(t *testing.T) (string, string) {
	t.Helper()
	return "NYMPH_E2E_RUN", "m" + hex.EncodeToString(randBytes(t, 8))
}

func randBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// killMarked kills what a test deliberately orphaned (a run whose daemon
// was SIGKILLed).
func killMarked(key, value string) {
	pids, _ := orphans.WithEnv("/proc", key+"="+value)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func writeTemp(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// runInv runs `lakeshore run --json ARGS...` and decodes the invocation.
func runInv(t *testing.T, cp *harness.ControlPlane, args ...string) (operatorapi.Invocation, harness.Result) {
	t.Helper()
	r := cp.CLI(t, append([]string{"run", "--json"}, args...)...)
	return mustJSON[operatorapi.Invocation](t, r), r
}

// submitInv runs `lakeshore run --no-wait` and returns the invocation id.
func submitInv(t *testing.T, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	r := cp.CLI(t, append([]string{"run", "--no-wait"}, args...)...)
	expectCode(t, r, 0)
	id := strings.TrimSpace(r.Stdout)
	if id == "" {
		t.Fatalf("run --no-wait printed no id (stderr %s)", r.Stderr)
	}
	return id
}

func showInv(t *testing.T, cp *harness.ControlPlane, id string) operatorapi.Invocation {
	t.Helper()
	r := cp.CLI(t, "invocations", "show", id, "--json")
	expectCode(t, r, 0)
	return mustJSON[operatorapi.Invocation](t, r)
}

// waitInvState waits until the invocation is in state (or fails the test
// when it ends in another).
func waitInvState(t *testing.T, cp *harness.ControlPlane, id, state string, within time.Duration) operatorapi.Invocation {
	t.Helper()
	var inv operatorapi.Invocation
	wait.For(t, within, "invocation "+id+" to be "+state, func() bool {
		if err := cp.GetJSON("/v1/namespaces/default/invocations/"+id, &inv); err != nil {
			return false
		}
		if inv.State != state && operatorapi.InvocationTerminal(inv.State) {
			t.Fatalf("invocation %s ended %s, want %s (error %+v)", id, inv.State, state, inv.Error)
		}
		return inv.State == state
	})
	return inv
}

func expectSucceeded(t *testing.T, what string, inv operatorapi.Invocation, r harness.Result, result []byte) {
	t.Helper()
	if r.Code != 0 || inv.State != operatorapi.InvocationSucceeded || inv.Error != nil {
		t.Fatalf("%s: exit %d, state %s, error %+v\nstderr: %s", what, r.Code, inv.State, inv.Error, r.Stderr)
	}
	if !bytes.Equal(inv.Result, result) {
		t.Fatalf("%s: result %q, want %q", what, truncated(inv.Result), truncated(result))
	}
}

func truncated(b []byte) []byte {
	if len(b) > 120 {
		return append(b[:120:120], "..."...)
	}
	return b
}

// podmanTOML is the [runners.docker] table that works here (podman, runc,
// cgroupfs, no network, no pulls).
func podmanTOML() string {
	return fmt.Sprintf("[runners.docker]\ncli = \"podman\"\nglobal_args = %s\nrun_args = %s\nkill_grace_s = 1\n",
		tomlStrings(realparts.PodmanGlobalArgs()), tomlStrings(append(realparts.PodmanRunArgs(), "--pull=never")))
}

func tomlStrings(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = strconv.Quote(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// echoArgsScript returns its args (stdin) as the result; the args file
// must hold the same bytes.
const echoArgsScript = `cat > "$NYMPH_RESULT_PATH"
cmp -s "$NYMPH_ARGS_PATH" "$NYMPH_RESULT_PATH" || { echo "args file differs from stdin" >&2; exit 3; }
`

const pyModule = `import os, time

def mul(a, b):
    return a * b

def where():
    return [os.getcwd(), os.environ.get("NYMPH_INVOCATION_ID")]

def boom(message):
    raise ValueError(message)

def nap(seconds):
    time.sleep(seconds)
`

// One run through the CLI on each runner's real backend.
func TestRunEachRunner(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	args := append([]byte("hello \x00\xff runner "), randBytes(t, 16)...)
	argsFile := writeTemp(t, "args.bin", args)
	script := writeTemp(t, "echo.sh", []byte(echoArgsScript))

	t.Run("process", func(t *testing.T) {
		t.Parallel()
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-process", Queue: "q-process", Runners: []string{"process"}})
		inv, r := runInv(t, cp, "--queue", "q-process", "--runner", "process", "--args-file", argsFile, "--script", script)
		expectSucceeded(t, "process", inv, r, args)
		// The plain output is the raw result.
		r = cp.CLI(t, "run", "--queue", "q-process", "--runner", "process", "--args-file", argsFile, "--script", script)
		expectCode(t, r, 0)
		if r.Stdout != string(args) {
			t.Fatalf("plain output %q", r.Stdout)
		}
	})

	t.Run("echo", func(t *testing.T) {
		t.Parallel()
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-echo", Queue: "q-echo", Runners: []string{"echo"}})
		inv, r := runInv(t, cp, "--queue", "q-echo", "--runner", "echo", "--args-file", argsFile, "m:f")
		expectSucceeded(t, "echo", inv, r, args)
		r = cp.CLI(t, "run", "--queue", "q-echo", "--runner", "echo", "--args-json", `{"x": [1, 2.5, "three"]}`, "m:f")
		expectCode(t, r, 0)
		if got := strings.Join(strings.Fields(r.Stdout), ""); got != `{"x":[1,2.5,"three"]}` {
			t.Fatalf("echo of --args-json printed %q", r.Stdout)
		}
	})

	t.Run("python", func(t *testing.T) {
		t.Parallel()
		python := realparts.RequireTool(t, "python3")[0]
		workdir := t.TempDir()
		if err := os.WriteFile(filepath.Join(workdir, "nymph_e2e_mod.py"), []byte(pyModule), 0o644); err != nil {
			t.Fatal(err)
		}
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-python", Queue: "q-python", Runners: []string{"python"},
			ExtraTOML: fmt.Sprintf("[runners.python]\npython = %q\n", python)})
		want, _ := messages.Marshal(int64(42))
		inv, r := runInv(t, cp, "--queue", "q-python", "--runner", "python", "--workdir", workdir, "--args-json", "[6, 7]", "nymph_e2e_mod:mul")
		expectSucceeded(t, "python", inv, r, want)
		r = cp.CLI(t, "run", "--queue", "q-python", "--runner", "python", "--workdir", workdir, "nymph_e2e_mod:where")
		expectCode(t, r, 0)
		if !strings.Contains(r.Stdout, workdir) {
			t.Fatalf("python ran outside the workdir: %s", r.Stdout)
		}
	})

	t.Run("docker", func(t *testing.T) {
		t.Parallel()
		image := realparts.PodmanImage(t)
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-docker", Queue: "q-docker", Runners: []string{"docker"}, ExtraTOML: podmanTOML()})
		inv, r := runInv(t, cp, "--queue", "q-docker", "--runner", "docker", "--image", image, "--args-file", argsFile, "--script", script)
		expectSucceeded(t, "docker", inv, r, args)
		// Inside the image: busybox is the only binary there.
		inv, r = runInv(t, cp, "--queue", "q-docker", "--runner", "docker", "--image", image, "--script",
			writeTemp(t, "inside.sh", []byte(`readlink /bin/sh > "$NYMPH_RESULT_PATH"`)))
		expectSucceeded(t, "docker image", inv, r, []byte("busybox\n"))
	})

	t.Run("gvisor", func(t *testing.T) {
		t.Parallel()
		runsc := realparts.Runsc(t)
		image := realparts.PodmanImage(t)
		global := append([]string{"--runtime", runsc, "--runtime-flag", "network=none"}, realparts.PodmanGlobalArgs()[2:]...)
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-gvisor", Queue: "q-gvisor", Runners: []string{"gvisor"},
			ExtraTOML: fmt.Sprintf("[runners.gvisor]\nrunsc = %q\ncli = \"podman\"\ncontainer_global_args = %s\ncontainer_run_args = %s\nkill_grace_s = 1\n",
				runsc, tomlStrings(global), tomlStrings(append(realparts.PodmanRunArgs(), "--pull=never")))})
		inv, r := runInv(t, cp, "--queue", "q-gvisor", "--runner", "gvisor", "--args-file", argsFile, "--script", script)
		expectSucceeded(t, "gvisor", inv, r, args)
		// Both forms really run in the sandbox: its kernel log is gVisor's.
		dmesg := writeTemp(t, "dmesg.sh", []byte(`dmesg > "$NYMPH_RESULT_PATH" 2>&1 || true`))
		for _, img := range []string{"", image} {
			inv, r = runInv(t, cp, "--queue", "q-gvisor", "--runner", "gvisor", "--image", img, "--script", dmesg)
			if r.Code != 0 || inv.State != operatorapi.InvocationSucceeded || !strings.Contains(string(inv.Result), "gVisor") {
				t.Fatalf("gvisor (image %q): exit %d %s %+v result %q\n%s", img, r.Code, inv.State, inv.Error, truncated(inv.Result), r.Stderr)
			}
		}
	})

	t.Run("slurm", func(t *testing.T) {
		t.Parallel()
		cluster := realparts.StartSlurm(t)
		cp.StartDaemon(t, harness.DaemonOptions{Label: "run-slurm", Queue: "q-slurm", Runners: []string{"slurm"},
			ExtraTOML: fmt.Sprintf("[runners.slurm]\nsrun_args = [%q]\nenv = %s\nkill_grace_s = 1\n",
				"--partition="+cluster.Partition, tomlStrings(cluster.Env()))})
		inv, r := runInv(t, cp, "--queue", "q-slurm", "--runner", "slurm", "--args-file", argsFile, "--script", script)
		expectSucceeded(t, "slurm", inv, r, args)
		inv, r = runInv(t, cp, "--queue", "q-slurm", "--runner", "slurm", "--script",
			writeTemp(t, "job.sh", []byte(`printf '%s %s' "$SLURM_JOB_NAME" "$SLURM_JOB_PARTITION" > "$NYMPH_RESULT_PATH"`)))
		expectSucceeded(t, "slurm job", inv, r, []byte("nymph-"+inv.ID+" "+cluster.Partition))
	})
}

// A function that fails gives a structured error, in `invocations show`
// and in the CLI's exit code; so does a script that exits non-zero.
func TestRunFailingFunction(t *testing.T) {
	t.Parallel()
	python := realparts.RequireTool(t, "python3")[0]
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	workdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(workdir, "nymph_e2e_mod.py"), []byte(pyModule), 0o644); err != nil {
		t.Fatal(err)
	}
	cp.StartDaemon(t, harness.DaemonOptions{Label: "failing", Runners: []string{"python", "process"},
		ExtraTOML: fmt.Sprintf("[runners.python]\npython = %q\n", python)})

	r := cp.CLI(t, "run", "--runner", "python", "--workdir", workdir, "--args-json", `["no luck"]`, "nymph_e2e_mod:boom")
	expectCode(t, r, 1)
	if !strings.Contains(r.Stderr, "ValueError") || !strings.Contains(r.Stderr, "no luck") {
		t.Fatalf("CLI does not say what failed:\n%s", r.Stderr)
	}
	list := mustJSON[operatorapi.InvocationList](t, cp.CLI(t, "invocations", "list", "--state", "failed", "--json"))
	if len(list.Invocations) != 1 {
		t.Fatalf("failed invocations: %+v", list.Invocations)
	}
	inv := showInv(t, cp, list.Invocations[0].ID)
	e := inv.Error
	if inv.State != operatorapi.InvocationFailed || e == nil || e.Type != "ValueError" || e.Message != "no luck" ||
		e.Traceback == nil || !strings.Contains(*e.Traceback, "boom") || len(inv.Result) != 0 || inv.WorkerLabel != "failing" {
		t.Fatalf("show: %+v error %+v", inv, e)
	}

	inv, r = runInv(t, cp, "--runner", "process", "--script", writeTemp(t, "fail.sh", []byte("echo to-stderr >&2; exit 3")))
	if r.Code != 1 || inv.State != operatorapi.InvocationFailed || inv.Error == nil || inv.Error.Type != "NonZeroExit" ||
		!strings.Contains(inv.Error.Message, "exit status 3") || !strings.Contains(inv.Error.Message, "to-stderr") {
		t.Fatalf("script failure: exit %d %+v %+v", r.Code, inv, inv.Error)
	}
	// A timeout kills the function: exit 2, state killed.
	inv, r = runInv(t, cp, "--runner", "process", "--timeout", "0.5", "--script", writeTemp(t, "slow.sh", []byte("sleep 30")))
	if r.Code != 2 || inv.State != operatorapi.InvocationKilled || inv.Error == nil || inv.Error.Type != "Timeout" {
		t.Fatalf("timeout: exit %d %+v %+v", r.Code, inv, inv.Error)
	}
}

// A daemon SIGKILLed mid-run and not started again: once it has been
// silent for --lost-after its invocation is failed, not left running.
func TestRunDaemonKilledMidRun(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--stale-after", "2s", "--lost-after", "2s"}})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "doomed", Runners: []string{"process"}, WaitMaxS: 1})
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	id := submitInv(t, cp, "--runner", "process", "--env", key+"="+value, "--script",
		writeTemp(t, "long.sh", []byte("echo started; sleep 60")))
	waitInvState(t, cp, id, operatorapi.InvocationRunning, 30*time.Second)
	wait.For(t, 30*time.Second, "the run's process", func() bool {
		pids, err := orphans.WithEnv("/proc", key+"="+value)
		return err == nil && len(pids) > 0
	})
	d.Kill()
	start := time.Now()
	inv := waitInvState(t, cp, id, operatorapi.InvocationFailed, 60*time.Second)
	if inv.Error == nil || inv.Error.Type != operatorapi.ErrorTypeWorkerLost || !strings.Contains(inv.Error.Message, "doomed") && !strings.Contains(inv.Error.Message, inv.WorkerID) {
		t.Fatalf("lost invocation: %+v", inv.Error)
	}
	t.Logf("failed %v after the SIGKILL: %s", time.Since(start).Round(time.Millisecond), inv.Error.Message)
	r := cp.CLI(t, "run", "--wait", "1", "--runner", "process", "--script", writeTemp(t, "noop.sh", []byte("true")))
	if r.Code == 0 {
		t.Fatal("a run with no live daemon succeeded")
	}
}

// SIGTERM while runs are going: after the grace they are acked killed
// with {Cancelled, "daemon shutdown grace expired"}, and no process or
// container is left.
func TestRunSIGTERMCancels(t *testing.T) {
	t.Parallel()
	image := realparts.PodmanImage(t)
	podman := realparts.RequireTool(t, "podman")[0]
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	// The stdout tail travels on polls: poll often.
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "terminated", Runners: []string{"process", "docker"}, GraceS: 1, WaitMaxS: 1,
		ExtraTOML: podmanTOML() + "[runners.process]\nkill_grace_s = 1\n"})
	key, value := runMark(t)
	t.Cleanup(func() { killMarked(key, value) })
	// 10 000 bytes of output first: the stdout tail keeps the last 4 KiB.
	long := writeTemp(t, "long.sh", []byte("head -c 10000 /dev/zero | tr '\\0' x; echo; echo started; sleep 60"))
	procID := submitInv(t, cp, "--runner", "process", "--env", key+"="+value, "--script", long)
	dockID := submitInv(t, cp, "--runner", "docker", "--image", image, "--env", key+"="+value, "--script", long)
	container := "nymph-" + dockID
	psNames := func() string {
		out, _ := exec.Command(podman, append(realparts.PodmanGlobalArgs(), "ps", "-a", "--format", "{{.Names}}")...).Output()
		return string(out)
	}
	for _, id := range []string{procID, dockID} {
		waitInvState(t, cp, id, operatorapi.InvocationRunning, 60*time.Second)
	}
	wait.For(t, 60*time.Second, "the container and the process to run", func() bool {
		if !strings.Contains(psNames(), container) {
			return false
		}
		pids, err := orphans.WithEnv("/proc", key+"="+value)
		return err == nil && len(pids) >= 2
	})
	for _, id := range []string{procID, dockID} {
		wait.For(t, 30*time.Second, "the output of "+id+" in its stdout tail", func() bool {
			tail := showInv(t, cp, id).StdoutTail
			if len(tail) > 4096 {
				t.Fatalf("stdout tail of %d bytes, want at most 4 KiB", len(tail))
			}
			return strings.HasSuffix(tail, strings.Repeat("x", 100)+"\nstarted\n")
		})
		if n := len(showInv(t, cp, id).StdoutTail); n != 4096 {
			t.Fatalf("stdout tail of %s holds %d bytes of 10 009, want the last 4096", id, n)
		}
	}

	d.Signal(syscall.SIGTERM)
	if code := waitExit(t, d, 60*time.Second); code != 0 {
		t.Fatalf("nymph exit %d", code)
	}
	for _, id := range []string{procID, dockID} {
		inv := waitInvState(t, cp, id, operatorapi.InvocationKilled, 30*time.Second)
		if inv.Error == nil || inv.Error.Type != "Cancelled" || inv.Error.Message != "daemon shutdown grace expired" {
			t.Fatalf("%s: %+v", id, inv.Error)
		}
	}
	if pids, err := orphans.WithEnv("/proc", key+"="+value); err != nil || len(pids) != 0 {
		t.Fatalf("processes left after the shutdown: %v %v", pids, err)
	}
	if names := psNames(); strings.Contains(names, container) {
		t.Fatalf("container left after the shutdown: %s", names)
	}
}

// A 10 MiB argument travels through the payload store, checked by sha256
// on the daemon, and reaches the function whole (stdin and args file).
func TestRunLargeArgsThroughPayload(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "large", Runners: []string{"process", "echo"}})
	data := randBytes(t, 10<<20)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	argsFile := writeTemp(t, "large.bin", data)
	script := writeTemp(t, "sum.sh", []byte(`a=$(sha256sum | cut -c1-64); b=$(sha256sum < "$NYMPH_ARGS_PATH" | cut -c1-64)
[ "$a" = "$b" ] || { echo "stdin $a, file $b" >&2; exit 3; }
printf %s "$a" > "$NYMPH_RESULT_PATH"`))
	inv, r := runInv(t, cp, "--runner", "process", "--args-file", argsFile, "--script", script)
	expectSucceeded(t, "large args", inv, r, []byte(want))
	if inv.ArgsKey == "" || inv.ArgsSize != 10<<20 {
		t.Fatalf("args did not go through the payload store: key %q size %d", inv.ArgsKey, inv.ArgsSize)
	}
}

// A payload whose bytes no longer match their sha256 fails the invocation
// before anything is spawned.
func TestRunCorruptedPayloadSpawnsNothing(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	marker := filepath.Join(t.TempDir(), "spawned")
	data := randBytes(t, 300<<10)
	id := submitInv(t, cp, "--queue", "corrupt", "--runner", "process", "--args-file", writeTemp(t, "args.bin", data),
		"--script", writeTemp(t, "touch.sh", []byte("touch "+marker)))
	inv := showInv(t, cp, id)
	if inv.ArgsKey == "" {
		t.Fatalf("300 KiB args not in the payload store: %+v", inv)
	}
	blob := filepath.Join(cp.DataDir, "payloads", "default", inv.ArgsKey)
	stored, err := os.ReadFile(blob)
	if err != nil || !bytes.Equal(stored, data) {
		t.Fatalf("payload blob %s: %v (equal %v)", blob, err, bytes.Equal(stored, data))
	}
	stored[len(stored)/2] ^= 0xff
	if err := os.WriteFile(blob, stored, 0o600); err != nil {
		t.Fatal(err)
	}
	cp.StartDaemon(t, harness.DaemonOptions{Label: "careful", Queue: "corrupt", Runners: []string{"process"}})
	inv = waitInvState(t, cp, id, operatorapi.InvocationFailed, 60*time.Second)
	if inv.Error == nil || inv.Error.Type != messages.ErrorTypeDaemon || !strings.Contains(inv.Error.Message, "sha256 mismatch") {
		t.Fatalf("corrupted payload: %+v", inv.Error)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the function ran on corrupted args")
	}
}

// Bad input: a clear error from the CLI (refused before submission) or on
// the invocation, never a hang.
func TestRunBadInput(t *testing.T) {
	t.Parallel()
	realparts.PodmanImage(t) // builds the image the missing one is compared with
	python := realparts.RequireTool(t, "python3")[0]
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "picky", Runners: []string{"process", "docker", "python"},
		ExtraTOML: podmanTOML() + fmt.Sprintf("[runners.python]\npython = %q\n", python)})
	workdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(workdir, "nymph_e2e_mod.py"), []byte(pyModule), 0o644); err != nil {
		t.Fatal(err)
	}

	refused := func(what string, wantCode int, wantErr string, args ...string) {
		t.Helper()
		r := cp.CLI(t, append([]string{"run"}, args...)...)
		if r.Code != wantCode || !strings.Contains(r.Stderr, wantErr) {
			t.Errorf("%s: exit %d (want %d), stderr %q (want %q)", what, r.Code, wantCode, r.Stderr, wantErr)
		}
	}
	refused("unknown runner", 1, `runConfig.runner`, "--runner", "teleport", "m:f")
	refused("unknown runner names it", 1, `teleport`, "--runner", "teleport", "m:f")
	refused("docker without image", 1, "runConfig.image", "--runner", "docker", "m:f")
	refused("malformed --args-json", 2, "--args-json: not valid JSON", "--runner", "echo", "--args-json", "{bad", "m:f")
	refused("not module:qualname", 1, "function", "--runner", "python", ":f")
	big := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, messages.MaxPayload+1); err != nil {
		t.Fatal(err)
	}
	refused("over-size args", 1, "payload limit", "--runner", "process", "--args-file", big, "m:f")
	if n := len(mustJSON[operatorapi.InvocationList](t, cp.CLI(t, "invocations", "list", "--json")).Invocations); n != 0 {
		t.Errorf("%d invocations created by refused input", n)
	}

	// Accepted, then failed clearly on the daemon.
	missing := "localhost/nymph-e2e-missing:" + hex.EncodeToString(randBytes(t, 4))
	inv, r := runInv(t, cp, "--runner", "docker", "--image", missing, "true")
	if r.Code != 1 || inv.State != operatorapi.InvocationFailed || inv.Error == nil || !strings.Contains(inv.Error.Message, missing) {
		t.Errorf("missing image: exit %d %s %+v", r.Code, inv.State, inv.Error)
	}
	inv, r = runInv(t, cp, "--runner", "python", "--workdir", workdir, "--args-file", writeTemp(t, "bad.bin", []byte{0xc1, 0x00}), "nymph_e2e_mod:mul")
	if r.Code != 1 || inv.State != operatorapi.InvocationFailed || inv.Error == nil || !strings.Contains(strings.ToLower(inv.Error.Message), "msgpack") {
		t.Errorf("malformed msgpack args: exit %d %s %+v", r.Code, inv.State, inv.Error)
	}
	inv, r = runInv(t, cp, "--runner", "python", "--workdir", workdir, "nymph_e2e_mod:nosuch")
	if r.Code != 1 || inv.State != operatorapi.InvocationFailed || inv.Error == nil || !strings.Contains(inv.Error.Message, "nosuch") {
		t.Errorf("unknown function: exit %d %s %+v", r.Code, inv.State, inv.Error)
	}
}
