package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
)

// UpdateOutcome is one daemon's line of a fanned-out `daemon update --json`.
// Update is set when an ota_update was queued, Queues when membership was
// edited, Error when either failed.
type UpdateOutcome struct {
	WorkerID string                    `json:"workerId"`
	Label    string                    `json:"label"`
	OK       bool                      `json:"ok"`
	Error    string                    `json:"error,omitempty"`
	Update   *operatorapi.UpdateQueued `json:"update,omitempty"`
	Queues   *operatorapi.WorkerQueues `json:"queues,omitempty"`
	// With --wait: the version the daemon reports when the wait ended, and
	// why it does not run the new one (refused, or the wait ran out).
	ReportedVersion string `json:"reportedVersion,omitempty"`
	WaitError       string `json:"waitError,omitempty"`
}

// UpdateSummary is the --json output of `daemon update --all|--prefix`.
// Count daemons were asked, Failed of them could not be queued; with
// --wait, Updated report the new version.
type UpdateSummary struct {
	Count   int             `json:"count"`
	Failed  int             `json:"failed"`
	Updated *int            `json:"updated,omitempty"`
	Results []UpdateOutcome `json:"results"`
}

type updateFlags struct {
	prefix                 string
	all, yes, jsonOut      bool
	byID                   bool
	wait                   bool
	waitFor                time.Duration
	req                    operatorapi.UpdateRequest
	addQueues, removeQueue []string
}

// ota reports whether an ota_update is asked for: always without queue
// flags; with them only when a version, URL or checksum is also given.
func (f *updateFlags) ota() bool {
	queueOnly := len(f.addQueues)+len(f.removeQueue) > 0
	return !queueOnly || f.req != (operatorapi.UpdateRequest{})
}

func (f *updateFlags) queueEdit() *operatorapi.QueueEditRequest {
	if len(f.addQueues)+len(f.removeQueue) == 0 {
		return nil
	}
	return &operatorapi.QueueEditRequest{Add: f.addQueues, Remove: f.removeQueue}
}

func (a *app) daemonUpdateCmd() *cobra.Command {
	f := &updateFlags{}
	cmd := &cobra.Command{
		Use:   "update <daemon> | --all | --prefix P",
		Short: "Queue an over-the-air binary update, or edit a daemon's queues",
		Long: `Queue an ota_update: the daemon downloads the new nymph, checks its sha256,
renames it over itself and exec()s it; running jobs finish and report first.

  --version V   target version; omitted, the namespace's target version
                (lakeshore daemon set-target-version)
  --url U       download URL; omitted, the control plane's own release for the
                daemon's architecture (lakeshore release publish)
  --sha256 H    checksum, 64 hex characters; omitted, the release's, or the one
                in the <url>.sha256 sidecar

--all updates every daemon of the namespace that is not gone; --prefix P every
daemon whose label starts with P. Both list the daemons and ask for
confirmation on a terminal (--yes skips the question; without a terminal and
without --yes nothing is queued and lakeshore exits 0), then print one line per
daemon and a summary. The exit code is 1 if any daemon failed.

An update is queued: each daemon takes it on its next poll and reports the new
version once it has restarted into it. --wait waits for that (with a progress
line on a terminal) for up to --wait-for (10m), then says which daemons run the
new version and which do not, and why (refused, or still on the old one); the
exit code is 1 if any does not.

--add-queue Q and --remove-queue Q (repeatable) edit queue membership instead;
adding to a queue that does not exist is an error (lakeshore queue create). A
queue edit queues no update unless --version, --url or --sha256 is also given.
The edits are kept apart from the lanes a daemon names itself, so they outlast
its next hello.

--json prints {commandId, workerId, kind, version, url, sha256,
currentVersion}, or the queue edit {workerId, queues, lanes, added, removed};
fanned out, {count, failed, results: [...]}.`,
		Example: `  lakeshore daemon update gpu-rig --version 0.1.10
  lakeshore daemon update --all --yes --wait
  lakeshore daemon update gpu-rig
  lakeshore daemon update --prefix fleet --yes
  lakeshore daemon update gpu-rig --url https://example.org/nymph-0.1.10 --sha256 <hex>
  lakeshore daemon update gpu-rig --add-queue training --remove-queue default`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case f.all && f.prefix != "":
				return usagef("--all and --prefix are mutually exclusive")
			case (f.all || f.prefix != "") && len(args) > 0:
				return usagef("--all/--prefix and a <daemon> argument are mutually exclusive")
			case !f.all && f.prefix == "" && len(args) != 1:
				return usagef("want one <daemon>, or --all, or --prefix P")
			}
			return nil
		},
		ValidArgsFunction: a.completeDaemon,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			if len(args) == 1 {
				return a.updateOne(ctx, c, args[0], f)
			}
			return a.updateMany(ctx, c, f)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.req.Version, "version", "", "target version (default: the namespace's target version)")
	fs.StringVar(&f.req.URL, "url", "", "download URL (default: derived by the control plane)")
	fs.StringVar(&f.req.SHA256, "sha256", "", "sha256 of the binary (default: from the release or the URL's .sha256 sidecar)")
	fs.BoolVar(&f.all, "all", false, "update every daemon of the namespace")
	fs.StringVar(&f.prefix, "prefix", "", "update every daemon whose label starts with this")
	fs.BoolVarP(&f.yes, "yes", "y", false, "do not ask for confirmation")
	fs.StringArrayVar(&f.addQueues, "add-queue", nil, "add the daemon to this queue (repeatable)")
	fs.StringArrayVar(&f.removeQueue, "remove-queue", nil, "remove the daemon from this queue (repeatable)")
	fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	fs.BoolVar(&f.byID, "id", false, "take <daemon> as a literal worker id")
	fs.BoolVar(&f.wait, "wait", false, "wait until the daemons report the new version")
	fs.DurationVar(&f.waitFor, "wait-for", defaultUpdateWait, "how long --wait waits (e.g. 90s, 15m)")
	return cmd
}

// applyUpdate does what the flags ask to one worker: the queue edit first
// (it is the cheap, checkable part), then the update.
func applyUpdate(ctx context.Context, c *opclient.Client, w operatorapi.Worker, f *updateFlags) (UpdateOutcome, error) {
	out := UpdateOutcome{WorkerID: w.ID, Label: w.Label}
	if e := f.queueEdit(); e != nil {
		wq, err := c.EditWorkerQueues(ctx, w.ID, *e)
		if err != nil {
			out.Error = err.Error()
			return out, err
		}
		out.Queues = &wq
	}
	if f.ota() {
		q, err := c.UpdateWorker(ctx, w.ID, f.req)
		if err != nil {
			out.Error = err.Error()
			return out, err
		}
		out.Update = &q
	}
	out.OK = true
	return out, nil
}

// outcomeText is the progress line of one daemon.
func outcomeText(w operatorapi.Worker, o UpdateOutcome) string {
	if !o.OK {
		return fmt.Sprintf("%s: error: %s", describe(w), o.Error)
	}
	var parts []string
	if o.Queues != nil {
		parts = append(parts, "queues now "+joinOrDash(o.Queues.Queues))
	}
	if u := o.Update; u != nil {
		from := ""
		if u.CurrentVersion != nil && *u.CurrentVersion != "" {
			from = " from " + *u.CurrentVersion
		}
		parts = append(parts, fmt.Sprintf("queued ota_update to %s%s (command %s)", u.Version, from, u.CommandID))
	}
	return describe(w) + ": " + strings.Join(parts, "; ")
}

func (a *app) updateOne(ctx context.Context, c *opclient.Client, arg string, f *updateFlags) error {
	w, err := a.target(ctx, c, arg, f.byID)
	if err != nil {
		return err
	}
	o, err := applyUpdate(ctx, c, w, f)
	if err != nil {
		if o.Queues != nil && !f.jsonOut {
			o.OK = true
			fmt.Fprintln(a.env.Stdout, outcomeText(w, o))
		}
		return err
	}
	if f.wait && o.Update != nil {
		outs := []UpdateOutcome{o}
		updated, err := a.waitForVersions(ctx, c, outs, f.waitFor)
		if err != nil {
			return err
		}
		if f.jsonOut {
			err = writeJSON(a.env.Stdout, outs[0])
		} else {
			fmt.Fprintln(a.env.Stdout, outcomeText(w, o))
			waitReport(a.env.Stdout, outs, updated, 1)
		}
		if err == nil && updated == 0 {
			err = exitWith(ExitError, fmt.Errorf("%s does not run nymph %s: %s", describe(w), o.Update.Version, outs[0].WaitError))
		}
		return err
	}
	if f.jsonOut {
		if o.Update != nil && o.Queues == nil {
			return writeJSON(a.env.Stdout, o.Update)
		}
		if o.Update == nil {
			return writeJSON(a.env.Stdout, o.Queues)
		}
		return writeJSON(a.env.Stdout, o)
	}
	_, err = fmt.Fprintln(a.env.Stdout, outcomeText(w, o))
	return err
}

func (a *app) updateMany(ctx context.Context, c *opclient.Client, f *updateFlags) error {
	ws, err := c.ListWorkers(ctx)
	if err != nil {
		return err
	}
	var match []operatorapi.Worker
	for _, w := range sortedWorkers(ws) {
		// A gone daemon polls no more; nothing queued for it would be read.
		if w.State != operatorapi.StateGone && (f.all || strings.HasPrefix(w.Label, f.prefix)) {
			match = append(match, w)
		}
	}
	if len(match) == 0 {
		what := "the namespace has no daemons"
		if f.prefix != "" {
			what = fmt.Sprintf("no daemon label starts with %q", f.prefix)
		}
		fmt.Fprintf(a.env.Stderr, "lakeshore: %s; nothing to update\n", what)
		if f.jsonOut {
			return writeJSON(a.env.Stdout, UpdateSummary{Results: []UpdateOutcome{}})
		}
		return nil
	}
	// Without a version the target decides; find out now rather than have
	// every daemon fail the same way.
	version := f.req.Version
	if f.ota() && version == "" {
		tv, err := c.TargetVersion(ctx)
		if err != nil {
			return err
		}
		if tv.Version == nil {
			return fmt.Errorf("no --version given and namespace %q has no target version; pass --version or run `lakeshore daemon set-target-version`", c.Namespace())
		}
		version = *tv.Version
	}
	if !f.yes {
		_ = a.printWorkerTable(a.env.Stderr, match, c.Namespace())
	}
	n := plural(len(match), "daemon")
	var action string
	switch {
	case f.ota() && f.queueEdit() != nil:
		action = fmt.Sprintf("edit the queues of %s and update them to nymph %s", n, version)
	case f.ota():
		action = fmt.Sprintf("update %s to nymph %s", n, version)
	default:
		action = "edit the queues of " + n
	}
	if ok, err := a.approve(ctx, f.yes, strings.ToUpper(action[:1])+action[1:]+"?", action); !ok {
		return err
	}
	sum := UpdateSummary{Results: []UpdateOutcome{}}
	for _, w := range match {
		o, _ := applyUpdate(ctx, c, w, f)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sum.Results = append(sum.Results, o)
		if !o.OK {
			sum.Failed++
		}
		if !f.jsonOut {
			fmt.Fprintln(a.env.Stdout, outcomeText(w, o))
		}
	}
	sum.Count = len(sum.Results)
	done := "done"
	if f.ota() {
		// Queued is all that has happened: each daemon takes its update
		// on its next poll.
		done = "queued"
	}
	if !f.jsonOut {
		fmt.Fprintf(a.env.Stdout, "%d of %s %s, %d failed\n", sum.Count-sum.Failed, n, done, sum.Failed)
	}
	asked := sum.Count - sum.Failed
	if f.wait && f.ota() && asked > 0 {
		updated, err := a.waitForVersions(ctx, c, sum.Results, f.waitFor)
		if err != nil {
			return err
		}
		sum.Updated = &updated
		if !f.jsonOut {
			waitReport(a.env.Stdout, sum.Results, updated, asked)
		}
	} else if f.ota() && !f.jsonOut && asked > 0 {
		fmt.Fprintln(a.env.Stdout, "each daemon takes its update on its next poll; --wait waits until they report the new version")
	}
	if f.jsonOut {
		if err := writeJSON(a.env.Stdout, sum); err != nil {
			return err
		}
	}
	if sum.Failed > 0 {
		return exitWith(ExitError, fmt.Errorf("%d of %s failed", sum.Failed, n))
	}
	if sum.Updated != nil && *sum.Updated < asked {
		return exitWith(ExitError, fmt.Errorf("%d of %s not updated to nymph %s", asked-*sum.Updated, plural(asked, "daemon"), version))
	}
	return nil
}

func (a *app) daemonTargetVersionCmd() *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "target-version",
		Short: "Show the namespace's target nymph version",
		Long: `Show the namespace's target_nymph_version: what every poll response
advertises, what 'daemon update' installs when no --version is given, and what
daemons with [runtime] auto_update = true converge on by themselves.

--json prints {namespace, version, publishedTriples}; version is null when
none is set.`,
		Example: `  lakeshore daemon target-version
  lakeshore daemon target-version --json | jq -r .version`,
		Args: noArgs,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
			tv, err := c.TargetVersion(ctx)
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, tv)
			}
			return a.printTarget(tv)
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) printTarget(tv operatorapi.TargetVersion) error {
	if tv.Version == nil {
		_, err := fmt.Fprintf(a.env.Stdout, "no target version set in namespace %q\n", tv.Namespace)
		return err
	}
	where := "not published on this control plane"
	if len(tv.PublishedTriples) > 0 {
		where = "published for " + strings.Join(tv.PublishedTriples, ", ")
	}
	_, err := fmt.Fprintf(a.env.Stdout, "%s (%s)\n", *tv.Version, where)
	return err
}

func (a *app) daemonSetTargetVersionCmd() *cobra.Command {
	var clear, jsonOut bool
	cmd := &cobra.Command{
		Use:   "set-target-version <version> | --clear",
		Short: "Set or clear the namespace's target nymph version",
		Long: `Set the namespace's target_nymph_version, or remove it with --clear. Every
poll response carries it; daemons with [runtime] auto_update = true update
themselves to it, everyone else waits for 'lakeshore daemon update'.

A warning is printed when the version is not published on this control
plane: daemons could not download it from here.

--json prints {namespace, version, publishedTriples}.`,
		Example: `  lakeshore daemon set-target-version 0.1.10
  lakeshore daemon set-target-version --clear`,
		Args: func(cmd *cobra.Command, args []string) error {
			switch {
			case clear && len(args) > 0:
				return usagef("--clear and a <version> are mutually exclusive")
			case !clear && len(args) != 1:
				return usagef("want one <version>, or --clear")
			}
			return nil
		},
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			var tv operatorapi.TargetVersion
			var err error
			if clear {
				tv, err = c.ClearTargetVersion(ctx)
			} else {
				tv, err = c.SetTargetVersion(ctx, args[0])
			}
			if err != nil {
				return err
			}
			if tv.Version != nil && len(tv.PublishedTriples) == 0 {
				fmt.Fprintf(a.env.Stderr, "lakeshore: warning: nymph %s is not published on this control plane; publish it with `lakeshore release publish PATH --version %s`\n", *tv.Version, *tv.Version)
			}
			if jsonOut {
				return writeJSON(a.env.Stdout, tv)
			}
			if tv.Version == nil {
				_, err = fmt.Fprintf(a.env.Stdout, "cleared the target version of namespace %q\n", tv.Namespace)
				return err
			}
			_, err = fmt.Fprintf(a.env.Stdout, "target version of namespace %q set to %s\n", tv.Namespace, *tv.Version)
			return err
		}),
	}
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the target version")
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	return cmd
}
