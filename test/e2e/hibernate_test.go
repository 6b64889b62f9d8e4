package e2e

import (
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/wait"
)

// commandState is the state of one of a daemon's commands ("" once
// withdrawn).
func commandState(t *testing.T, cp *harness.ControlPlane, daemon, id string) string {
	t.Helper()
	for _, c := range mustJSON[[]operatorapi.CommandInfo](t, cp.CLI(t, "daemon", "commands", daemon, "--json")) {
		if c.ID == id {
			return c.State
		}
	}
	return ""
}

// A real nymph hibernating for an hour: a second hibernate queued behind
// it does not change the deadline shown, and `daemon wake` ends the
// hibernation at once: the daemon polls again (it acknowledges the wake),
// the queued hibernate is withdrawn, and an exec runs.
func TestHibernateInForceAndWake(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "sleeper"})

	first := mustJSON[operatorapi.Queued](t, cp.CLI(t, "daemon", "hibernate", "sleeper", "--until", "+1h", "--json"))
	// The hibernate is acknowledged by the daemon's next poll: its watch
	// poll, opened as it starts to sleep.
	wait.For(t, 30*time.Second, "the daemon to hibernate and open its watch poll", func() bool {
		return commandState(t, cp, "sleeper", first.CommandID) == "acked"
	})
	inForce := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "sleeper", "--json")).Hibernating
	if inForce == nil || inForce.Sub(time.Now()) < 50*time.Minute {
		t.Fatalf("hibernating until %v, want about an hour from now", inForce)
	}
	second := mustJSON[operatorapi.Queued](t, cp.CLI(t, "daemon", "hibernate", "sleeper", "--until", "+3h", "--json"))
	w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "sleeper", "--json"))
	if w.Hibernating == nil || !w.Hibernating.Equal(*inForce) {
		t.Fatalf("with a second hibernate queued, shown until %v; the one in force is %v", w.Hibernating, inForce)
	}
	if r := cp.CLI(t, "daemon", "list"); !strings.Contains(r.Stdout, "(hibernating 1h)") {
		t.Fatalf("daemon list does not show the hibernation in force (1h):\n%s", r.Stdout)
	}

	woke := time.Now()
	r := cp.CLI(t, "daemon", "wake", "sleeper")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "woke sleeper") || !strings.Contains(r.Stdout, inForce.Local().Format(time.RFC3339)) {
		t.Fatalf("wake says:\n%s", r.Stdout)
	}
	wake := strings.TrimSuffix(r.Stdout[strings.LastIndex(r.Stdout, "(command ")+len("(command "):], ")\n")
	wait.For(t, 30*time.Second, "the woken daemon to poll again (acknowledging the wake)", func() bool {
		return commandState(t, cp, "sleeper", wake) == "acked"
	})
	t.Logf("from wake to the daemon's next poll: %v (CLI calls included)", time.Since(woke))
	if s := commandState(t, cp, "sleeper", second.CommandID); s != "" {
		t.Fatalf("the hibernate queued behind the one in force is %q, want withdrawn", s)
	}
	if w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", "sleeper", "--json")); w.Hibernating != nil {
		t.Fatalf("woken, still shown hibernating until %v", w.Hibernating)
	}
	r = cp.CLI(t, "daemon", "exec", "sleeper", "echo awake")
	expectCode(t, r, 0)
	if r.Stdout != "awake\n" {
		t.Fatalf("exec after the wake: %q", r.Stdout)
	}

	// On an awake daemon a wake changes nothing but says so.
	r = cp.CLI(t, "daemon", "wake", "sleeper")
	expectCode(t, r, 0)
	if !strings.Contains(r.Stdout, "was not hibernating") {
		t.Fatalf("wake of an awake daemon says:\n%s", r.Stdout)
	}
}
