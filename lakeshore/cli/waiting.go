package cli

import (
	"fmt"
	"time"

	"nymph/lakeshore/operatorapi"
)

// warnWaiting says, before a wait that may be long, why nothing may pick a
// job up yet: why is the cause, job the job ("exec 01H…"), until what it
// waits for. run and daemon exec use the same words for the same case.
func (a *app) warnWaiting(why, job, until string) {
	fmt.Fprintf(a.env.Stderr, "lakeshore: %s; %s waits for %s (Ctrl-C cancels it)\n", why, job, until)
}

// targetNotReady is why an exec queued for one daemon may not run soon, or
// "" when the daemon was ready to take it: it is hibernating, stale, or in
// any state but active. The control plane tells the state as it queued the
// exec (operatorapi.ExecAccepted).
func targetNotReady(acc operatorapi.ExecAccepted, where string, now time.Time) string {
	switch {
	case acc.HibernatingUntil != nil && acc.HibernatingUntil.After(now):
		return fmt.Sprintf("%s is hibernating until %s (%s)", where, acc.HibernatingUntil.Local().Format(time.RFC3339), ago(now, *acc.HibernatingUntil))
	case acc.WorkerState == operatorapi.StateStale:
		seen := "a while ago"
		if acc.LastSeenAt != nil {
			seen = ago(now, *acc.LastSeenAt)
		}
		return fmt.Sprintf("%s is stale (last seen %s): it may be down or cut off", where, seen)
	case acc.WorkerState != "" && acc.WorkerState != operatorapi.StateActive:
		return fmt.Sprintf("%s is %s, not active", where, acc.WorkerState)
	}
	return ""
}

// gaveUp is the error of a --wait that ran out (exit 253): what gave up,
// and the job's state as last read, in words that say what may still
// happen. state "" is a state that could not be read.
func gaveUp(wait, job, state string) error {
	var what string
	switch state {
	case "":
		what = "was not read (the control plane did not answer); it may still run"
	case operatorapi.ExecQueued: // operatorapi.InvocationQueued too
		what = "is still queued: no daemon has picked it up yet, and one may still run it"
	case operatorapi.ExecRunning: // operatorapi.InvocationRunning too
		what = "is running and may still finish"
	default:
		what = "is " + state
	}
	return exitWith(ExitExecWaitExpired, fmt.Errorf("gave up after --wait %s; %s %s", wait, job, what))
}
