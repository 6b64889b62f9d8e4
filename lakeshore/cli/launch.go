package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/projectconfig"
	"nymph/messages"
)

// launchCheckEvery is how often `daemon launch --wait` reads the launched
// daemons back: the operator API has no long-poll for a first hello.
const launchCheckEvery = time.Second

// defaultLaunchWait bounds `daemon launch --wait`: a cloud machine boots,
// runs its bootstrap and downloads nymph in a few minutes.
const defaultLaunchWait = 15 * time.Minute

// LaunchSummary is the --json output of `daemon launch`.
type LaunchSummary struct {
	Provider string                      `json:"provider"`
	Launched []operatorapi.Worker        `json:"launched"`
	Failed   []operatorapi.LaunchFailure `json:"failed"`
	// Registered and NeverRegistered are filled in by --wait: the ids of
	// the daemons that said hello, and of those that did not in time.
	Registered      []string `json:"registered,omitempty"`
	NeverRegistered []string `json:"neverRegistered,omitempty"`
	// Config lists the .lakeshore files read, lowest precedence first.
	Config []string `json:"config,omitempty"`
}

// launchFlags are daemon launch's command line; given says which were set
// (a flag beats .lakeshore only when given).
type launchFlags struct {
	provider, name, label, capacity, bootstrap string
	count, concurrency, keepAlive              int
	tags, queues, runners, setups              []string
	noConfig, noSetup, wait, jsonOut           bool
	waitFor                                    time.Duration
}

func (a *app) daemonLaunchCmd() *cobra.Command {
	var f launchFlags
	cmd := &cobra.Command{
		Use:   "launch --provider P [flags]",
		Short: "Launch daemons on new machines through a provider",
		Long: `Launch daemons on machines a provider starts ('lakeshore provider add').

For each daemon the control plane mints a token of its own, records the
worker at once in state "pending" (with its provider and instance id), renders
a bootstrap script and calls the provider. The bootstrap, run as root on the
machine, downloads nymph from this control plane's published releases
('lakeshore release publish'), checks its sha256, installs it as
/opt/dreamlake/bin/nymph with its config in /etc/dreamlake/udf-daemon.toml and
runs it as dreamlake-nymph.service (Restart=always), or under a restart loop
where systemd is not running. Setup scripts become the worker's setup queue:
the daemon turns setting_up on its first hello and active once they ran.

--name sets the label and the machine's Name tag; with --count N > 1 it is a
prefix (name-00, name-01, ...). --concurrency bounds the provider calls in
flight (default 5); a throttled call is retried. --capacity is a JSON object
handed to the provider as it is (for ec2: instance_type, subnet_id, ...).

Defaults come from a .lakeshore file (and .lakeshore.local beside it) found by
walking up from the current directory to the git root: flag > .lakeshore.local
> .lakeshore > built-in. Lists replace, except --setup-script, which appends.
--no-config skips the files; --no-setup drops every setup script.

--wait blocks until every launched daemon said hello (progress on a terminal)
and exits 1 naming the ones that never did. --json prints {provider, launched,
failed, registered, neverRegistered, config}.

` + ExitCodeHelp,
		Example: `  lakeshore daemon launch --provider aws-prod --name gpu-rig-east \
    --capacity '{"instance_type": "g5.2xlarge"}' --tag gpu:h100 --queue training \
    --keep-alive 300 --wait
  lakeshore daemon launch --provider local --name fleet --count 3 --wait
  lakeshore daemon launch            # everything from .lakeshore`,
		Args: noArgs,
	}
	cmd.RunE = a.withClient(func(ctx context.Context, c *opclient.Client, _ []string) error {
		given := map[string]bool{}
		cmd.Flags().Visit(func(fl *pflag.Flag) { given[fl.Name] = true })
		return a.launch(ctx, c, f, given)
	})
	fs := cmd.Flags()
	fs.StringVar(&f.provider, "provider", "", "provider registered on the control plane")
	fs.StringVar(&f.name, "name", "", "label and machine Name tag; a prefix with --count > 1 (default <provider>-<short id>)")
	fs.IntVar(&f.count, "count", 1, "how many daemons to launch")
	fs.IntVar(&f.concurrency, "concurrency", operatorapi.DefaultLaunchWorkers, "provider calls in flight at once")
	fs.StringVar(&f.label, "label", "", "worker label instead of --name (--name is usually what you want)")
	fs.StringVar(&f.capacity, "capacity", "", "JSON object handed to the provider as it is")
	fs.StringArrayVar(&f.tags, "tag", nil, "capability tag key:value (repeatable; replaces .lakeshore tags)")
	fs.StringArrayVar(&f.queues, "queue", nil, "queue the daemon joins (repeatable; none: the default queue)")
	fs.StringArrayVar(&f.runners, "runner", nil, "runner kind to advertise; the first is the default (repeatable)")
	fs.IntVar(&f.keepAlive, "keep-alive", -1, "idle policy: -1 pool, 0 single job, N seconds")
	fs.StringVar(&f.bootstrap, "bootstrap-script", "", "bash script run as root on the machine before nymph starts")
	fs.StringArrayVar(&f.setups, "setup-script", nil, "setup script run once the daemon registered (repeatable; appends to .lakeshore's)")
	fs.BoolVar(&f.noConfig, "no-config", false, "do not read .lakeshore files")
	fs.BoolVar(&f.noSetup, "no-setup", false, "drop every setup script, from .lakeshore and flags alike")
	fs.BoolVar(&f.wait, "wait", false, "wait until every launched daemon has registered")
	fs.DurationVar(&f.waitFor, "wait-timeout", defaultLaunchWait, "how long --wait waits")
	fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return cmd
}

func (a *app) launch(ctx context.Context, c *opclient.Client, f launchFlags, given map[string]bool) error {
	req, files, err := a.launchRequest(f, given)
	if err != nil {
		return err
	}
	if !f.jsonOut {
		fmt.Fprintf(a.env.Stderr, "lakeshore: launching %s through provider %s...\n", plural(req.Count, "daemon"), req.Provider)
	}
	resp, err := c.Launch(ctx, req)
	if err != nil {
		return err
	}
	sum := LaunchSummary{Provider: req.Provider, Launched: resp.Launched, Failed: resp.Failed, Config: files}
	if !f.jsonOut {
		tw := newTable(a.env.Stdout)
		fmt.Fprintln(tw, "ID\tLABEL\tINSTANCE\tSTATE")
		for _, w := range resp.Launched {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", w.ID, w.Label, orDash(w.InstanceID), w.State)
		}
		_ = tw.Flush()
		for _, fl := range resp.Failed {
			fmt.Fprintf(a.env.Stderr, "lakeshore: launch of %s failed: %s\n", fl.Name, fl.Error)
		}
	}
	if f.wait && len(resp.Launched) > 0 {
		if err := a.waitLaunched(ctx, c, &sum, f.waitFor); err != nil {
			return err
		}
	}
	if f.jsonOut {
		if err := writeJSON(a.env.Stdout, sum); err != nil {
			return err
		}
	}
	var problems []string
	if n := len(sum.Failed); n > 0 {
		problems = append(problems, fmt.Sprintf("%s of %d failed to launch", plural(n, "daemon"), req.Count))
	}
	if n := len(sum.NeverRegistered); n > 0 {
		problems = append(problems, fmt.Sprintf("%s never registered within %s (%s); see what the machine printed: lakeshore daemon launch-log %s",
			plural(n, "daemon"), span(f.waitFor), strings.Join(sum.NeverRegistered, ", "), sum.NeverRegistered[0]))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// waitLaunched waits until every launched daemon has said hello (its
// state is no longer pending), reading them back every launchCheckEvery.
func (a *app) waitLaunched(ctx context.Context, c *opclient.Client, sum *LaunchSummary, within time.Duration) error {
	total := len(sum.Launched)
	pending := map[string]bool{}
	for _, w := range sum.Launched {
		pending[w.ID] = true
	}
	prog := startProgress(a.env.Stderr, a.env.StderrTTY, fmt.Sprintf("0/%d registered", total))
	defer prog.Stop()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(launchCheckEvery)
	defer tick.Stop()
wait:
	for {
		ws, err := c.ListWorkers(ctx)
		if err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			byID := map[string]operatorapi.Worker{}
			for _, w := range ws {
				byID[w.ID] = w
			}
			for id := range pending {
				w, ok := byID[id]
				switch {
				case !ok:
					// Killed while booting: it will never say hello.
					sum.NeverRegistered = append(sum.NeverRegistered, id)
					delete(pending, id)
				case w.StoredState != operatorapi.StatePending:
					sum.Registered = append(sum.Registered, id)
					delete(pending, id)
				}
			}
		}
		prog.Set(fmt.Sprintf("%d/%d registered", len(sum.Registered), total))
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			for id := range pending {
				sum.NeverRegistered = append(sum.NeverRegistered, id)
			}
			break wait
		case <-tick.C:
		}
	}
	slices.Sort(sum.Registered)
	slices.Sort(sum.NeverRegistered)
	prog.Stop()
	fmt.Fprintf(a.env.Stderr, "lakeshore: %d/%d registered\n", len(sum.Registered), total)
	return nil
}

func (a *app) daemonLaunchLogCmd() *cobra.Command {
	var (
		jsonOut, noLatest, byID bool
		tail                    int
	)
	cmd := &cobra.Command{
		Use:   "launch-log <daemon>",
		Short: "Show the console output of a daemon's machine (provider-launched daemons)",
		Long: `Show what the machine of a provider-launched daemon printed: the serial
console on ec2 (GetConsoleOutput), the container's output on podman, the
script's console-log answer. The tool of choice when a daemon never reached
its first hello. A daemon that was not launched by a provider has no such
log here: its log is on its own host.

--tail N prints only the last N lines; --no-latest asks ec2 for the whole
console buffer instead of the most recent output. --json prints {workerId,
provider, instanceId, output}.`,
		Example: `  lakeshore daemon launch-log gpu-rig-east --tail 100
  lakeshore daemon launch-log fleet-00 --json | jq -r .output`,
		Args:              exactArgs(1, "one <daemon>"),
		ValidArgsFunction: a.completeDaemon,
		RunE: a.withClient(func(ctx context.Context, c *opclient.Client, args []string) error {
			if tail < 0 {
				return usagef("--tail %d: want a number of lines, 0 for all", tail)
			}
			w, err := a.target(ctx, c, args[0], byID)
			if err != nil {
				return err
			}
			ll, err := c.LaunchLog(ctx, w.ID, !noLatest)
			if err != nil {
				return err
			}
			ll.Output = tailLines(ll.Output, tail)
			if jsonOut {
				return writeJSON(a.env.Stdout, ll)
			}
			if ll.Output == "" {
				fmt.Fprintf(a.env.Stderr, "lakeshore: %s (instance %s) printed nothing yet\n", describe(w), ll.InstanceID)
				return nil
			}
			_, err = fmt.Fprint(a.env.Stdout, ll.Output)
			if err == nil && !strings.HasSuffix(ll.Output, "\n") {
				_, err = fmt.Fprintln(a.env.Stdout)
			}
			return err
		}),
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON")
	cmd.Flags().IntVar(&tail, "tail", 0, "print only the last N lines (0: all)")
	cmd.Flags().BoolVar(&noLatest, "no-latest", false, "ec2: the whole console buffer, not only the most recent output")
	cmd.Flags().BoolVar(&byID, "id", false, "take <daemon> as a literal worker id")
	return cmd
}

// tailLines is the last n lines of s (all of it for n <= 0).
func tailLines(s string, n int) string {
	if n <= 0 {
		return s
	}
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) <= n {
		return s
	}
	return strings.Join(lines[len(lines)-n:], "")
}

// launchRequest builds the request from the flags given and, unless
// --no-config, the .lakeshore files; it returns the files read.
func (a *app) launchRequest(f launchFlags, given map[string]bool) (operatorapi.LaunchRequest, []string, error) {
	v, files, err := a.launchValues(f, given)
	if err != nil {
		return operatorapi.LaunchRequest{}, nil, err
	}
	req := operatorapi.LaunchRequest{
		Provider: v.provider, Name: v.name, Label: f.label, Count: f.count, Concurrency: f.concurrency,
		Queues: v.queues, Runners: v.runners, BootstrapScript: v.bootstrap, SetupScripts: v.setups,
	}
	if v.provider == "" {
		return req, nil, usagef("no provider: pass --provider NAME, or set daemon.provider in .lakeshore (lakeshore provider list)")
	}
	if f.count < 1 || f.count > operatorapi.MaxLaunchCount {
		return req, nil, usagef("--count %d: want 1 to %d", f.count, operatorapi.MaxLaunchCount)
	}
	if f.concurrency < 1 {
		return req, nil, usagef("--concurrency %d: want at least 1", f.concurrency)
	}
	if v.capacity != "" {
		c := json.RawMessage(strings.TrimSpace(v.capacity))
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(c, &obj); err != nil || obj == nil {
			return req, nil, usagef("--capacity %q: want a JSON object, e.g. '{\"instance_type\": \"g5.2xlarge\"}'", v.capacity)
		}
		req.Capacity = c
	}
	for _, t := range v.tags {
		k, val, ok := strings.Cut(t, ":")
		if !ok || strings.TrimSpace(k) == "" || strings.IndexFunc(t, badNameRune) >= 0 {
			return req, nil, usagef("--tag %q: want key:value, e.g. gpu:h100", t)
		}
		req.Tags = append(req.Tags, k+"="+val)
	}
	for i, r := range req.Runners {
		if !slices.Contains(messages.RunnerKinds, r) {
			return req, nil, usagef("--runner %q: unknown runner kind (known: %s)", r, strings.Join(messages.RunnerKinds, ", "))
		}
		if slices.Contains(req.Runners[:i], r) {
			return req, nil, usagef("--runner %q: given twice", r)
		}
	}
	if v.keepAlive != nil {
		if *v.keepAlive < -1 {
			return req, nil, usagef("--keep-alive %d: want -1 (pool), 0 (single job) or a number of seconds", *v.keepAlive)
		}
		req.KeepAliveS = v.keepAlive
	}
	return req, files, nil
}

// launchValues are a launch's parameters once flags and .lakeshore merged.
type launchValues struct {
	provider, name, capacity, bootstrap string
	tags, queues, runners, setups       []string
	keepAlive                           *int
}

// launchValues merges the flags given with the .lakeshore files found from
// the working directory (projectconfig has the rules).
func (a *app) launchValues(f launchFlags, given map[string]bool) (launchValues, []string, error) {
	var pf projectconfig.Flags
	pf.NoConfig, pf.NoSetup = f.noConfig, f.noSetup
	if given["provider"] {
		pf.Provider = &f.provider
	}
	if given["name"] {
		pf.Name = &f.name
	}
	if given["runner"] {
		pf.Runners = f.runners
	}
	if given["tag"] {
		pf.Tags = f.tags
	}
	if given["queue"] {
		pf.Queues = f.queues
	}
	if given["keep-alive"] {
		pf.KeepAliveS = &f.keepAlive
	}
	if given["capacity"] {
		pf.Capacity = json.RawMessage(f.capacity)
	}
	if given["bootstrap-script"] {
		pf.BootstrapScript = &f.bootstrap
	}
	pf.SetupScripts = f.setups
	dir, err := os.Getwd()
	if err != nil {
		return launchValues{}, nil, fmt.Errorf("working directory: %w", err)
	}
	l, err := projectconfig.Resolve(dir, pf)
	if err != nil {
		return launchValues{}, nil, usagef("%v", err)
	}
	v := launchValues{
		provider: l.Provider, name: l.Name, tags: l.Tags, queues: l.Queues, runners: l.Runners,
		keepAlive: l.KeepAliveS, capacity: string(l.Capacity),
	}
	if l.BootstrapScript != nil {
		v.bootstrap = l.BootstrapScript.Text
	}
	for _, s := range l.SetupScripts {
		v.setups = append(v.setups, s.Text)
	}
	return v, l.Files, nil
}
