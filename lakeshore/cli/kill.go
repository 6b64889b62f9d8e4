package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// confirm asks a yes/no question on stderr and reads the answer from stdin.
// Only a "y" or "yes" agrees. An interrupt ends the wait at once: Ctrl-C on
// the terminal raises SIGINT, which cancels ctx, while the read itself
// would go on until Enter.
func (a *app) confirm(ctx context.Context, question string) (bool, error) {
	a.watchSignals()
	fmt.Fprintf(a.env.Stderr, "%s [y/N]: ", question)
	answer := make(chan string, 1)
	go func() {
		// Left blocked on an interrupt, until the process exits.
		line, _ := bufio.NewReader(a.env.Stdin).ReadString('\n')
		answer <- line
	}()
	select {
	case <-ctx.Done():
		fmt.Fprintln(a.env.Stderr)
		return false, exitWith(ExitInterrupted, errors.New("interrupted; nothing was done"))
	case line := <-answer:
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "y", "yes":
			return true, nil
		}
		return false, nil
	}
}

// approve decides whether a destructive bulk action goes ahead: --yes
// does; on a terminal the operator is asked; otherwise it is cancelled
// (exit 0, with a note on stderr). The error is an interrupt while asking.
func (a *app) approve(ctx context.Context, yes bool, question, what string) (bool, error) {
	if yes {
		return true, nil
	}
	if !a.env.StdinTTY {
		fmt.Fprintf(a.env.Stderr, "lakeshore: cancelled: not a terminal, and --yes not given (would %s)\n", what)
		return false, nil
	}
	ok, err := a.confirm(ctx, question)
	if ok || err != nil {
		return ok, err
	}
	fmt.Fprintln(a.env.Stderr, "lakeshore: cancelled")
	return false, nil
}

// KillSummary is the --json output of `daemon kill --prefix`.
type KillSummary struct {
	Count  int                        `json:"count"`
	Killed []operatorapi.KillResponse `json:"killed"`
}

func (a *app) daemonKillCmd() *cobra.Command {
	var (
		prefix                    string
		yes, noTerminate, jsonOut bool
		byID                      bool
	)
	cmd := &cobra.Command{
		Use:   "kill <daemon> | --prefix P",
		Short: "Remove a daemon's worker row (and by default its cloud instance)",
		Long: `Remove a daemon's worker row. For a daemon 'lakeshore daemon launch' started,
the control plane first terminates its machine through the provider that
launched it (with the credentials of its serve process); if that fails the row
is kept and the error says why. --no-terminate removes only the row and leaves
the machine running. A daemon that no provider launched has no machine to
terminate here, and the output says so.

--prefix P removes every daemon whose label starts with P. It lists them and
asks for confirmation on a terminal; --yes skips the question. Without a
terminal and without --yes nothing is removed and lakeshore exits 0.

Killing the row does not stop the nymph process itself: a pool daemon keeps
polling until you stop it on its host ('lakeshore daemon stop' there).

--json prints {deleted, terminated, provider, instanceId, note}, or with
--prefix {count, killed: [...]}.`,
		Example: `  lakeshore daemon kill gpu-rig
  lakeshore daemon kill gpu-rig --no-terminate
  lakeshore daemon kill --prefix fleet --yes`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case prefix != "" && len(args) > 0:
				return usagef("--prefix and a <daemon> argument are mutually exclusive")
			case prefix == "" && len(args) != 1:
				return usagef("want one <daemon>, or --prefix P")
			}
			return nil
		},
		ValidArgsFunction: a.completeDaemon,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			if prefix == "" {
				w, err := a.target(ctx, c, args[0], byID)
				if err != nil {
					return err
				}
				kr, err := c.KillWorker(ctx, w.ID, !noTerminate)
				if err != nil {
					return err
				}
				if jsonOut {
					return writeJSON(a.env.Stdout, kr)
				}
				return a.printKilled(w, kr)
			}
			ws, err := c.ListWorkers(ctx)
			if err != nil {
				return err
			}
			var match []operatorapi.Worker
			for _, w := range sortedWorkers(ws) {
				if strings.HasPrefix(w.Label, prefix) {
					match = append(match, w)
				}
			}
			if len(match) == 0 {
				fmt.Fprintf(a.env.Stderr, "lakeshore: no daemon label starts with %q; nothing to kill\n", prefix)
				if jsonOut {
					return writeJSON(a.env.Stdout, KillSummary{Killed: []operatorapi.KillResponse{}})
				}
				return nil
			}
			if !yes {
				_ = a.printWorkerTable(a.env.Stderr, match, c.Namespace())
			}
			n := plural(len(match), "daemon")
			if ok, err := a.approve(ctx, yes, "Kill "+n+"?", "kill "+n); !ok {
				return err
			}
			sum := KillSummary{Killed: []operatorapi.KillResponse{}}
			var errs []error
			for _, w := range match {
				kr, err := c.KillWorker(ctx, w.ID, !noTerminate)
				if err != nil {
					errs = append(errs, fmt.Errorf("kill %s: %w", describe(w), err))
					continue
				}
				sum.Killed = append(sum.Killed, kr)
				if !jsonOut {
					_ = a.printKilled(w, kr)
				}
			}
			sum.Count = len(sum.Killed)
			if jsonOut {
				if err := writeJSON(a.env.Stdout, sum); err != nil {
					return err
				}
			}
			return errors.Join(errs...)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&prefix, "prefix", "", "kill every daemon whose label starts with this")
	fs.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	fs.BoolVar(&noTerminate, "no-terminate", false, "leave the cloud instance running; remove only the worker row")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	fs.BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

func (a *app) printKilled(w operatorapi.Worker, kr operatorapi.KillResponse) error {
	note := ""
	switch {
	case kr.Terminated:
		note = fmt.Sprintf("; instance %s terminated through provider %s", kr.InstanceID, kr.Provider)
	case kr.Note != "":
		note = " (" + kr.Note + ")"
	}
	_, err := fmt.Fprintf(a.env.Stdout, "killed %s%s\n", describe(w), note)
	return err
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func (a *app) daemonCleanupCmd() *cobra.Command {
	var (
		olderThan            string
		dryRun, yes, jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "cleanup [--older-than 24h]",
		Short: "Delete the worker rows of daemons not seen for a while",
		Long: `Delete every worker row whose last contact is older than --older-than:
30m, 2h, 5d, or a bare number of hours (24). The default is 24h; the control
plane refuses zero, negative and anything above 168h (one week).

--dry-run only lists what would go. Otherwise lakeshore lists the rows and asks
on a terminal; --yes skips the question; without a terminal and without --yes
nothing is deleted and lakeshore exits 0.

--json prints the control plane's answer {count, dryRun, deleted: [workers]}.`,
		Example: `  lakeshore daemon cleanup
  lakeshore daemon cleanup --older-than 2h --dry-run
  lakeshore daemon cleanup --older-than 5d --yes
  lakeshore daemon cleanup --older-than 6h --dry-run --json | jq '.deleted'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			age, err := ParseCleanupAge(olderThan)
			if err != nil {
				return &usageError{err: err}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			req := operatorapi.CleanupRequest{OlderThanHours: age.Hours(), DryRun: true}
			preview, err := c.Cleanup(ctx, req)
			if err != nil {
				return err
			}
			preview.Deleted = sortedWorkers(preview.Deleted)
			if dryRun || preview.Count == 0 {
				if jsonOut {
					return writeJSON(a.env.Stdout, preview)
				}
				if preview.Count == 0 {
					_, err := fmt.Fprintf(a.env.Stdout, "no daemon unseen for more than %s\n", span(age))
					return err
				}
				fmt.Fprintf(a.env.Stdout, "would delete %s unseen for more than %s:\n", plural(preview.Count, "daemon"), span(age))
				return a.printWorkerTable(a.env.Stdout, preview.Deleted, c.Namespace())
			}
			if !yes {
				_ = a.printWorkerTable(a.env.Stderr, preview.Deleted, c.Namespace())
			}
			n := plural(preview.Count, "daemon")
			if ok, err := a.approve(ctx, yes, fmt.Sprintf("Delete %s unseen for more than %s?", n, span(age)), "delete "+n); !ok {
				return err
			}
			req.DryRun = false
			done, err := c.Cleanup(ctx, req)
			if err != nil {
				return err
			}
			done.Deleted = sortedWorkers(done.Deleted)
			if jsonOut {
				return writeJSON(a.env.Stdout, done)
			}
			fmt.Fprintf(a.env.Stdout, "deleted %s:\n", plural(done.Count, "daemon"))
			return a.printWorkerTable(a.env.Stdout, done.Deleted, c.Namespace())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&olderThan, "older-than", "24h", "age threshold: 30m, 2h, 5d, or a bare number of hours")
	fs.BoolVar(&dryRun, "dry-run", false, "only list what would be deleted")
	fs.BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	fs.BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
