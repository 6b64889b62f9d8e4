package e2e

import (
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
)

// A single-job nymph (keep_alive_s = 0) against the real control plane:
// it runs the one exec an operator sends it, exits 0, and the control plane
// refuses the next exec aimed at it, saying why.
func TestSingleJobDaemonTakesOneExecAndExits(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "solo", SingleJob: true})
	w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "solo", "--json"))
	if !w.SingleJob || w.SingleJobTaken {
		t.Fatalf("before its job: %+v", w)
	}
	r := cp.CLI(t, "daemon", "exec", "solo", "echo", "only")
	expectCode(t, r, 0)
	if r.Stdout != "only\n" {
		t.Fatalf("exec stdout %q", r.Stdout)
	}
	select {
	case <-d.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the single-job daemon did not exit after its job\n%s", d.Log())
	}
	if code := d.ExitCode(); code != 0 {
		t.Fatalf("exit %d\n%s", code, d.Log())
	}
	r = cp.CLI(t, "daemon", "show", "solo")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "single job:") || !strings.Contains(r.Stdout, "has its job and takes no other") {
		t.Fatalf("daemon show:\n%s", r.Stdout)
	}
	r = cp.CLI(t, "daemon", "exec", "solo", "true")
	if r.Code == 0 || !strings.Contains(r.Stderr, "single-job (keep_alive_s = 0) and already took its job (exec ") {
		t.Fatalf("second exec: code %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}
