package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/localdaemon"
)

// defaultStopTimeout covers nymph's default 30 s shutdown grace.
const defaultStopTimeout = 35 * time.Second

// StatusReport is the --json output of `daemon status`.
type StatusReport struct {
	Running   bool                  `json:"running"`
	Processes []localdaemon.Process `json:"processes"`
}

func (a *app) daemonStatusCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Is a nymph daemon running on this machine?",
		Long: `List the nymph processes running on this machine (found through /proc: any
process whose executable or argv[0] is named nymph). This asks no control plane.

Exits 0 when at least one runs and 3 when none does, like an init script's
status. --json prints {running, processes: [{pid, ppid, uid, exe, args,
configPath, startedAt}]}.`,
		Example: `  lakeshore daemon status
  lakeshore daemon status --json | jq '.processes[].pid'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ps, err := a.env.Procs.Find(cmd.Context())
			if err != nil {
				return err
			}
			rep := StatusReport{Running: len(ps) > 0, Processes: ps}
			if jsonOut {
				if err := writeJSON(a.env.Stdout, rep); err != nil {
					return err
				}
			} else if len(ps) == 0 {
				fmt.Fprintln(a.env.Stdout, "no nymph running on this machine")
			} else {
				now := a.env.Now()
				tw := newTable(a.env.Stdout)
				fmt.Fprintln(tw, "PID\tUID\tUP\tCONFIG\tCOMMAND")
				for _, p := range ps {
					fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", p.PID, p.UID, span(now.Sub(p.StartedAt)), orDash(p.ConfigPath), strings.Join(p.Args, " "))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if !rep.Running {
				return exitWith(ExitNotRunning, nil)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) daemonStopCmd() *cobra.Command {
	var timeout float64
	var force, jsonOut, all bool
	cmd := &cobra.Command{
		Use:   "stop [PID...]",
		Short: "Stop the nymph daemons running on this machine",
		Long: `Send SIGTERM to the nymph processes on this machine (yours, those of every
user with --all, or the PIDs given) and wait up to --timeout seconds for each
to finish its running jobs and exit. Without --all, nymphs running as other
users are left alone and listed on stderr. With --force a process still there after the timeout gets SIGKILL;
without it lakeshore reports it and exits 1. Nothing to stop is not an error.

This stops processes only; the worker rows stay on the control plane (see
'lakeshore daemon kill'). --json prints [{pid, signal, stopped, tookNs}].`,
		Example: `  lakeshore daemon stop
  sudo lakeshore daemon stop --all
  lakeshore daemon stop --timeout 60 --force
  lakeshore daemon stop 12345`,
		Args: func(cmd *cobra.Command, args []string) error {
			for _, s := range args {
				if n, err := strconv.Atoi(s); err != nil || n <= 0 {
					return usagef("%q is not a process id", s)
				}
			}
			if all && len(args) > 0 {
				return usagef("--all stops every nymph; give it or PIDs, not both")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if timeout <= 0 {
				return usagef("--timeout %v: must be positive", timeout)
			}
			ps, err := a.env.Procs.Find(ctx)
			if err != nil {
				return err
			}
			ps, err = selectPIDs(ps, args)
			if err != nil {
				return err
			}
			if len(args) == 0 && !all {
				var others []localdaemon.Process
				ps, others = ownProcesses(ps, os.Getuid())
				if len(others) > 0 {
					defer a.noteOthersLeft(others)
				}
			}
			if len(ps) == 0 {
				whose := ""
				if len(args) == 0 && !all {
					whose = " of yours"
				}
				fmt.Fprintf(a.env.Stderr, "lakeshore: no nymph%s running on this machine; nothing to stop\n", whose)
				if jsonOut {
					return writeJSON(a.env.Stdout, []localdaemon.StopResult{})
				}
				return nil
			}
			limit := time.Duration(timeout * float64(time.Second))
			results, err := a.stopAll(ctx, ps, limit, force, jsonOut)
			if jsonOut {
				if werr := writeJSON(a.env.Stdout, results); werr != nil {
					return werr
				}
			}
			return err
		},
	}
	floatVar(cmd.Flags(), &timeout, "timeout", defaultStopTimeout.Seconds(), "seconds to wait for each daemon to exit after SIGTERM")
	cmd.Flags().BoolVar(&force, "force", false, "SIGKILL a daemon still running after --timeout")
	cmd.Flags().BoolVar(&all, "all", false, "stop the nymphs of every user, not only yours")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func selectPIDs(ps []localdaemon.Process, args []string) ([]localdaemon.Process, error) {
	if len(args) == 0 {
		return ps, nil
	}
	byPID := map[int]localdaemon.Process{}
	for _, p := range ps {
		byPID[p.PID] = p
	}
	out := make([]localdaemon.Process, 0, len(args))
	for _, s := range args {
		pid, _ := strconv.Atoi(s)
		p, ok := byPID[pid]
		if !ok {
			return nil, fmt.Errorf("pid %d is not a running nymph", pid)
		}
		out = append(out, p)
	}
	return out, nil
}

// ownProcesses splits ps into those running as uid and the others.
func ownProcesses(ps []localdaemon.Process, uid int) (own, others []localdaemon.Process) {
	for _, p := range ps {
		if p.UID == uid {
			own = append(own, p)
		} else {
			others = append(others, p)
		}
	}
	return own, others
}

// noteOthersLeft says which nymphs of other users `daemon stop` left
// running, and how to stop them too.
func (a *app) noteOthersLeft(others []localdaemon.Process) {
	var names []string
	for _, p := range others {
		who := strconv.Itoa(p.UID)
		if u, err := user.LookupId(who); err == nil {
			who = u.Username
		}
		names = append(names, fmt.Sprintf("pid %d (user %s)", p.PID, who))
	}
	fmt.Fprintf(a.env.Stderr, "lakeshore: left running, not yours: %s; --all stops them too\n", strings.Join(names, ", "))
}

// stopAll stops every process in parallel, so the total wait is one
// timeout, not one per daemon.
func (a *app) stopAll(ctx context.Context, ps []localdaemon.Process, limit time.Duration, force, quiet bool) ([]localdaemon.StopResult, error) {
	results := make([]localdaemon.StopResult, len(ps))
	errs := make([]error, len(ps))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, p := range ps {
		if !quiet {
			fmt.Fprintf(a.env.Stderr, "stopping nymph pid %d (SIGTERM, waiting up to %s)\n", p.PID, limit)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := a.env.Procs.Stop(ctx, p, limit, force)
			results[i], errs[i] = res, err
			if quiet || err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(a.env.Stdout, "stopped nymph pid %d (%s, %s)\n", p.PID, res.Signal, res.Took.Round(time.Millisecond))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if errors.Is(err, localdaemon.ErrStillRunning) && !force {
			errs[i] = fmt.Errorf("%w; rerun with --force to SIGKILL it", err)
		}
	}
	return results, errors.Join(errs...)
}
