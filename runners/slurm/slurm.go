// Package slurm owns the "slurm" runner: an invocation runs as a SLURM job
// through `srun`, named nymph-<invocation_id>. srun is used rather than
// `sbatch --wait` because it returns as soon as the job ends (sbatch polls
// at 2 s, then 10 s), and it streams the job's stdout and stderr back and
// forwards the args on stdin.
//
// What runs is what the process runner runs: Spec.Script as
// `bash <ScratchDir>/script`, or Function.Module with Function.Qualname as
// argv[1]; Spec.AsUser wraps it in `runuser -u USER --` inside the job. The
// protocol files stay in the scratch directory, so it must be on a
// filesystem the compute nodes share with the daemon. The job's environment
// is srun's: the daemon's own, Spec.Env, the runner's configured
// environment (e.g. SLURM_CONF) and the protocol variables. The working
// directory is Spec.Workdir (or the scratch directory) via --chdir.
//
// A timeout or a cancelled context cancels the job by name with scancel
// (SLURM sends SIGTERM, then SIGKILL after the cluster's KillWait), kills
// srun's own process group, and waits until squeue no longer lists the job.
// A job whose processes ignore SIGTERM therefore takes KillWait and
// slurmd's own completion polling (seconds) to go.
//
// A daemon killed outright cannot cancel anything, and its srun may die
// while the job lives on. So every job carries the daemon's owner mark
// (WithOwner, given by the daemon) in its comment, as
// "<mark>@<host>": the mark comes from the workdir path, which daemons on
// the login nodes of one cluster may well share, so the host keeps one
// daemon from cancelling another's jobs. ReapLeftovers, called at the next
// start, cancels this user's jobs that carry the comment.
package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

// Kind is the run_config.runner name of this runner.
const Kind = "slurm"

// goneTimeout bounds the wait for a cancelled job to leave squeue.
const goneTimeout = 60 * time.Second

// Runner runs invocations as SLURM jobs.
type Runner struct {
	host     protocol.Host
	binDir   string
	srunArgs []string
	env      map[string]string
	owner    string
	hostname string
}

var _ runners.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithBinDir sets the directory of srun, scancel and squeue (default:
// found in PATH).
func WithBinDir(dir string) Option {
	return func(r *Runner) { r.binDir = dir }
}

// WithSrunArgs adds srun flags, e.g. "--partition=gpu".
func WithSrunArgs(args ...string) Option {
	return func(r *Runner) { r.srunArgs = append([]string(nil), args...) }
}

// WithEnv adds KEY=VALUE entries to the environment of every SLURM command
// (srun, scancel, squeue), e.g. SLURM_CONF=/etc/slurm/other.conf. Entries
// without '=' are ignored.
func WithEnv(entries ...string) Option {
	return func(r *Runner) {
		for _, e := range entries {
			if k, v, ok := strings.Cut(e, "="); ok && k != "" {
				r.env[k] = v
			}
		}
	}
}

// WithKillGrace sets how long a stopped run's srun gets between SIGTERM
// and SIGKILL (default 5 s); the job's own processes follow the cluster's
// KillWait.
func WithKillGrace(d time.Duration) Option {
	return func(r *Runner) { r.host.SetKillGrace(d) }
}

// WithOwner sets the owner mark put in every job's comment. Empty (the
// default) means no comment, so no job of this runner is ever reaped.
func WithOwner(marker string) Option {
	return func(r *Runner) { r.owner = marker }
}

// New returns a slurm runner.
func New(log zerolog.Logger, opts ...Option) *Runner {
	// Without a host name the comment is the mark alone.
	hostname, _ := os.Hostname()
	return protocol.Apply(&Runner{
		host:     protocol.NewHost(Kind, log),
		hostname: hostname,
		env:      map[string]string{},
	}, opts)
}

// Kind implements runners.Runner.
func (r *Runner) Kind() string { return Kind }

// comment is the job comment that marks a job of the daemon marked marker
// on this host.
func (r *Runner) comment(marker string) string {
	if r.hostname == "" {
		return marker
	}
	return marker + "@" + r.hostname
}

// JobName is the SLURM job name of an invocation.
func JobName(invocationID string) string {
	return "nymph-" + strings.Map(func(c rune) rune {
		if c <= ' ' || c == ',' || c == '"' || c == '\'' || c == '\\' || c == 0x7f {
			return '-'
		}
		return c
	}, invocationID)
}

func (r *Runner) bin(name string) (string, error) {
	return exec.LookPath(r.path(name))
}

// path is the SLURM command name, in the bin dir when one is set.
func (r *Runner) path(name string) string {
	if r.binDir != "" {
		return filepath.Join(r.binDir, name)
	}
	return name
}

// Run implements runners.Runner.
func (r *Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if spec.InvocationID == "" {
		return protocol.Invalid("invocation_id is required for the slurm runner"), nil
	}
	if spec.Script == "" && spec.Function.Module == "" {
		return protocol.Invalid("function.module is required for the slurm runner when no script is given"), nil
	}
	name := JobName(spec.InvocationID)
	return r.host.Exec(ctx, spec, protocol.Job{
		Log: r.host.RunLog(spec).Str("job_name", name).Logger(),
		Bin: r.path("srun"),
		Build: func(f protocol.Files, srun string) (protocol.Launch, error) {
			command, err := r.host.Command(spec, f)
			if err != nil {
				return protocol.Launch{}, err
			}
			workdir := protocol.Workdir(spec)
			argv := []string{srun, "--job-name=" + name, "--ntasks=1", "--chdir=" + workdir, "--quiet"}
			if r.owner != "" {
				argv = append(argv, "--comment="+r.comment(r.owner))
			}
			argv = append(argv, r.srunArgs...)
			return protocol.Launch{
				Command: procgroup.Command{
					Argv: append(argv, command...),
					Env:  protocol.HostEnv(spec, f, r.env),
					Dir:  workdir,
					Stop: func(ctx context.Context) error { return r.stopJob(ctx, name) },
				},
				Remove:        func(ctx context.Context) error { return r.cancelJob(ctx, name) },
				RemoveTimeout: goneTimeout,
				Left:          "job left behind",
				Stopping:      "cancelling job",
			}, nil
		},
	})
}

// ReapLeftovers cancels this user's jobs whose comment marks them as
// started on this host by a daemon marked marker: the ones a previous run
// of that daemon left behind. Other jobs are never touched. It returns how
// many jobs it cancelled; SLURM ends them asynchronously (SIGTERM, then
// SIGKILL after the cluster's KillWait), and a job already completing is
// left to finish. An empty marker cancels nothing.
func (r *Runner) ReapLeftovers(ctx context.Context, marker string) (int, error) {
	if marker == "" {
		return 0, nil
	}
	squeue, err := r.bin("squeue")
	if err != nil {
		return 0, fmt.Errorf("slurm runner: %w", err)
	}
	out, err := r.cmd(ctx, squeue, "--noheader", "--user="+strconv.Itoa(os.Getuid()), "--format=%i|%T|%k").Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return 0, fmt.Errorf("slurm runner: squeue: %w: %s", err, strings.TrimSpace(string(exitErr.Stderr)))
		}
		return 0, fmt.Errorf("slurm runner: squeue: %w", err)
	}
	want := r.comment(marker)
	var ids []string
	for _, line := range strings.Split(string(out), "\n") {
		id, rest, _ := strings.Cut(strings.TrimSpace(line), "|")
		state, comment, _ := strings.Cut(rest, "|")
		if id != "" && comment == want && state != "COMPLETING" {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	scancel, err := r.bin("scancel")
	if err != nil {
		return 0, fmt.Errorf("slurm runner: %w", err)
	}
	var errs []error
	cancelled := 0
	for _, id := range ids {
		if out, err := r.cmd(ctx, scancel, id).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("scancel %s: %w: %s", id, err, strings.TrimSpace(string(out))))
			continue
		}
		cancelled++
	}
	if err := errors.Join(errs...); err != nil {
		return cancelled, fmt.Errorf("slurm runner: %w", err)
	}
	return cancelled, nil
}

// stopJob is the first response to a timeout or cancellation, while srun
// is still running: cancel the job and give it the kill grace to leave
// squeue. SLURM itself escalates from SIGTERM to SIGKILL after the
// cluster's KillWait. Whatever is still listed afterwards is waited for by
// cancelJob once srun is gone.
func (r *Runner) stopJob(ctx context.Context, name string) error {
	scancel, squeue, err := r.tools()
	if err != nil {
		return err
	}
	if out, err := r.cmd(ctx, scancel, "--name="+name).CombinedOutput(); err != nil {
		return fmt.Errorf("scancel --name=%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	_, err = r.waitGone(ctx, squeue, name, time.Now().Add(r.host.KillGrace))
	return err
}

// cancelJob cancels the job by name, unless squeue no longer lists it,
// and waits until it does not.
func (r *Runner) cancelJob(ctx context.Context, name string) error {
	scancel, squeue, err := r.tools()
	if err != nil {
		return err
	}
	if gone, err := r.waitGone(ctx, squeue, name, time.Now()); err != nil || gone {
		return err
	}
	if out, err := r.cmd(ctx, scancel, "--name="+name).CombinedOutput(); err != nil {
		return fmt.Errorf("scancel --name=%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(goneTimeout)
	}
	gone, err := r.waitGone(ctx, squeue, name, deadline)
	if err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("job %s still listed by squeue", name)
	}
	return nil
}

func (r *Runner) tools() (scancel, squeue string, err error) {
	if scancel, err = r.bin("scancel"); err != nil {
		return "", "", err
	}
	if squeue, err = r.bin("squeue"); err != nil {
		return "", "", err
	}
	return scancel, squeue, nil
}

// waitGone polls squeue until it lists no job of that name or the
// deadline passes.
func (r *Runner) waitGone(ctx context.Context, squeue, name string, deadline time.Time) (bool, error) {
	pause := 10 * time.Millisecond
	for {
		out, err := r.cmd(ctx, squeue, "--noheader", "--name="+name, "--format=%i").Output()
		if err != nil {
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				return false, fmt.Errorf("squeue: %w: %s", err, strings.TrimSpace(string(exitErr.Stderr)))
			}
			return false, fmt.Errorf("squeue: %w", err)
		}
		if strings.TrimSpace(string(out)) == "" {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(pause):
		}
		if pause < 200*time.Millisecond {
			pause *= 2
		}
	}
}

func (r *Runner) cmd(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	env := os.Environ()
	for k, v := range r.env {
		env = append(env, k+"="+v)
	}
	cmd.Env = env
	return cmd
}
