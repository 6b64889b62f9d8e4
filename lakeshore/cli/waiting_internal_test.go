package cli

import (
	"errors"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
)

// TestGaveUpNamesTheState: a --wait that runs out says what the job is
// doing, and "not read" only when its state could not be read.
func TestGaveUpNamesTheState(t *testing.T) {
	for state, want := range map[string]string{
		operatorapi.ExecQueued:          "exec e1 is still queued: no daemon has picked it up yet",
		operatorapi.ExecRunning:         "exec e1 is running and may still finish",
		operatorapi.InvocationCancelled: "exec e1 is cancelled",
		"":                              "exec e1 was not read (the control plane did not answer)",
	} {
		err := gaveUp("2s", "exec e1", state)
		var ex *exitError
		if !errors.As(err, &ex) || ex.code != ExitExecWaitExpired || !strings.Contains(err.Error(), "gave up after --wait 2s; "+want) {
			t.Errorf("state %q: %v", state, err)
		}
	}
}

// TestTargetNotReady: the reasons an exec to one daemon may wait, and none
// for an active, awake one.
func TestTargetNotReady(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	later, before := now.Add(90*time.Minute), now.Add(-3*time.Minute)
	for _, c := range []struct {
		acc  operatorapi.ExecAccepted
		want string
	}{
		{operatorapi.ExecAccepted{WorkerState: operatorapi.StateActive}, ""},
		{operatorapi.ExecAccepted{}, ""},
		{operatorapi.ExecAccepted{WorkerState: operatorapi.StateActive, HibernatingUntil: &later}, "d is hibernating until " + later.Local().Format(time.RFC3339) + " (in 1h30m)"},
		{operatorapi.ExecAccepted{WorkerState: operatorapi.StateActive, HibernatingUntil: &before}, ""},
		{operatorapi.ExecAccepted{WorkerState: operatorapi.StateStale, LastSeenAt: &before}, "d is stale (last seen 3m ago)"},
		{operatorapi.ExecAccepted{WorkerState: operatorapi.StateSettingUp}, "d is setting_up, not active"},
	} {
		got := targetNotReady(c.acc, "d", now)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.acc, got, c.want)
		}
	}
}
