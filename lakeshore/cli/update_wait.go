package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// updateCheckEvery is how often `daemon update --wait` reads the daemons
// back: the operator API has no long-poll for a version change.
const updateCheckEvery = time.Second

// defaultUpdateWait bounds `daemon update --wait`: long enough for a daemon
// to finish its running jobs, download and restart.
const defaultUpdateWait = 10 * time.Minute

// reportedVersion is the nymph version a worker said in its last hello.
func reportedVersion(w operatorapi.Worker) string {
	var v struct {
		Daemon *string `json:"daemon"`
	}
	if json.Unmarshal(w.Versions, &v) != nil || v.Daemon == nil {
		return ""
	}
	return *v.Daemon
}

// refusal is why the daemon refused the ota_update commandID, or "".
func refusal(w operatorapi.Worker, commandID string) string {
	for _, o := range w.Outcomes {
		if o.CommandID != commandID || o.Ota == nil || o.Ota.Outcome != messages.OtaRefused {
			continue
		}
		if o.Ota.Reason != nil && *o.Ota.Reason != "" {
			return *o.Ota.Reason
		}
		return "refused (" + o.Ota.Code + ")"
	}
	return ""
}

// waitForVersions waits, reading the daemons back every updateCheckEvery,
// until each outcome with a queued update reports its version or refuses
// it, or until the wait is over. It fills in ReportedVersion and WaitError
// and returns how many report the new version. A progress line shows on a
// terminal meanwhile.
func (a *app) waitForVersions(ctx context.Context, c *opclient.Client, outs []UpdateOutcome, within time.Duration) (int, error) {
	pending := map[int]bool{}
	for i, o := range outs {
		if o.OK && o.Update != nil {
			pending[i] = true
		}
	}
	total, updated := len(pending), 0
	prog := startProgress(a.env.Stderr, a.env.StderrTTY, fmt.Sprintf("waiting for %s to report the new version", plural(total, "daemon")))
	defer prog.Stop()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(updateCheckEvery)
	defer tick.Stop()
	for len(pending) > 0 {
		for i := range pending {
			o := &outs[i]
			w, err := c.GetWorker(ctx, o.WorkerID)
			if err != nil {
				if ctx.Err() != nil {
					return updated, ctx.Err()
				}
				if opclient.IsNotFound(err) {
					o.WaitError = "removed from the control plane while updating"
					delete(pending, i)
				}
				continue // a passing error: read it again on the next round
			}
			o.ReportedVersion = reportedVersion(w)
			switch why := refusal(w, o.Update.CommandID); {
			case o.ReportedVersion == o.Update.Version:
				updated++
				delete(pending, i)
			case why != "":
				o.WaitError = "refused the update: " + why
				delete(pending, i)
			}
		}
		prog.Set(fmt.Sprintf("waiting for %d of %s to report the new version", len(pending), plural(total, "daemon")))
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return updated, ctx.Err()
		case <-deadline.C:
			for i := range pending {
				o := &outs[i]
				now := o.ReportedVersion
				if now == "" {
					now = "no version"
				}
				o.WaitError = fmt.Sprintf("still reports %s after %s; its update is queued for its next poll, or it has not restarted yet", now, span(within))
			}
			return updated, nil
		case <-tick.C:
		}
	}
	return updated, nil
}

// waitReport prints how the wait ended for each daemon, and the summary.
func waitReport(out io.Writer, outs []UpdateOutcome, updated, asked int) {
	for _, o := range outs {
		switch {
		case o.OK && o.Update != nil && o.WaitError == "":
			fmt.Fprintf(out, "%s: now runs nymph %s\n", o.Label, o.ReportedVersion)
		case o.WaitError != "":
			fmt.Fprintf(out, "%s: not updated: %s\n", o.Label, o.WaitError)
		}
	}
	fmt.Fprintf(out, "%d of %s updated\n", updated, plural(asked, "daemon"))
}
