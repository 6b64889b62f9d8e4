package e2e

import (
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/wait"
)

// TestRunAndExecShareQueueMembership: a real nymph polling gpu that an
// operator adds to training takes both exec --queue training and run
// --queue training; one routing rule for both.
func TestRunAndExecShareQueueMembership(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "gpu-1", Queue: "gpu", Runners: []string{"echo"}})
	gpu := cp.WaitForWorker(t, "gpu-1")
	wait.For(t, 30*time.Second, "gpu-1 to poll queue gpu", func() bool {
		for _, w := range cp.Workers(t) {
			if w.ID == gpu.ID && w.PollQueue == "gpu" {
				return true
			}
		}
		return false
	})
	expectCode(t, cp.CLI(t, "queue", "create", "training"), 0)
	expectCode(t, cp.CLI(t, "daemon", "update", "gpu-1", "--add-queue", "training"), 0)

	env := mustJSON[execEnvelope](t, cp.CLI(t, "exec", "--queue", "training", "--json", "echo routed"))
	if env.WorkerID != gpu.ID || env.Result == nil || env.Result.Stdout != "routed\n" {
		t.Fatalf("exec --queue training went to %s (want %s): %+v", env.WorkerID, gpu.ID, env.Result)
	}
	inv, r := runInv(t, cp, "--queue", "training", "--runner", "echo", "--args-json", `{"x": 1}`, "m:f")
	if inv.State != operatorapi.InvocationSucceeded || inv.WorkerID != gpu.ID || strings.Contains(r.Stderr, "no daemon") {
		t.Fatalf("run --queue training: %+v (stderr %q)", inv, r.Stderr)
	}
}
