package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

func (a *app) daemonSetupCmd() *cobra.Command {
	var (
		script        string
		sudo, refresh bool
		name          string
		jsonOut, byID bool
	)
	cmd := &cobra.Command{
		Use:   "setup <daemon> --script PATH",
		Short: "Queue a setup script on a running daemon",
		Long: `Queue a setup script on a running daemon. The file's contents travel on the wire
(--script - reads stdin). Setup scripts run one at a time, in order; write them
to be idempotent, since a daemon may run one again after a restart.

--sudo runs the script as root, --refresh-capabilities re-probes the host
afterwards so a freshly installed runner is advertised, --name labels it.
--json prints {commandId, workerId, kind}.`,
		Example: `  lakeshore daemon setup gpu-rig --script ./host-setup/docker.sh --sudo --refresh-capabilities --name docker
  lakeshore daemon setup gpu-rig --script - <<<'apt-get install -y jq'`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if script == "" {
				return usagef("--script PATH is required")
			}
			var body []byte
			var err error
			if script == "-" {
				body, err = io.ReadAll(a.env.Stdin)
			} else {
				body, err = os.ReadFile(script)
			}
			if err != nil {
				return fmt.Errorf("--script: %w", err)
			}
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			q, err := c.Setup(ctx, w.ID, operatorapi.SetupRequest{Script: string(body), Sudo: sudo, RefreshCapabilities: refresh, Name: name})
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, q)
			}
			label := ""
			if name != "" {
				label = fmt.Sprintf(" %q", name)
			}
			_, err = fmt.Fprintf(a.env.Stdout, "queued setup%s on %s (command %s)\n", label, describe(w), q.CommandID)
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&script, "script", "", "setup script to run (required; - for stdin)")
	fs.BoolVar(&sudo, "sudo", false, "run the script as root")
	fs.BoolVar(&refresh, "refresh-capabilities", false, "re-probe the host's capabilities afterwards")
	fs.StringVar(&name, "name", "", "a human label for this setup step")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	fs.BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) daemonHibernateCmd() *cobra.Command {
	var until string
	var jsonOut, byID bool
	cmd := &cobra.Command{
		Use:   "hibernate <daemon> --until +30s|+5m|+1h|+3d|ISO-8601",
		Short: "Stop a daemon polling until a deadline",
		Long: `Ask a daemon to stop polling until a deadline; it then re-enters its poll loop
from scratch. --until is a span from now (+30s, +5m, +1h, +3d, +1h30m) or an
ISO-8601 time (2026-03-01T08:00:00Z; without a zone, local time). The control
plane refuses a deadline in the past. --json prints {commandId, workerId, kind}.`,
		Example: `  lakeshore daemon hibernate gpu-rig --until +2h
  lakeshore daemon hibernate gpu-rig --until 2026-03-01T08:00:00Z`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if until == "" {
				return usagef("--until is required (e.g. +30m or 2026-03-01T08:00:00Z)")
			}
			deadline, err := ParseUntil(until, a.env.Now())
			if err != nil {
				return &usageError{err: err}
			}
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			q, err := c.Hibernate(ctx, w.ID, deadline)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, q)
			}
			_, err = fmt.Fprintf(a.env.Stdout, "%s hibernates until %s (in %s; command %s)\n",
				describe(w), deadline.Local().Format(time.RFC3339), span(deadline.Sub(a.env.Now())), q.CommandID)
			return err
		},
	}
	cmd.Flags().StringVar(&until, "until", "", "deadline: +30s, +5m, +1h, +3d or an ISO-8601 time (required)")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) daemonResetCmd() *cobra.Command {
	return a.queueVerb(queueVerb{
		use:   "reset <daemon>",
		short: "Collapse a daemon's poll backoff",
		long: `Queue a reset_backoff command: a daemon stuck in exponential backoff retries at
retry_min_s on its next poll. Cheaper than a kill and relaunch.
--json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon reset gpu-rig`,
		call:    (*opclient.Client).Reset,
		done:    "queued reset_backoff on %s (command %s)\n",
	})
}

// queueVerb describes a verb that queues one command on one daemon and says
// so: reset, rotate-key.
type queueVerb struct {
	use, short, long, example string
	call                      func(*opclient.Client, context.Context, string) (operatorapi.Queued, error)
	// done is printed with the daemon and the command id.
	done string
}

func (a *app) queueVerb(v queueVerb) *cobra.Command {
	var jsonOut, byID bool
	cmd := &cobra.Command{
		Use:               v.use,
		Short:             v.short,
		Long:              v.long,
		Example:           v.example,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			q, err := v.call(c, ctx, w.ID)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, q)
			}
			_, err = fmt.Fprintf(a.env.Stdout, v.done, describe(w), q.CommandID)
			return err
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) daemonCancelCmd() *cobra.Command {
	var execID, invID string
	var jsonOut, byID bool
	cmd := &cobra.Command{
		Use:   "cancel <daemon> --exec ID | --invocation ID",
		Short: "Stop a running exec or invocation without killing the daemon",
		Long: `Queue a cancel command for one running exec or invocation; the daemon kills its
process group and reports it as cancelled. Exactly one of --exec and
--invocation. --json prints {commandId, workerId, kind}.`,
		Example: `  lakeshore daemon cancel gpu-rig --exec 01J9Z8X7W6V5T4S3R2Q1P0N9M8
  lakeshore daemon cancel gpu-rig --invocation inv-42`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if (execID == "") == (invID == "") {
				return usagef("pass exactly one of --exec ID and --invocation ID")
			}
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			q, err := c.Cancel(ctx, w.ID, operatorapi.CancelRequest{ExecID: execID, InvocationID: invID})
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, q)
			}
			what := "exec " + execID
			if invID != "" {
				what = "invocation " + invID
			}
			_, err = fmt.Fprintf(a.env.Stdout, "queued cancel of %s on %s (command %s)\n", what, describe(w), q.CommandID)
			return err
		},
	}
	cmd.Flags().StringVar(&execID, "exec", "", "exec id to cancel")
	cmd.Flags().StringVar(&invID, "invocation", "", "invocation id to cancel")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) daemonCommandsCmd() *cobra.Command {
	var jsonOut, byID bool
	cmd := &cobra.Command{
		Use:   "commands <daemon>",
		Short: "List the commands the control plane holds for a daemon",
		Long: `List the commands the control plane has recorded for one daemon, oldest first,
with their state: queued (not yet picked up), delivered (picked up, not yet
acknowledged by a later poll) or acked. Useful when a daemon seems not to
react. --json prints [{id, kind, state, createdAt}].`,
		Example:           `  lakeshore daemon commands gpu-rig`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			cmds, err := c.ListCommands(ctx, w.ID)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, cmds)
			}
			if len(cmds) == 0 {
				_, err := fmt.Fprintf(a.env.Stdout, "no commands pending for %s\n", describe(w))
				return err
			}
			now := a.env.Now()
			tw := newTable(a.env.Stdout)
			fmt.Fprintln(tw, "ID\tKIND\tSTATE\tCREATED")
			for _, ci := range cmds {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ci.ID, ci.Kind, ci.State, ago(now, ci.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}
