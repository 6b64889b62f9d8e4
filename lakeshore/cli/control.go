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
		body          []byte
	)
	return daemonVerb(a, onDaemon[operatorapi.Queued]{
		use:   "setup <daemon> --script PATH",
		short: "Queue a setup script on a running daemon",
		long: `Queue a setup script on a running daemon. The file's contents travel on the wire
(--script - reads stdin). Setup scripts run one at a time, in order; write them
to be idempotent, since a daemon may run one again after a restart.

--sudo runs the script as root, --refresh-capabilities re-probes the host
afterwards so a freshly installed runner is advertised, --name labels it.
--json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon setup gpu-rig --script ./host-setup/docker.sh --sudo --refresh-capabilities --name docker
  lakeshore daemon setup gpu-rig --script - <<<'apt-get install -y jq'`,
		flags: func(cmd *cobra.Command) {
			fs := cmd.Flags()
			fs.StringVar(&script, "script", "", "setup script to run (required; - for stdin)")
			fs.BoolVar(&sudo, "sudo", false, "run the script as root")
			fs.BoolVar(&refresh, "refresh-capabilities", false, "re-probe the host's capabilities afterwards")
			fs.StringVar(&name, "name", "", "a human label for this setup step")
		},
		check: func() error {
			if script == "" {
				return usagef("--script PATH is required")
			}
			var err error
			if script == "-" {
				body, err = io.ReadAll(a.env.Stdin)
			} else {
				body, err = os.ReadFile(script)
			}
			if err != nil {
				return fmt.Errorf("--script: %w", err)
			}
			return nil
		},
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.Queued, error) {
			return c.Setup(ctx, w.ID, operatorapi.SetupRequest{Script: string(body), Sudo: sudo, RefreshCapabilities: refresh, Name: name})
		},
		text: func(out io.Writer, w operatorapi.Worker, q operatorapi.Queued) error {
			label := ""
			if name != "" {
				label = fmt.Sprintf(" %q", name)
			}
			_, err := fmt.Fprintf(out, "queued setup%s on %s (command %s)\n", label, describe(w), q.CommandID)
			return err
		},
	})
}

func (a *app) daemonHibernateCmd() *cobra.Command {
	var until string
	var deadline time.Time
	return daemonVerb(a, onDaemon[operatorapi.Queued]{
		use:   "hibernate <daemon> --until +30s|+5m|+1h|+3d|ISO-8601",
		short: "Stop a daemon polling until a deadline",
		long: `Ask a daemon to stop polling until a deadline; it then re-enters its poll loop
from scratch. --until is a span from now (+30s, +5m, +1h, +3d, +1h30m) or an
ISO-8601 time (2026-03-01T08:00:00Z; without a zone, local time). The control
plane refuses a deadline in the past. --json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon hibernate gpu-rig --until +2h
  lakeshore daemon hibernate gpu-rig --until 2026-03-01T08:00:00Z`,
		flags: func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&until, "until", "", "deadline: +30s, +5m, +1h, +3d or an ISO-8601 time (required)")
		},
		check: func() error {
			if until == "" {
				return usagef("--until is required (e.g. +30m or 2026-03-01T08:00:00Z)")
			}
			var err error
			if deadline, err = ParseUntil(until, a.env.Now()); err != nil {
				return &usageError{err: err}
			}
			return nil
		},
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.Queued, error) {
			return c.Hibernate(ctx, w.ID, deadline)
		},
		text: func(out io.Writer, w operatorapi.Worker, q operatorapi.Queued) error {
			_, err := fmt.Fprintf(out, "%s hibernates until %s (in %s; command %s)\n",
				describe(w), deadline.Local().Format(time.RFC3339), span(deadline.Sub(a.env.Now())), q.CommandID)
			return err
		},
	})
}

func (a *app) daemonWakeCmd() *cobra.Command {
	return daemonVerb(a, onDaemon[operatorapi.Woken]{
		use:   "wake <daemon>",
		short: "End a daemon's hibernation now",
		long: `End a daemon's hibernation now, and withdraw the hibernates queued for it that
it has not been sent yet. The wake is a hibernate whose deadline is now, which
every daemon understands: nymph keeps a watch poll open while it hibernates and
polls again at once; a daemon that does not (an older one) takes the wake when
its hibernation ends, at the deadline printed. On an awake daemon it only
withdraws queued hibernates.
--json prints {commandId, workerId, kind, hibernatingUntil}: the deadline the
wake ends (absent when the daemon was awake).`,
		example: `  lakeshore daemon wake gpu-rig`,
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.Woken, error) {
			return c.Wake(ctx, w.ID)
		},
		text: func(out io.Writer, w operatorapi.Worker, r operatorapi.Woken) error {
			if r.HibernatingUntil == nil {
				_, err := fmt.Fprintf(out, "%s was not hibernating; queued hibernates are withdrawn (command %s)\n", describe(w), r.CommandID)
				return err
			}
			now := a.env.Now()
			_, err := fmt.Fprintf(out, "woke %s, which was hibernating until %s (%s): nymph polls again at once; "+
				"a daemon that does not watch for a wake polls at that deadline (command %s)\n",
				describe(w), r.HibernatingUntil.Local().Format(time.RFC3339), ago(now, *r.HibernatingUntil), r.CommandID)
			return err
		},
	})
}

func (a *app) daemonResetCmd() *cobra.Command {
	return a.queueVerb(onDaemon[operatorapi.Queued]{
		use:   "reset <daemon>",
		short: "Collapse a daemon's poll backoff",
		long: `Queue a reset_backoff command: a daemon stuck in exponential backoff retries at
retry_min_s on its next poll. Cheaper than a kill and relaunch.
--json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon reset gpu-rig`,
	}, (*opclient.Client).Reset, "queued reset_backoff on %s (command %s)\n")
}

// queueVerb is a verb that queues one command on one daemon and says so
// (reset, rotate-key): done is printed with the daemon and the command id.
func (a *app) queueVerb(v onDaemon[operatorapi.Queued], call func(*opclient.Client, context.Context, string) (operatorapi.Queued, error), done string) *cobra.Command {
	v.call = func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.Queued, error) {
		return call(c, ctx, w.ID)
	}
	v.text = func(out io.Writer, w operatorapi.Worker, q operatorapi.Queued) error {
		_, err := fmt.Fprintf(out, done, describe(w), q.CommandID)
		return err
	}
	return daemonVerb(a, v)
}

// onDaemon describes a verb that acts on the one daemon its argument names
// (--id takes it verbatim) and prints the answer: as JSON with --json, else
// through text.
type onDaemon[T any] struct {
	use, short, long, example string
	// flags adds the verb's own flags; check, when set, validates them
	// before anything is asked of the control plane.
	flags func(*cobra.Command)
	check func() error
	call  func(context.Context, *opclient.Client, operatorapi.Worker) (T, error)
	text  func(io.Writer, operatorapi.Worker, T) error
}

func daemonVerb[T any](a *app, v onDaemon[T]) *cobra.Command {
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
			if v.check != nil {
				if err := v.check(); err != nil {
					return err
				}
			}
			c, w, err := a.clientAndTarget(ctx, args[0], byID)
			if err != nil {
				return err
			}
			out, err := v.call(ctx, c, w)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, out)
			}
			return v.text(a.env.Stdout, w, out)
		},
	}
	if v.flags != nil {
		v.flags(cmd)
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) daemonCancelCmd() *cobra.Command {
	var execID, invID string
	return daemonVerb(a, onDaemon[operatorapi.Queued]{
		use:   "cancel <daemon> --exec ID | --invocation ID",
		short: "Stop a running exec or invocation without killing the daemon",
		long: `Queue a cancel command for one running exec or invocation; the daemon kills its
process group and reports it as cancelled. Exactly one of --exec and
--invocation. --json prints {commandId, workerId, kind}.`,
		example: `  lakeshore daemon cancel gpu-rig --exec 01J9Z8X7W6V5T4S3R2Q1P0N9M8
  lakeshore daemon cancel gpu-rig --invocation inv-42`,
		flags: func(cmd *cobra.Command) {
			cmd.Flags().StringVar(&execID, "exec", "", "exec id to cancel")
			cmd.Flags().StringVar(&invID, "invocation", "", "invocation id to cancel")
		},
		check: func() error {
			if (execID == "") == (invID == "") {
				return usagef("pass exactly one of --exec ID and --invocation ID")
			}
			return nil
		},
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) (operatorapi.Queued, error) {
			return c.Cancel(ctx, w.ID, operatorapi.CancelRequest{ExecID: execID, InvocationID: invID})
		},
		text: func(out io.Writer, w operatorapi.Worker, q operatorapi.Queued) error {
			what := "exec " + execID
			if invID != "" {
				what = "invocation " + invID
			}
			_, err := fmt.Fprintf(out, "queued cancel of %s on %s (command %s)\n", what, describe(w), q.CommandID)
			return err
		},
	})
}

func (a *app) daemonCommandsCmd() *cobra.Command {
	return daemonVerb(a, onDaemon[[]operatorapi.CommandInfo]{
		use:   "commands <daemon>",
		short: "List the commands the control plane holds for a daemon",
		long: `List the commands the control plane has recorded for one daemon, oldest first,
with their state: queued (not yet picked up), delivered (picked up, not yet
acknowledged by a later poll) or acked. Useful when a daemon seems not to
react. --json prints [{id, kind, state, createdAt}].`,
		example: `  lakeshore daemon commands gpu-rig`,
		call: func(ctx context.Context, c *opclient.Client, w operatorapi.Worker) ([]operatorapi.CommandInfo, error) {
			return c.ListCommands(ctx, w.ID)
		},
		text: func(out io.Writer, w operatorapi.Worker, cmds []operatorapi.CommandInfo) error {
			if len(cmds) == 0 {
				_, err := fmt.Fprintf(out, "no commands pending for %s\n", describe(w))
				return err
			}
			now := a.env.Now()
			tw := newTable(out)
			fmt.Fprintln(tw, "ID\tKIND\tSTATE\tCREATED")
			for _, ci := range cmds {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", ci.ID, ci.Kind, ci.State, ago(now, ci.CreatedAt))
			}
			return tw.Flush()
		},
	})
}
