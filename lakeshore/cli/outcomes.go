package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// outcomeTailLines bounds the output tail `daemon show` prints of a failed
// setup.
const outcomeTailLines = 10

// setupFailure is what a daemon's state says about its newest setup: empty
// unless it failed.
func setupFailure(o *operatorapi.WorkerOutcome) string {
	if o == nil || o.Setup == nil || o.Setup.State == messages.StateSucceeded {
		return ""
	}
	if o.Setup.ExitCode == messages.ExitFailed && o.Setup.Error != nil {
		return "setup failed (could not run)"
	}
	return fmt.Sprintf("setup failed (exit %d)", o.Setup.ExitCode)
}

// workerOutcomeText is one outcome in a line.
func workerOutcomeText(o operatorapi.WorkerOutcome) (kind, text string) {
	switch {
	case o.Setup != nil:
		s := o.Setup
		took := (time.Duration(s.DurationMs) * time.Millisecond).Round(time.Millisecond)
		name := s.Name
		if name == "" {
			name = "setup"
		}
		if s.State == messages.StateSucceeded {
			return "setup", fmt.Sprintf("%s succeeded in %s", name, took)
		}
		text = fmt.Sprintf("%s failed with exit %d after %s", name, s.ExitCode, took)
		if s.Error != nil && *s.Error != "" {
			text += ": " + *s.Error
		}
		return "setup", text
	case o.Ota != nil:
		u := o.Ota
		src := ""
		if u.Source == messages.OtaSourceAuto {
			src = " (auto-update)"
		}
		switch u.Outcome {
		case messages.OtaInstalled:
			when := "runs now"
			if u.Applies == messages.OtaAppliesNextRestart {
				when = "runs at the next restart"
			}
			return "update", fmt.Sprintf("installed %s%s; %s", u.Version, src, when)
		case messages.OtaAlreadyRunning:
			return "update", fmt.Sprintf("%s%s already running", u.Version, src)
		default:
			text = fmt.Sprintf("refused %s%s", u.Version, src)
			if u.Code != "" {
				text += ": " + strings.ReplaceAll(u.Code, "_", " ")
			}
			if u.Reason != nil && *u.Reason != "" {
				text += " (" + *u.Reason + ")"
			}
			return "update", text
		}
	}
	return o.Kind, "-"
}

// printOutcomes is the outcomes section of `daemon show`, newest first;
// a failed setup brings the end of its output.
func (a *app) printOutcomes(out io.Writer, outcomes []operatorapi.WorkerOutcome, now time.Time) error {
	fmt.Fprintln(out, "recent outcomes:")
	if len(outcomes) == 0 {
		fmt.Fprintln(out, "  -")
		return nil
	}
	tw := newTable(out)
	fmt.Fprintln(tw, "  WHEN\tKIND\tCOMMAND\tOUTCOME")
	for _, o := range outcomes {
		kind, text := workerOutcomeText(o)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", ago(now, o.At), kind, o.CommandID, text)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, o := range outcomes {
		if o.Setup == nil || o.Setup.State == messages.StateSucceeded || strings.TrimSpace(o.Setup.OutputTail) == "" {
			continue
		}
		lines := strings.Split(strings.TrimRight(o.Setup.OutputTail, "\n"), "\n")
		if len(lines) > outcomeTailLines {
			lines = lines[len(lines)-outcomeTailLines:]
		}
		fmt.Fprintf(out, "  -- output tail of setup %s --\n%s\n", o.CommandID, indent(strings.Join(lines, "\n"), "  | "))
	}
	return nil
}
