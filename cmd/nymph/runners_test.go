package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/messages"
	"nymph/runners/docker"
	"nymph/test/fakecp"
)

// fakeTool writes an executable shell script that records its name, a
// chosen variable and its arguments (one per line) in a file of its own
// under logDir, then runs tail. One file per call: the runners start these
// tools concurrently, and appends to one shared file would interleave.
func fakeTool(t *testing.T, dir, name, logDir, tail string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	script := fmt.Sprintf("#!/bin/sh\n{ echo \"== %s conf=$SLURM_CONF\"; for a in \"$@\"; do echo \"$a\"; done; } > %q/%s.$$\n%s\n", name, logDir, name, tail)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The [runners.<kind>] tables reach the runners: the configured binaries
// run, with their global and run flags in place, and the hello advertises
// every kind whose configured binary exists.
func TestRunnerSettingsReachTheRunners(t *testing.T) {
	cp := fakecp.New(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "calls")
	if err := os.Mkdir(log, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	python3, err := lookPython()
	if err != nil {
		t.Skip(err)
	}
	python := fakeTool(t, bin, "my-python", log, fmt.Sprintf("exec %s \"$@\"", python3))
	cli := fakeTool(t, bin, "my-docker", log, "exit 0")
	gcli := fakeTool(t, bin, "my-gvisor-cli", log, "exit 0")
	runsc := fakeTool(t, bin, "my-runsc", log, "exit 0")
	// srun: skip its own flags and run the command.
	fakeTool(t, bin, "srun", log, "while [ \"${1#--}\" != \"$1\" ]; do shift; done\nexec \"$@\"")

	p := writeConfigIn(t, dir, cp.URL, fmt.Sprintf(`[daemon]
machine_id = "runner-host"

[runtime]
runners = ["process", "echo", "python", "docker", "gvisor", "slurm"]
workdir = "work"

[runners.python]
python = %q

[runners.docker]
cli = %q
global_args = ["--global-flag", "g1"]
run_args = ["--network=none"]
kill_grace_s = 1

[runners.gvisor]
runsc = %q
global_args = ["--platform=systrap"]
cli = %q
container_global_args = ["--runtime", "/usr/bin/runsc"]
container_run_args = ["--gvisor-run-flag"]

[runners.slurm]
bin_dir = %q
srun_args = ["--partition=debug"]
env = ["SLURM_CONF=/etc/slurm/test.conf"]`, python, cli, runsc, gcli, bin))
	start(t, nil, "run", "--config", p)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	caps := cp.Hellos()[0].Capabilities.Runners
	for _, k := range []string{"process", "echo", "python", "docker", "gvisor", "slurm"} {
		if !slices.Contains(caps, k) {
			t.Errorf("hello does not advertise %s: %v", k, caps)
		}
	}

	workdir := t.TempDir()
	if err := os.WriteFile(filepath.Join(workdir, "mod.py"), []byte("def f(x):\n    return x * 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args, _ := messages.Marshal([]any{21})
	cp.QueueRun(messages.Run{InvocationID: "py", Function: messages.FunctionRef{Module: "mod", Qualname: "f"},
		RunConfig: messages.RunConfig{Runner: ptr("python"), Workdir: workdir}, ArgsBlob: args})
	cp.QueueRun(messages.Run{InvocationID: "dock", Function: messages.FunctionRef{Module: "true"},
		RunConfig: messages.RunConfig{Runner: ptr("docker"), Image: "img:1"}})
	cp.QueueRun(messages.Run{InvocationID: "gv", Function: messages.FunctionRef{Module: "true"},
		RunConfig: messages.RunConfig{Runner: ptr("gvisor")}})
	cp.QueueRun(messages.Run{InvocationID: "gv-img", Function: messages.FunctionRef{Module: "true"},
		RunConfig: messages.RunConfig{Runner: ptr("gvisor"), Image: "img:2"}})
	cp.QueueRun(messages.Run{InvocationID: "sl", Script: ptr(`printf slurm > "$NYMPH_RESULT_PATH"`),
		RunConfig: messages.RunConfig{Runner: ptr("slurm")}})
	cp.Wait(30*time.Second, "5 acks", func() bool { return len(cp.Acks()) == 5 })
	acks := map[string]messages.Ack{}
	for _, a := range cp.Acks() {
		acks[a.InvocationID] = a
		if a.State != messages.StateSucceeded {
			t.Errorf("%s: %s %+v", a.InvocationID, a.State, a.Error)
		}
	}
	var got int64
	if err := messages.Unmarshal(acks["py"].ResultBlob, &got); err != nil || got != 42 {
		t.Errorf("python result %v %v", got, err)
	}
	if string(acks["sl"].ResultBlob) != "slurm" {
		t.Errorf("slurm result %q", acks["sl"].ResultBlob)
	}

	files, err := os.ReadDir(log)
	if err != nil {
		t.Fatal(err)
	}
	// A tool may be called more than once (a container CLI is also asked to
	// remove its container); every call is kept.
	calls := map[string][][]string{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(log, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimPrefix(strings.TrimSpace(string(b)), "== "), "\n")
		name := strings.Fields(lines[0])[0]
		calls[name] = append(calls[name], lines)
	}
	expectSeq(t, "python", calls["my-python"], "nymph_shim.py", "mod", "f")
	expectSeq(t, "docker", calls["my-docker"], "--global-flag", "g1", "run", "--rm", "-i", "--name", "nymph-dock", "--network=none")
	expectSeq(t, "docker image", calls["my-docker"], "img:1", "true")
	expectSeq(t, "runsc", calls["my-runsc"], "--network=none", "--platform=systrap", "do")
	expectSeq(t, "gvisor cli", calls["my-gvisor-cli"], "--runtime", "/usr/bin/runsc", "run", "--rm", "-i", "--name", "nymph-gv-img", "--gvisor-run-flag")
	expectSeq(t, "srun", calls["srun"], "--partition=debug")
	if len(calls["srun"]) == 0 || !strings.Contains(calls["srun"][0][0], "conf=/etc/slurm/test.conf") {
		t.Errorf("srun did not get SLURM_CONF: %q", calls["srun"])
	}
	// The daemon's orphan mark reaches the runners whose work outlives a
	// killed daemon, so its next start can end that work.
	mark := orphans.Marker(filepath.Join(dir, "work"))
	expectSeq(t, "docker owner label", calls["my-docker"], "--label", docker.OwnerLabel+"="+mark)
	expectSeq(t, "gvisor cli owner label", calls["my-gvisor-cli"], "--label", docker.OwnerLabel+"="+mark)
	host, _ := os.Hostname()
	expectSeq(t, "srun owner comment", calls["srun"], "--comment="+mark+"@"+host)
}

// expectSeq checks that want appears as a contiguous run in the arguments
// of one of the calls (the first entry matched as a suffix, for paths).
func expectSeq(t *testing.T, what string, calls [][]string, want ...string) {
	t.Helper()
	for _, got := range calls {
		for i := range got {
			if i+len(want) > len(got) || !strings.HasSuffix(got[i], want[0]) {
				continue
			}
			if slices.Equal(got[i+1:i+len(want)], want[1:]) {
				return
			}
		}
	}
	got := calls
	t.Errorf("%s: %q not found in %q", what, want, got)
}

func lookPython() (string, error) {
	return exec.LookPath("python3")
}
