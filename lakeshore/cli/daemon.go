package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/backoff"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

func (a *app) daemonCmd() *cobra.Command {
	cmd := a.daemonGroup()
	cmd.AddCommand(
		a.daemonListCmd(),
		a.daemonShowCmd(),
		a.daemonExecCmd(),
		a.daemonSetupCmd(),
		a.daemonHibernateCmd(), a.daemonWakeCmd(),
		a.daemonResetCmd(),
		a.daemonCancelCmd(),
		a.daemonCommandsCmd(),
		a.daemonKillCmd(),
		a.daemonCleanupCmd(),
		a.daemonStatusCmd(),
		a.daemonStopCmd(),
		a.daemonInstallCmd(),
		a.daemonLaunchCmd(), a.daemonLaunchLogCmd(),
		a.daemonUpdateCmd(), a.daemonTargetVersionCmd(), a.daemonSetTargetVersionCmd(),
		a.daemonRotateKeyCmd(), a.daemonRevokeKeyCmd(),
	)
	return cmd
}

// daemonGroup is the daemon command without its verbs.
func (a *app) daemonGroup() *cobra.Command {
	return &cobra.Command{
		Use:     "daemon",
		Aliases: []string{"daemons"},
		Short:   "Inspect and drive the daemons registered to the control plane",
		Long: `Inspect and drive the nymph daemons registered to the control plane.

A <daemon> argument is a label, a label prefix that matches one daemon only,
or a worker id. When several daemons share a label, the one that is neither
gone nor stale wins; when a name is still ambiguous the candidates are listed.
--id takes the argument as a literal worker id.`,
		Example: `  lakeshore daemon list --watch
  lakeshore daemon show gpu-rig
  lakeshore daemon exec gpu-rig nvidia-smi`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
}

// watchFlag adds --watch [seconds] (2 when given bare).
func watchFlag(cmd *cobra.Command, v *float64) {
	floatVar(cmd.Flags(), v, "watch", 0, "refresh every N seconds until Ctrl-C (bare --watch: 2)")
	cmd.Flags().Lookup("watch").NoOptDefVal = "2"
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[annWatch] = "1"
}

func (a *app) daemonListCmd() *cobra.Command {
	var jsonOut bool
	var watch float64
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the daemons of the namespace",
		Long: `List every daemon (worker row) of the namespace: id, label, state, queues,
runners and when it was last seen. A daemon not seen for 60 s reads "stale";
one whose newest setup script failed says so ("active, setup failed (exit 9)").

--json prints {"workers": [...]} sorted by label, then id; with --watch, one
such document per line and per refresh.`,
		Example: `  lakeshore daemon list
  lakeshore daemon list --json | jq -r '.workers[].label'
  lakeshore daemon list --watch 5`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			fetch := func(ctx context.Context) (any, error) {
				ws, err := c.ListWorkers(ctx)
				return sortedWorkers(ws), err
			}
			render := func(w io.Writer, v any) error {
				ws := v.([]operatorapi.Worker)
				if jsonOut {
					return nil
				}
				return a.printWorkerTable(w, ws, c.Namespace())
			}
			toJSON := func(v any) any { return operatorapi.WorkerList{Workers: v.([]operatorapi.Worker)} }
			return a.repeat(ctx, watch, jsonOut, fetch, render, toJSON)
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	watchFlag(cmd, &watch)
	return cmd
}

func (a *app) printWorkerTable(w io.Writer, ws []operatorapi.Worker, ns string) error {
	if len(ws) == 0 {
		_, err := fmt.Fprintf(w, "no daemons in namespace %q\n", ns)
		return err
	}
	now := a.env.Now()
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tLABEL\tSTATE\tQUEUES\tRUNNERS\tLAST SEEN")
	for _, wk := range ws {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", wk.ID, orDash(wk.Label), a.stateText(wk, now),
			joinOrDash(wk.Queues), joinOrDash(workerRunners(wk)), ago(now, wk.LastSeenAt))
	}
	return tw.Flush()
}

func (a *app) stateText(w operatorapi.Worker, now time.Time) string {
	s := orDash(w.State)
	if w.Hibernating != nil && w.Hibernating.After(now) {
		s += " (hibernating " + span(w.Hibernating.Sub(now)) + ")"
	}
	if failed := setupFailure(w.LastSetup); failed != "" {
		s += ", " + failed
	}
	return s
}

// workerRunners prefers the row's runners and falls back to the advertised
// capabilities.
func workerRunners(w operatorapi.Worker) []string {
	if len(w.Runners) > 0 {
		return w.Runners
	}
	return w.Capabilities.Runners
}

func (a *app) daemonShowCmd() *cobra.Command {
	var jsonOut, byID bool
	var watch float64
	cmd := &cobra.Command{
		Use:   "show <daemon>",
		Short: "Show one daemon: versions, tags, runners, queues, capabilities, keys",
		Long: `Show everything the control plane knows about one daemon: state, versions,
tags, runners, queues, capabilities, running invocations, the recent setup
and update outcomes (newest first: a setup's exit code, duration and output
tail; an update's installed version or why it was refused) and enrolled
keys.

--json prints the worker object exactly as the operator API returns it.`,
		Example: `  lakeshore daemon show gpu-rig
  lakeshore daemon show 5f0c1e2d3b4a59687a6b5c4d --id --json
  lakeshore daemon show gpu --watch`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			w, err := a.target(ctx, c, args[0], byID)
			if err != nil {
				return err
			}
			id := w.ID
			fetch := func(ctx context.Context) (any, error) {
				w, err := c.GetWorker(ctx, id)
				if opclient.IsNotFound(err) {
					return nil, fmt.Errorf("no daemon with id %q: %w", id, err)
				}
				return w, err
			}
			render := func(out io.Writer, v any) error {
				if jsonOut {
					return nil
				}
				return a.printWorker(out, v.(operatorapi.Worker))
			}
			return a.repeat(ctx, watch, jsonOut, fetch, render, func(v any) any { return v })
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	watchFlag(cmd, &watch)
	return cmd
}

func (a *app) printWorker(out io.Writer, w operatorapi.Worker) error {
	now := a.env.Now()
	tw := newTable(out)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", w.ID)
	row("label", orDash(w.Label))
	row("namespace", orDash(w.Namespace))
	row("machine", orDash(w.MachineID))
	state := a.stateText(w, now)
	if w.StoredState != "" && w.StoredState != w.State {
		state += " (stored: " + w.StoredState + ")"
	}
	row("state", state)
	row("last seen", lastSeen(now, w.LastSeenAt))
	row("created", stamp(now, w.CreatedAt))
	if w.Hibernating != nil {
		row("hibernating until", stamp(now, *w.Hibernating))
	}
	row("queues", joinOrDash(w.Queues))
	if w.PollQueue != "" {
		row("poll queue", w.PollQueue)
	}
	row("tags", joinOrDash(w.Tags))
	row("runners", joinOrDash(workerRunners(w)))
	caps := fmt.Sprintf("runners=%s max_invocations=%d workdir=%s",
		joinOrDash(w.Capabilities.Runners), w.Capabilities.MaxInvocations, orDash(w.Capabilities.Workdir))
	row("capabilities", caps)
	row("setup pending", fmt.Sprint(w.SetupPending))
	if w.Provider != "" {
		row("provider", w.Provider)
		row("instance", orDash(w.InstanceID))
	}
	if w.SingleJob {
		what := "yes (keep_alive_s = 0): takes one job, then exits"
		if w.SingleJobTaken {
			what = "yes (keep_alive_s = 0): has its job and takes no other; it polls no more and exits once the job ends"
		}
		row("single job", what)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "versions:")
	vs := versionLines(w.Versions)
	if len(vs) == 0 {
		fmt.Fprintln(out, "  -")
	}
	tw = newTable(out)
	for _, kv := range vs {
		fmt.Fprintf(tw, "  %s:\t%s\n", kv[0], kv[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(out, "running:")
	if len(w.Running) == 0 {
		fmt.Fprintln(out, "  -")
	} else {
		tw = newTable(out)
		fmt.Fprintln(tw, "  INVOCATION\tSTATE\tSTARTED")
		for _, r := range w.Running {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.InvocationID, r.State, ago(now, r.StartedAt))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, r := range w.Running {
			if r.StdoutTail != "" {
				fmt.Fprintf(out, "  -- stdout tail of %s --\n%s\n", r.InvocationID, indent(strings.TrimRight(r.StdoutTail, "\n"), "  | "))
			}
		}
	}

	if err := a.printOutcomes(out, w.Outcomes, now); err != nil {
		return err
	}

	fmt.Fprintln(out, "keys:")
	if len(w.Keys) == 0 {
		fmt.Fprintln(out, "  -")
		return nil
	}
	tw = newTable(out)
	fmt.Fprintln(tw, "  KEY ID\tCREATED\tREVOKED")
	for _, k := range w.Keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = stamp(now, *k.RevokedAt)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", k.KeyID, stamp(now, k.CreatedAt), revoked)
	}
	return tw.Flush()
}

func lastSeen(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%s (%s)", ago(now, t), t.Local().Format(time.RFC3339))
}

func stamp(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format(time.RFC3339), ago(now, t))
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// versionLines flattens the versions object into sorted key/value pairs;
// nulls print as "-", nested values as compact JSON.
func versionLines(raw json.RawMessage) [][2]string {
	var m map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][2]string, 0, len(keys))
	for _, k := range keys {
		v := strings.TrimSpace(string(m[k]))
		var s string
		switch {
		case v == "null" || v == "":
			s = "-"
		case json.Unmarshal(m[k], &s) == nil:
		default:
			s = v
		}
		out = append(out, [2]string{k, s})
	}
	return out
}

// repeat runs fetch once, or every interval seconds until ctx ends. Each
// result goes to render (text) or, with jsonOut, through toJSON to stdout:
// indented once, one compact line per refresh under --watch. On a terminal
// each refresh redraws the screen. Errors that a retry could cure are shown
// and the watch goes on; others end it.
func (a *app) repeat(ctx context.Context, interval float64, jsonOut bool,
	fetch func(context.Context) (any, error), render func(io.Writer, any) error, toJSON func(any) any) error {
	out := a.env.Stdout
	if interval == 0 {
		v, err := fetch(ctx)
		if err != nil {
			return err
		}
		if jsonOut {
			return writeJSON(out, toJSON(v))
		}
		return render(out, v)
	}
	if interval < 0.1 {
		return usagef("--watch %v: want at least 0.1 seconds", interval)
	}
	every := time.Duration(interval * float64(time.Second))
	for frame := 0; ; frame++ {
		v, err := fetch(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && opclient.Retryable(err):
			fmt.Fprintf(a.env.Stderr, "lakeshore: %v (retrying in %s)\n", err, every)
		case err != nil:
			return err
		case jsonOut:
			if err := writeJSONLine(out, toJSON(v)); err != nil {
				return err
			}
		default:
			if a.env.StdoutTTY {
				fmt.Fprint(out, "\x1b[H\x1b[2J")
				fmt.Fprintf(out, "every %s · %s · Ctrl-C to exit\n\n", every, a.env.Now().Format("15:04:05"))
			} else if frame > 0 {
				fmt.Fprintln(out)
			}
			if err := render(out, v); err != nil {
				return err
			}
		}
		if !backoff.Sleep(ctx, every) {
			return nil
		}
	}
}

// resolve turns a daemon argument into a worker row.
func (a *app) resolve(ctx context.Context, c *opclient.Client, arg string) (operatorapi.Worker, error) {
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return operatorapi.Worker{}, err
	}
	return ResolveDaemon(ws, arg)
}

// withClient is a RunE that first makes the operator API client.
func (a *app) withClient(run func(ctx context.Context, c *opclient.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		return run(cmd.Context(), c, args)
	}
}

// clientAndTarget is the prologue of the verbs that act on one daemon: an
// operator API client and the daemon arg names (see target).
func (a *app) clientAndTarget(ctx context.Context, arg string, byID bool) (*opclient.Client, operatorapi.Worker, error) {
	c, err := a.client()
	if err != nil {
		return nil, operatorapi.Worker{}, err
	}
	w, err := a.target(ctx, c, arg, byID)
	if err != nil {
		return nil, operatorapi.Worker{}, err
	}
	return c, w, nil
}

// target resolves a daemon argument, or with byID takes it as an id only
// (see workerByID).
func (a *app) target(ctx context.Context, c *opclient.Client, arg string, byID bool) (operatorapi.Worker, error) {
	if byID {
		return workerByID(ctx, c, arg)
	}
	return a.resolve(ctx, c, arg)
}
