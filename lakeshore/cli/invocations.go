package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

var invocationStates = []string{
	operatorapi.InvocationQueued, operatorapi.InvocationRunning, operatorapi.InvocationSucceeded,
	operatorapi.InvocationFailed, operatorapi.InvocationKilled, operatorapi.InvocationCancelled,
}

func (a *app) invocationsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "invocations",
		Aliases: []string{"invocation", "inv"},
		Short:   "List, show and cancel function invocations",
		Long: `Function invocations are what 'lakeshore run' submits: queued until a daemon of
their queue takes one, then running, then succeeded, failed or killed (or
cancelled, when an operator cancels it before any daemon started it).`,
		Example: `  lakeshore invocations list --state running
  lakeshore invocations show 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2 --wait
  lakeshore invocations logs 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2 --follow
  lakeshore invocations cancel 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	cmd.AddCommand(a.invocationsListCmd(), a.invocationsShowCmd(), a.invocationsLogsCmd(), a.invocationsCancelCmd())
	return cmd
}

func (a *app) invocationsListCmd() *cobra.Command {
	var (
		f       opclient.InvocationFilter
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List invocations, newest first",
		Long: `List the namespace's invocations, newest first: id, state, queue, function,
runner, daemon, age, and for a failure its error.

--json prints {invocations: [...]} as the operator API returns it (without
result bytes; 'invocations show' has them).`,
		Example: `  lakeshore invocations list
  lakeshore invocations list --state failed --queue gpu --limit 20
  lakeshore invocations list --json | jq -r '.invocations[].id'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.State != "" && !slices.Contains(invocationStates, f.State) {
				return usagef("--state %q: want one of %s", f.State, strings.Join(invocationStates, ", "))
			}
			if f.Limit < 0 || f.Limit > operatorapi.MaxListLimit {
				return usagef("--limit %d: want 1 to %d", f.Limit, operatorapi.MaxListLimit)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			invs, err := c.ListInvocations(cmd.Context(), f)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, operatorapi.InvocationList{Invocations: invs})
			}
			return a.printInvocationTable(a.env.Stdout, invs)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.State, "state", "", "only this state: "+strings.Join(invocationStates, ", "))
	fs.StringVar(&f.Queue, "queue", "", "only this queue")
	fs.IntVar(&f.Limit, "limit", 0, fmt.Sprintf("at most N (default %d, at most %d)", operatorapi.DefaultListLimit, operatorapi.MaxListLimit))
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(invocationStates, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("queue", a.completeQueue)
	return cmd
}

func functionText(inv operatorapi.Invocation) string {
	if inv.Script != "" {
		return "(script)"
	}
	if inv.Function.Qualname == "" {
		return inv.Function.Module
	}
	return inv.Function.Module + ":" + inv.Function.Qualname
}

func runnerText(inv operatorapi.Invocation) string {
	if inv.RunConfig.Runner == nil || *inv.RunConfig.Runner == "" {
		return "(default)"
	}
	return *inv.RunConfig.Runner
}

func (a *app) printInvocationTable(w io.Writer, invs []operatorapi.Invocation) error {
	if len(invs) == 0 {
		_, err := fmt.Fprintln(a.env.Stderr, "no invocations")
		return err
	}
	now := a.env.Now()
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tSTATE\tQUEUE\tFUNCTION\tRUNNER\tDAEMON\tCREATED\tERROR")
	for _, inv := range invs {
		errText := ""
		if inv.Error != nil {
			errText = inv.Error.Type + ": " + inv.Error.Message
			if len(errText) > 70 {
				errText = errText[:69] + "…"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", inv.ID, inv.State, inv.Queue, functionText(inv), runnerText(inv),
			orDash(inv.WorkerLabel), ago(now, inv.CreatedAt), orDash(errText))
	}
	return tw.Flush()
}

func (a *app) invocationsShowCmd() *cobra.Command {
	var jsonOut, wait bool
	cmd := &cobra.Command{
		Use:   "show <id>",
		Short: "Show one invocation: state, daemon, times, result or error, output",
		Long: `Show one invocation. The result is printed as JSON when it decodes as msgpack,
else as text (or its size, when it is not text). The output the function
wrote is printed up to 64 KiB; 'invocations logs' prints all of it. --wait
first waits until it is over. --json prints the invocation object as the
operator API returns it (result base64; the output is at 'invocations logs
--json').`,
		Example: `  lakeshore invocations show 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2
  lakeshore invocations show 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2 --wait --json | jq .error`,
		Args: exactArgs(1, "one <id>"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			var inv operatorapi.Invocation
			var err error
			if wait {
				prog := startProgress(a.env.Stderr, a.env.StderrTTY && !jsonOut, "invocation "+args[0])
				inv, err = c.WaitInvocation(ctx, args[0], func(cur operatorapi.Invocation, err error) {
					if err == nil {
						prog.Set(progressText(cur, fmt.Sprintf("queue %q", cur.Queue)))
					}
				})
				prog.Stop()
			} else {
				inv, err = c.GetInvocation(ctx, args[0], 0)
			}
			if opclient.IsNotFound(err) {
				return fmt.Errorf("no invocation %q in namespace %q: %w", args[0], c.Namespace(), err)
			}
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, inv)
			}
			var page *operatorapi.InvocationLogs
			if p, err := c.InvocationLogs(ctx, inv.ID, 0, showOutputCap, 0); err == nil {
				page = &p
			} else {
				fmt.Fprintf(a.env.Stderr, "lakeshore: the output of %s could not be read: %v\n", inv.ID, err)
			}
			return a.printInvocation(a.env.Stdout, inv, page)
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the invocation is over")
	return cmd
}

func (a *app) printInvocation(out io.Writer, inv operatorapi.Invocation, output *operatorapi.InvocationLogs) error {
	now := a.env.Now()
	tw := newTable(out)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", inv.ID)
	row("state", inv.State)
	row("queue", inv.Queue)
	row("function", functionText(inv))
	row("runner", runnerText(inv))
	if inv.RunConfig.Image != "" {
		row("image", inv.RunConfig.Image)
	}
	if inv.RunConfig.TimeoutS > 0 {
		row("timeout", fmt.Sprintf("%gs", inv.RunConfig.TimeoutS))
	}
	if inv.AsUser != "" {
		row("as user", inv.AsUser)
	}
	args := fmt.Sprintf("%d bytes", inv.ArgsSize)
	if inv.ArgsKey != "" {
		args += " (payload " + inv.ArgsKey + ")"
	}
	row("args", args)
	row("daemon", orDash(workerName(inv)))
	row("created", stamp(now, inv.CreatedAt))
	if inv.StartedAt != nil {
		row("started", stamp(now, *inv.StartedAt))
	}
	if inv.FinishedAt != nil {
		took := ""
		if inv.StartedAt != nil {
			took = fmt.Sprintf(" (took %s)", inv.FinishedAt.Sub(*inv.StartedAt).Round(time.Millisecond))
		}
		row("finished", stamp(now, *inv.FinishedAt)+took)
	}
	if e := inv.Error; e != nil {
		row("error", e.Type+": "+e.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if e := inv.Error; e != nil && e.Traceback != nil && *e.Traceback != "" {
		fmt.Fprintf(out, "traceback:\n%s\n", indent(strings.TrimRight(*e.Traceback, "\n"), "  "))
	}
	printOutput(out, inv, output)
	if inv.State == operatorapi.InvocationSucceeded {
		fmt.Fprintf(out, "result (%d bytes):\n", len(inv.Result))
		switch js, ok := MsgpackToJSON(inv.Result); {
		case ok:
			fmt.Fprint(out, indent(strings.TrimRight(string(js), "\n"), "  ")+"\n")
		case isText(inv.Result):
			fmt.Fprint(out, indent(strings.TrimRight(string(inv.Result), "\n"), "  ")+"\n")
		default:
			fmt.Fprintln(out, "  (binary; 'lakeshore run' or --json gives the bytes)")
		}
	}
	return nil
}

func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 && r != '\n' && r != '\t' && r != '\r' {
			return false
		}
	}
	return true
}

func (a *app) invocationsCancelCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "cancel <id>",
		Short: "Cancel an invocation",
		Long: `Cancel an invocation. One still queued (or not yet received by its daemon) is
cancelled at once; a running one is stopped by its daemon, which kills its
process tree or container and reports it killed. Cancelling one that is
over is an error.

--json prints {invocation, cancelled, command_id}.`,
		Example: `  lakeshore invocations cancel 01J9Z8Q4T3N5V6W7X8Y9Z0A1B2`,
		Args:    exactArgs(1, "one <id>"),
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			res, err := c.CancelInvocation(ctx, args[0])
			if opclient.IsNotFound(err) {
				return fmt.Errorf("no invocation %q in namespace %q: %w", args[0], c.Namespace(), err)
			}
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, res)
			}
			inv := res.Invocation
			switch {
			case res.Cancelled:
				_, err = fmt.Fprintf(a.env.Stdout, "cancelled invocation %s\n", inv.ID)
			case res.CommandID != "":
				_, err = fmt.Fprintf(a.env.Stdout, "asked %s to stop invocation %s; it ends killed once the daemon acks\n", workerName(inv), inv.ID)
			default:
				_, err = fmt.Fprintf(a.env.Stdout, "invocation %s is %s\n", inv.ID, inv.State)
			}
			return err
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
