package cli

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/spf13/cobra"

	"nymph/backoff"
	"nymph/dist"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/remoteinstall"
	"nymph/messages"
)

// InstallResult is what `daemon install --json` prints. WorkerID is null
// when the install did not wait (--no-wait) or the daemon never registered;
// JobID is set under --slurm, PID otherwise. StopCommand is the shell
// command that stops the daemon, with the ssh options the install used.
type InstallResult struct {
	LaunchID     string  `json:"launchId"`
	Label        string  `json:"label"`
	WorkerID     *string `json:"workerId"`
	Alias        string  `json:"alias"`
	LaunchDir    string  `json:"launchDir"`
	LogPath      string  `json:"logPath"`
	ConfigPath   string  `json:"configPath"`
	PID          int     `json:"pid,omitempty"`
	JobID        string  `json:"jobId,omitempty"`
	NymphVersion string  `json:"nymphVersion"`
	StopCommand  string  `json:"stopCommand"`
}

// Copy methods of --copy.
const (
	copyAuto  = "auto"
	copyRsync = "rsync"
	copySSH   = "ssh"
)

type installFlags struct {
	label, serverURL, remoteDir string
	tags, runners, remoteEnv    []string
	keepAliveS                  int
	binary, baseURL, version    string
	copyMethod                  string
	noWait, slurm, jsonOut      bool
	partition                   string
	waitTimeout                 float64
	sshBin, sshConfig           string
}

// installPlan is the validated form of the flags.
type installPlan struct {
	alias      string
	prefix     string
	tags       []string
	runners    []string
	env        [][2]string
	binaryArch string // the --binary's machine, as uname -m spells it
	wait       time.Duration
}

func (a *app) daemonInstallCmd() *cobra.Command {
	f := &installFlags{}
	cmd := &cobra.Command{
		Use:   "install <ssh-alias>",
		Short: "Bootstrap a daemon on a remote host over ssh",
		Long: `Bring a nymph daemon online on a host you can ssh to. <ssh-alias> is anything
'ssh <alias>' accepts (a Host from ~/.ssh/config, user@host, ...).

lakeshore makes a launch directory ~/.nymph/<launchId> on the host (a fresh
ULID; --remote-dir changes the base), puts the nymph binary there and checks
that it runs, mints a per-daemon token, writes the token and a config file
(mode 0600), and starts 'nymph run' detached with setsid nohup, or as a SLURM
batch job with --slurm (job name lakeshore-nymph-<launchId>; the daemon dies
with the job's wall-clock limit). The daemon's label is <prefix>-<launchId>,
where the prefix is --label or the alias.

The binary: --binary PATH copies a local linux ELF build (rsync when both
ends have it, else ssh + cat; --copy picks). Otherwise the host downloads
<base>/<version>/<triple> with curl or wget, where the triple follows the
host's 'uname -m', the version is --nymph-version or the namespace's target
version (lakeshore daemon set-target-version), and the base is
--nymph-base-url or this control plane's own /v1/releases (lakeshore release
publish). A .sha256 sidecar next to the binary is checked when present.

The daemon dials --server-url; by default the URL the control plane
advertises to daemons (its --public-url, from the credentials file of
'lakeshore serve') when this CLI talks to that server, else the URL this CLI
uses.

Unless --no-wait, lakeshore then waits up to --wait-timeout seconds for the
worker row to appear. If the daemon exits or does not register in time, the
exit code is 1 and the end of its log on the host is shown. Stop a daemon
with the command printed after 'stop:' (lakeshore daemon kill removes only
its row).

--json prints {launchId, label, workerId, alias, launchDir, logPath,
configPath, pid or jobId, nymphVersion}.`,
		Example: `  lakeshore daemon install bos14
  lakeshore daemon install h100-rig --label gpu-rig --tag gpu:h100 --tag gpu-count:8 \
    --runner docker --runner process --keep-alive-s 600
  lakeshore daemon install bos14-login --slurm --slurm-partition xeon-g6-volta
  lakeshore daemon install lab-box --binary ./bin/nymph --server-url https://cp.example:7700 --json`,
		Args:              exactArgs(1, "one <ssh-alias>"),
		ValidArgsFunction: a.completeSSHHost(&f.sshConfig),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.install(cmd.Context(), cmd, args[0], f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.label, "label", "", "label prefix; the launch id is appended (default: the ssh alias)")
	fs.StringArrayVar(&f.tags, "tag", nil, "capability tag key:value (repeatable)")
	fs.StringArrayVar(&f.runners, "runner", nil, "runner kind to advertise; the first is the default (repeatable; default process)")
	fs.IntVar(&f.keepAliveS, "keep-alive-s", -1, "idle policy: -1 pool, 0 single job, N seconds")
	fs.StringVar(&f.binary, "binary", "", "copy this local nymph binary instead of downloading one")
	fs.StringVar(&f.baseURL, "nymph-base-url", "", "download base URL (default: the control plane's /v1/releases)")
	fs.StringVar(&f.version, "nymph-version", "", "version to download (default: the namespace's target version)")
	fs.StringVar(&f.copyMethod, "copy", copyAuto, "how --binary travels: auto, rsync or ssh")
	fs.StringVar(&f.serverURL, "server-url", "", "control plane URL as the daemon reaches it")
	fs.StringVar(&f.remoteDir, "remote-dir", remoteinstall.DefaultBaseDir, "base directory on the host; ~ is the remote $HOME")
	fs.StringArrayVar(&f.remoteEnv, "remote-env", nil, "KEY=VALUE exported on the host before the daemon (and sbatch) starts (repeatable)")
	fs.BoolVar(&f.noWait, "no-wait", false, "do not wait for the daemon to register")
	floatVar(fs, &f.waitTimeout, "wait-timeout", 60, "seconds to wait for the daemon to register")
	fs.BoolVar(&f.slurm, "slurm", false, "start the daemon as a SLURM batch job (sbatch) instead of setsid nohup")
	fs.StringVar(&f.partition, "slurm-partition", "", "sbatch --partition (only with --slurm)")
	fs.StringVar(&f.sshBin, "ssh", "ssh", "ssh program")
	fs.StringVarP(&f.sshConfig, "ssh-config", "F", "", "ssh config file (ssh -F)")
	fs.BoolVar(&f.jsonOut, "json", false, "print JSON")
	return cmd
}

// validate checks the flags without touching the network or the host.
func (f *installFlags) validate(alias string) (installPlan, error) {
	p := installPlan{alias: alias, prefix: f.label}
	if alias == "" || strings.HasPrefix(alias, "-") || strings.IndexFunc(alias, badNameRune) >= 0 {
		return p, usagef("ssh alias %q: want a host name or alias as ssh takes it (no leading '-', no spaces)", alias)
	}
	if p.prefix == "" {
		p.prefix = alias
	}
	if strings.IndexFunc(p.prefix, badNameRune) >= 0 {
		return p, usagef("--label %q: must not contain spaces or control characters", f.label)
	}
	for _, t := range f.tags {
		k, v, ok := strings.Cut(t, ":")
		if !ok || strings.TrimSpace(k) == "" || strings.IndexFunc(t, badNameRune) >= 0 {
			return p, usagef("--tag %q: want key:value, e.g. gpu:h100", t)
		}
		p.tags = append(p.tags, k+"="+v)
	}
	p.runners = f.runners
	if len(p.runners) == 0 {
		p.runners = []string{"process"}
	}
	for i, r := range p.runners {
		if !slices.Contains(messages.RunnerKinds, r) {
			return p, usagef("--runner %q: unknown runner kind (known: %s)", r, strings.Join(messages.RunnerKinds, ", "))
		}
		if slices.Contains(p.runners[:i], r) {
			return p, usagef("--runner %q: given twice", r)
		}
	}
	if f.keepAliveS < -1 {
		return p, usagef("--keep-alive-s %d: want -1 (pool), 0 (single job) or a number of seconds", f.keepAliveS)
	}
	if f.binary != "" && f.baseURL != "" {
		return p, usagef("--binary and --nymph-base-url are mutually exclusive: copy a local binary or download one")
	}
	if f.binary != "" && f.version != "" {
		return p, usagef("--nymph-version only applies to a download; --binary installs the binary as it is")
	}
	if f.baseURL != "" {
		if u, err := url.Parse(f.baseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return p, usagef("--nymph-base-url %q: want an http:// or https:// URL", f.baseURL)
		}
	}
	if f.serverURL != "" {
		if u, err := url.Parse(f.serverURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return p, usagef("--server-url %q: want an http:// or https:// URL with a host", f.serverURL)
		}
	}
	if f.partition != "" && !f.slurm {
		return p, usagef("--slurm-partition only applies with --slurm")
	}
	switch f.copyMethod {
	case copyAuto, copyRsync, copySSH:
	default:
		return p, usagef("--copy %q: want auto, rsync or ssh", f.copyMethod)
	}
	if f.copyMethod != copyAuto && f.binary == "" {
		return p, usagef("--copy only applies with --binary")
	}
	if strings.TrimSpace(f.remoteDir) == "" {
		return p, usagef("--remote-dir must not be empty")
	}
	for _, kv := range f.remoteEnv {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !remoteinstall.ValidEnvName(k) {
			return p, usagef("--remote-env %q: want KEY=VALUE with a shell variable name", kv)
		}
		p.env = append(p.env, [2]string{k, v})
	}
	if f.waitTimeout <= 0 {
		return p, usagef("--wait-timeout %v: want a positive number of seconds", f.waitTimeout)
	}
	p.wait = time.Duration(f.waitTimeout * float64(time.Second))
	if f.sshBin == "" {
		return p, usagef("--ssh must not be empty")
	}
	return p, nil
}

func badNameRune(r rune) bool { return r <= ' ' || r == 0x7f }

// checkBinary makes sure path is a linux ELF executable and returns its
// machine as `uname -m` spells it ("" for a machine we do not name).
func checkBinary(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("--binary: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("--binary %s: not a regular file", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("--binary %s: not an ELF executable (a linux build of nymph is needed): %w", path, err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("--binary %s: an ELF %s, not an executable", path, f.Type)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "x86_64", nil
	case elf.EM_AARCH64:
		return "aarch64", nil
	case elf.EM_RISCV:
		return "riscv64", nil
	case elf.EM_386:
		return "i686", nil
	case elf.EM_ARM:
		return "armv7l", nil
	case elf.EM_S390:
		return "s390x", nil
	case elf.EM_PPC64:
		return "ppc64le", nil
	}
	return "", nil
}

func (a *app) install(ctx context.Context, cmd *cobra.Command, alias string, f *installFlags) error {
	plan, err := f.validate(alias)
	if err != nil {
		return err
	}
	if f.binary != "" {
		if plan.binaryArch, err = checkBinary(f.binary); err != nil {
			return err
		}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	// Fail on a wrong URL or token before anything happens on the host.
	if _, err := c.ListWorkers(ctx); err != nil {
		return err
	}
	serverURL := f.serverURL
	if serverURL == "" {
		serverURL = a.daemonFacingURL(c)
	}
	serverURL = strings.TrimRight(serverURL, "/")

	// Settle what to download before touching the host.
	var version string
	var known map[string]string // triple -> sha256 of this control plane's releases
	base := strings.TrimRight(f.baseURL, "/")
	if f.binary == "" {
		if version, err = a.installVersion(ctx, c, f.version); err != nil {
			return err
		}
		if base == "" {
			base = serverURL + operatorapi.ReleasesPrefix
			if known, err = publishedSums(ctx, c, version); err != nil {
				return err
			}
		}
	}

	if !f.jsonOut && isLoopbackURL(serverURL) && !isLoopbackHost(alias) {
		fmt.Fprintf(a.env.Stderr, "note: the daemon on %s will dial %s, a loopback address; if %s is another machine, pass --server-url\n", alias, serverURL, alias)
	}

	ssh := sshRunner{bin: f.sshBin, config: f.sshConfig, alias: alias}
	launchID := ulid.Make().String()
	label := plan.prefix + "-" + launchID

	prog := startProgress(a.env.Stderr, a.env.StderrTTY, "connecting to "+alias)
	defer prog.Stop()
	out, err := ssh.script(ctx, remoteinstall.Exports(plan.env)+remoteinstall.ProbeScript(f.remoteDir, launchID))
	if err != nil {
		return err
	}
	probe, err := remoteinstall.ParseProbe(out)
	if err != nil {
		return fmt.Errorf("on %s: %w", alias, err)
	}
	layout := remoteinstall.Layout{Dir: probe.Dir}
	// keep is set once a daemon may be running from the launch directory.
	keep := false
	defer func() {
		if !keep {
			// Nothing runs there: leave no half-made launch directory.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_, _ = ssh.script(cctx, remoteinstall.RemoveScript(layout))
		}
	}()

	if f.slurm && !probe.Tools["sbatch"] {
		return fmt.Errorf("--slurm: sbatch is not on the PATH of an ssh session on %s (add its directory with --remote-env PATH=...)", alias)
	}
	if f.binary == "" && !probe.Tools["curl"] && !probe.Tools["wget"] {
		return fmt.Errorf("%s has neither curl nor wget to download nymph with; install one or pass --binary", alias)
	}
	triple, tripleErr := dist.TripleForArch(probe.Arch)
	var download *remoteinstall.Download
	if f.binary != "" {
		if tripleErr == nil && plan.binaryArch != "" {
			if bt, err := dist.TripleForArch(plan.binaryArch); err == nil && bt != triple {
				return fmt.Errorf("--binary %s is built for %s but %s is %s (%s)", f.binary, bt, alias, probe.Arch, triple)
			}
		}
		prog.Set(fmt.Sprintf("copying %s to %s", f.binary, alias))
		if err := a.copyBinary(ctx, ssh, f, probe, layout); err != nil {
			return err
		}
	} else {
		if tripleErr != nil {
			return fmt.Errorf("%s reports machine %q (uname -m), for which no nymph release is known; pass --binary", alias, probe.Arch)
		}
		if _, ok := known[triple]; known != nil && !ok {
			return fmt.Errorf("this control plane has no nymph %s for %s (the machine of %s): publish one (lakeshore release publish --version %s --triple %s) or pass --binary", version, triple, alias, version, triple)
		}
		download = &remoteinstall.Download{URL: dist.URLFor(base, "", version, triple), SHA256: known[triple]}
		prog.Set(fmt.Sprintf("downloading nymph %s on %s", version, alias))
	}

	tok, err := c.CreateToken(ctx, operatorapi.TokenRequest{Kind: operatorapi.TokenDaemon, Label: label})
	if err != nil {
		return fmt.Errorf("mint the daemon token: %w", err)
	}
	cfg, err := remoteinstall.RenderConfig(layout, remoteinstall.Spec{
		LaunchID: launchID, Label: label, ServerURL: serverURL,
		Tags: plan.tags, Runners: plan.runners, KeepAliveS: f.keepAliveS,
	})
	if err != nil {
		return err
	}
	setup, err := remoteinstall.SetupScript(remoteinstall.SetupInput{
		Layout: layout, LaunchID: launchID, Download: download, Token: tok.Token, Config: cfg,
		Start: remoteinstall.Start{Slurm: f.slurm, Partition: f.partition, Env: plan.env},
	})
	if err != nil {
		return err
	}
	prog.Set("starting nymph on " + alias)
	out, err = ssh.script(ctx, setup)
	if err != nil {
		// The script starts the daemon last and stops at its first
		// failure, so a failed script started nothing. A lost connection
		// or an interrupt may have come after the start.
		var se *sshError
		keep = !errors.As(err, &se) || se.code == 255
		if keep {
			err = fmt.Errorf("%w\n(the daemon may have started; see %s on %s)", err, layout.Dir, alias)
		}
		return explainSetup(err)
	}
	fields := map[string]string{}
	for k, v := range remoteinstall.Fields(out) {
		fields[k] = v
	}
	keep = fields["pid"] != "" || fields["job"] != ""
	if !keep {
		return fmt.Errorf("on %s: the start script reported neither a pid nor a job id:\n%s", alias, out)
	}
	pid := 0
	if fields["pid"] != "" {
		if pid, err = strconv.Atoi(fields["pid"]); err != nil || pid <= 0 {
			return fmt.Errorf("on %s: the start script reported pid %q, not a process id (see %s there)", alias, fields["pid"], layout.Dir)
		}
	}
	prog.Stop()

	res := InstallResult{
		LaunchID: launchID, Label: label, Alias: alias, LaunchDir: layout.Dir,
		LogPath: layout.Log(), ConfigPath: layout.Config(),
		PID: pid, JobID: fields["job"], NymphVersion: fields["version"],
		StopCommand: remoteinstall.StopHint(ssh.command(), layout, fields["job"], plan.env),
	}
	if !f.jsonOut {
		a.printInstall(res)
	}
	if f.noWait {
		if f.jsonOut {
			return writeJSON(a.env.Stdout, res)
		}
		_, err := fmt.Fprintf(a.env.Stdout, "not waiting for it to register; see lakeshore daemon show %s\n", label)
		return err
	}
	w, werr := a.waitRegistered(ctx, c, ssh, layout, label, f.slurm, plan)
	if werr == nil {
		res.WorkerID = &w.ID
	}
	if f.jsonOut {
		if err := writeJSON(a.env.Stdout, res); err != nil {
			return err
		}
	} else if werr == nil {
		fmt.Fprintf(a.env.Stdout, "registered as %s\n", describe(w))
	}
	return werr
}

func (a *app) printInstall(r InstallResult) {
	tw := newTable(a.env.Stdout)
	fmt.Fprintf(tw, "launch:\t%s\n", r.LaunchID)
	fmt.Fprintf(tw, "label:\t%s\n", r.Label)
	fmt.Fprintf(tw, "nymph:\t%s\n", orDash(r.NymphVersion))
	fmt.Fprintf(tw, "config:\t%s (on %s)\n", r.ConfigPath, r.Alias)
	fmt.Fprintf(tw, "log:\t%s (on %s)\n", r.LogPath, r.Alias)
	if r.JobID != "" {
		fmt.Fprintf(tw, "slurm job:\t%s (%s)\n", r.JobID, remoteinstall.JobName(r.LaunchID))
	} else {
		fmt.Fprintf(tw, "pid:\t%d\n", r.PID)
	}
	fmt.Fprintf(tw, "stop:\t%s\n", r.StopCommand)
	_ = tw.Flush()
}

// daemonFacingURL is the control plane URL a daemon should dial: the public
// URL `lakeshore serve` recorded, when this CLI talks to that server, else
// the URL this CLI uses.
func (a *app) daemonFacingURL(c *opclient.Client) string {
	own := c.BaseURL()
	path, err := CredentialsPath(a.env.Getenv)
	if err != nil {
		return own
	}
	creds, err := ReadCredentials(path)
	if err != nil || creds.PublicURL == "" {
		return own
	}
	if sameServer(own, creds.URL) || sameServer(own, creds.PublicURL) {
		return creds.PublicURL
	}
	return own
}

// installVersion is the version to download: the flag, else the namespace's
// target version.
func (a *app) installVersion(ctx context.Context, c *opclient.Client, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	tv, err := c.TargetVersion(ctx)
	switch {
	case opclient.IsNotFound(err):
		return "", errors.New("this control plane serves no nymph releases; pass --binary PATH (a linux nymph build) to copy one")
	case err != nil:
		return "", fmt.Errorf("read the target nymph version: %w", err)
	case tv.Version == nil || *tv.Version == "":
		return "", fmt.Errorf("namespace %q has no target nymph version to download: pass --binary PATH, or --nymph-version V, or set one (lakeshore daemon set-target-version V)", c.Namespace())
	}
	return *tv.Version, nil
}

// publishedSums maps each triple this control plane publishes version for
// to its sha256.
func publishedSums(ctx context.Context, c *opclient.Client, version string) (map[string]string, error) {
	rels, err := c.ListReleases(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the control plane's releases: %w", err)
	}
	out := map[string]string{}
	for _, r := range rels {
		if r.Version == version {
			out[r.Triple] = r.SHA256
		}
	}
	return out, nil
}

// copyBinary puts the local binary at the layout's partial path.
func (a *app) copyBinary(ctx context.Context, ssh sshRunner, f *installFlags, probe remoteinstall.Probe, l remoteinstall.Layout) error {
	useRsync := false
	switch f.copyMethod {
	case copyRsync:
		if _, err := exec.LookPath("rsync"); err != nil {
			return errors.New("--copy rsync: rsync is not installed here")
		}
		if !probe.Tools["rsync"] {
			return fmt.Errorf("--copy rsync: rsync is not installed on %s", ssh.alias)
		}
		if !ssh.rsyncable() {
			return errors.New("--copy rsync: the ssh program, config path or alias has characters rsync's -e cannot carry; use --copy ssh")
		}
		useRsync = true
	case copyAuto:
		_, err := exec.LookPath("rsync")
		useRsync = err == nil && probe.Tools["rsync"] && ssh.rsyncable()
	}
	if useRsync {
		return ssh.rsync(ctx, f.binary, l.Partial())
	}
	in, err := os.Open(f.binary)
	if err != nil {
		return fmt.Errorf("--binary: %w", err)
	}
	defer in.Close()
	if _, err := ssh.run(ctx, in, "cat > "+remoteinstall.Quote(l.Partial())); err != nil {
		return fmt.Errorf("copy %s: %w", f.binary, err)
	}
	return nil
}

func explainSetup(err error) error {
	var se *sshError
	if !errors.As(err, &se) {
		return err
	}
	switch se.code {
	case remoteinstall.ExitNoDownloader, remoteinstall.ExitDownload, remoteinstall.ExitChecksum:
		return fmt.Errorf("fetch nymph on %s: %s", se.alias, se.stderr)
	case remoteinstall.ExitBadBinary:
		return fmt.Errorf("on %s: %s", se.alias, se.stderr)
	case remoteinstall.ExitStart:
		return fmt.Errorf("start nymph on %s: %s", se.alias, se.stderr)
	}
	return err
}

// waitRegistered polls the worker list for label. Every few seconds it asks
// the host whether the daemon still runs, so a daemon that exits at once
// fails the install at once; on failure the error carries its log tail.
func (a *app) waitRegistered(ctx context.Context, c *opclient.Client, ssh sshRunner, l remoteinstall.Layout,
	label string, slurm bool, plan installPlan) (operatorapi.Worker, error) {
	prog := startProgress(a.env.Stderr, a.env.StderrTTY, "waiting for "+label+" to register")
	defer prog.Stop()
	start := time.Now()
	deadline := start.Add(plan.wait)
	nextCheck := start.Add(2 * time.Second)
	find := func() (operatorapi.Worker, bool, error) {
		ws, err := c.ListWorkers(ctx)
		if err != nil {
			return operatorapi.Worker{}, false, err
		}
		for _, w := range ws {
			if w.Label == label {
				return w, true, nil
			}
		}
		return operatorapi.Worker{}, false, nil
	}
	for {
		w, ok, err := find()
		switch {
		case ok:
			return w, nil
		case err != nil && !opclient.Retryable(err):
			return operatorapi.Worker{}, err
		}
		now := time.Now()
		if now.After(deadline) {
			prog.Stop()
			state, tail := a.remoteStatus(ctx, ssh, l, slurm, plan.env)
			what := "is still running but did not register"
			if state == "exited" {
				what = "has exited"
			}
			return operatorapi.Worker{}, fmt.Errorf("nymph on %s did not register as %s within %s; it %s%s",
				ssh.alias, label, span(plan.wait), what, logTail(l, ssh.alias, tail))
		}
		if now.After(nextCheck) {
			nextCheck = now.Add(5 * time.Second)
			if state, tail := a.remoteStatus(ctx, ssh, l, slurm, plan.env); state == "exited" {
				// It may have registered and stopped in between (keep-alive 0).
				if w, ok, _ := find(); ok {
					return w, nil
				}
				prog.Stop()
				return operatorapi.Worker{}, fmt.Errorf("nymph on %s exited before it registered as %s%s", ssh.alias, label, logTail(l, ssh.alias, tail))
			}
		}
		if !backoff.Sleep(ctx, 250*time.Millisecond) {
			return operatorapi.Worker{}, ctx.Err()
		}
	}
}

// remoteStatus asks the host about the daemon; a failed ssh reads as an
// unknown state with the failure as the tail.
func (a *app) remoteStatus(ctx context.Context, ssh sshRunner, l remoteinstall.Layout, slurm bool, env [][2]string) (state, tail string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	out, err := ssh.script(cctx, remoteinstall.StatusScript(l, slurm, env, 40))
	if err != nil {
		return "", fmt.Sprintf("(could not read the log: %v)\n", err)
	}
	return remoteinstall.ParseStatus(out)
}

func logTail(l remoteinstall.Layout, alias, tail string) string {
	tail = strings.TrimRight(tail, "\n")
	if tail == "" {
		tail = "(empty)"
	}
	return fmt.Sprintf("\n--- last lines of %s on %s ---\n%s", l.Log(), alias, tail)
}

// sshRunner runs commands on one host through the ssh program.
type sshRunner struct {
	bin, config, alias string
}

// sshError is a failed remote command, or a failure to reach the host
// (code 255, ssh's own).
type sshError struct {
	alias  string
	code   int
	stderr string
}

func (e *sshError) Error() string {
	if e.code == 255 {
		return fmt.Sprintf("ssh %s failed: %s", e.alias, orDash(e.stderr))
	}
	return fmt.Sprintf("on %s (exit %d): %s", e.alias, e.code, orDash(e.stderr))
}

func (s sshRunner) args(remote ...string) []string {
	var args []string
	if s.config != "" {
		args = append(args, "-F", s.config)
	}
	return append(append(args, "--", s.alias), remote...)
}

// command is the ssh command line that reaches the host, as an operator
// would type it: the program, -F, the alias.
func (s sshRunner) command() []string {
	cmd := []string{s.bin}
	if s.config != "" {
		cmd = append(cmd, "-F", s.config)
	}
	return append(cmd, s.alias)
}

// run executes remote (one string the remote shell parses) with stdin.
func (s sshRunner) run(ctx context.Context, stdin io.Reader, remote string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, s.args(remote)...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err == nil {
		return out.String(), nil
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), &sshError{alias: s.alias, code: ee.ExitCode(), stderr: strings.TrimSpace(errb.String())}
	}
	return "", fmt.Errorf("run %s: %w", s.bin, err)
}

// script runs a POSIX sh script on the host, read from standard input so
// that nothing in it shows in the remote process list.
func (s sshRunner) script(ctx context.Context, script string) (string, error) {
	return s.run(ctx, strings.NewReader(script), "sh -s")
}

// rsyncable reports whether rsync's -e can carry the ssh command: rsync
// splits it on spaces and honours quotes, but not backslashes; an alias
// with a colon would be read as part of the path.
func (s sshRunner) rsyncable() bool {
	return !strings.ContainsAny(s.bin+s.config, `'"\`) && !strings.Contains(s.alias, ":")
}

func (s sshRunner) rsync(ctx context.Context, local, remote string) error {
	rsh := rsyncWord(s.bin)
	if s.config != "" {
		rsh += " -F " + rsyncWord(s.config)
	}
	// -s: the remote path travels as data, never through the remote shell.
	cmd := exec.CommandContext(ctx, "rsync", "-s", "-z", "--chmod=F600", "-e", rsh, local, s.alias+":"+remote)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("rsync %s to %s: %v: %s", local, s.alias, err, strings.TrimSpace(errb.String()))
	}
	return nil
}

func rsyncWord(s string) string {
	if strings.ContainsAny(s, " \t") {
		return "'" + s + "'"
	}
	return s
}

func isLoopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && isLoopbackHost(u.Hostname())
}

func isLoopbackHost(h string) bool {
	if i := strings.LastIndex(h, "@"); i >= 0 {
		h = h[i+1:]
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// completeSSHHost offers the Host names (without wildcards) of the ssh
// config: --ssh-config when given, else ~/.ssh/config.
func (a *app) completeSSHHost(cfg *string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(_ *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		path := *cfg
		if path == "" {
			home := a.env.Getenv("HOME")
			if home == "" {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			path = filepath.Join(home, ".ssh", "config")
		}
		return sshHosts(path, prefix), cobra.ShellCompDirectiveNoFileComp
	}
}

func sshHosts(path, prefix string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.ReplaceAll(sc.Text(), "=", " "))
		if len(fields) < 2 || !strings.EqualFold(fields[0], "Host") {
			continue
		}
		for _, h := range fields[1:] {
			if !strings.ContainsAny(h, "*?!") && strings.HasPrefix(h, prefix) && !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	return out
}
