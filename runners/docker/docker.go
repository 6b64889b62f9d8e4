// Package docker owns the "docker" runner: an invocation runs in a
// container started by a docker-compatible CLI (docker or podman), named
// nymph-<invocation_id>, with Spec.Image as its image.
//
// The scratch directory is mounted at /nymph, so the protocol files are
// /nymph/args, /nymph/result and /nymph/error inside the container; the
// args also arrive on stdin (-i). Spec.Workdir, when set, is a host
// directory mounted at the same path and used as the working directory
// (otherwise /nymph). Only Spec.Env and the protocol variables reach the
// container, never the daemon's own environment.
//
// What runs: Spec.Script is written to the scratch directory and run with
// the runner's shell (default /bin/sh, because small images have no bash);
// otherwise Function.Module is the command inside the image and
// Function.Qualname, when non-empty, its single argument; with neither, the
// image's own entrypoint and command run. Spec.AsUser becomes --user.
//
// A timeout or a cancelled context stops the named container (`stop -t`
// with the kill grace, then `kill` and `rm -f`) and waits until the CLI no longer
// knows it, besides killing the CLI's own process group.
//
// A daemon killed outright cannot do that: its CLI dies with it, but the
// container lives on under the engine (or podman's conmon), out of reach of
// the daemon's process sweep. So every container carries the daemon's owner
// mark (WithOwner, given by the daemon) as the OwnerLabel label,
// and ReapLeftovers, called at the next start, removes the containers that
// carry it.
package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

// Kind is the run_config.runner name of this runner.
const Kind = "docker"

// ContainerDir is where the scratch directory is mounted in the container.
const ContainerDir = "/nymph"

// OwnerLabel is the label naming the daemon that started a container; its
// value is the daemon's owner mark.
const OwnerLabel = "nymph.owner"

// goneTimeout bounds the wait for a removed container to disappear.
const goneTimeout = 30 * time.Second

// Runner runs invocations in containers.
type Runner struct {
	host       protocol.Host
	cli        string
	globalArgs []string
	runArgs    []string
	owner      string
}

var _ runners.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithCLI sets the container CLI (default "docker"; "podman" works too).
func WithCLI(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.cli = path
		}
	}
}

// WithGlobalArgs sets flags put before every subcommand, e.g. podman's
// "--runtime runc --cgroup-manager cgroupfs".
func WithGlobalArgs(args ...string) Option {
	return func(r *Runner) { r.globalArgs = append([]string(nil), args...) }
}

// WithRunArgs sets extra flags of `run`, e.g. "--network=none" or
// "--runtime=runsc".
func WithRunArgs(args ...string) Option {
	return func(r *Runner) { r.runArgs = append([]string(nil), args...) }
}

// WithShell sets the interpreter of scripts inside the container (default
// "/bin/sh").
func WithShell(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.host.Shell = path
		}
	}
}

// WithKillGrace sets the time a stopped container gets between SIGTERM and
// SIGKILL (default 5 s; the CLI takes whole seconds, rounded up).
func WithKillGrace(d time.Duration) Option {
	return func(r *Runner) { r.host.SetKillGrace(d) }
}

// WithKind sets the name Kind reports, for a runner that is this one under
// another name (gvisor with an image).
func WithKind(kind string) Option {
	return func(r *Runner) {
		if kind != "" {
			r.host.Kind = kind
		}
	}
}

// WithOwner sets the owner mark put on every container as its OwnerLabel.
// Empty (the default) means no label, so no container of this runner is
// ever reaped.
func WithOwner(marker string) Option {
	return func(r *Runner) { r.owner = marker }
}

// New returns a docker runner.
func New(log zerolog.Logger, opts ...Option) *Runner {
	host := protocol.NewHost(Kind, log)
	host.Shell = "/bin/sh"
	return protocol.Apply(&Runner{host: host, cli: "docker"}, opts)
}

// Kind implements runners.Runner.
func (r *Runner) Kind() string { return r.host.Kind }

// ContainerName is the name of the container of an invocation: characters
// a container name cannot hold become '-'.
func ContainerName(invocationID string) string {
	var b strings.Builder
	b.WriteString("nymph-")
	for _, c := range invocationID {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
		}
	}
	return b.String()
}

// Run implements runners.Runner.
func (r *Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if spec.Image == "" {
		return protocol.Invalid("run_config.image is required for the " + r.host.Kind + " runner"), nil
	}
	if spec.InvocationID == "" {
		return protocol.Invalid("invocation_id is required for the " + r.host.Kind + " runner"), nil
	}
	name := ContainerName(spec.InvocationID)
	return r.host.Exec(ctx, spec, protocol.Job{
		Log: r.host.RunLog(spec).Str("container", name).Logger(),
		Bin: r.cli,
		Build: func(f protocol.Files, cli string) (protocol.Launch, error) {
			argv, err := r.argv(spec, f, cli, name)
			return protocol.Launch{
				Command: procgroup.Command{
					Argv: argv,
					Env:  os.Environ(),
					Dir:  f.Dir,
					Stop: func(ctx context.Context) error { return r.remove(ctx, cli, name, true) },
				},
				Remove:        func(ctx context.Context) error { return r.remove(ctx, cli, name, false) },
				RemoveTimeout: goneTimeout + r.host.KillGrace,
				Left:          "container left behind",
				Stopping:      "stopping container",
			}, err
		},
	})
}

// argv is the CLI's `run` of the container named name, with the protocol
// files of f mounted at ContainerDir.
func (r *Runner) argv(spec runners.Spec, f protocol.Files, cli, name string) ([]string, error) {
	inside := protocol.FilesIn(ContainerDir)
	command := protocol.FunctionArgv(spec.Function)
	if spec.Script != "" {
		if err := protocol.WriteScript(f, spec.Script); err != nil {
			return nil, err
		}
		command = []string{r.host.Shell, inside.Script}
	}
	if spec.AsUser != "" {
		// The container user need not exist on the host: open the scratch
		// directory up instead of handing it over.
		if err := os.Chmod(f.Dir, 0o777); err != nil {
			return nil, err
		}
		for _, p := range []string{f.Args, f.Script} {
			if err := os.Chmod(p, 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, err
			}
		}
	}

	argv := append([]string{cli}, r.globalArgs...)
	argv = append(argv, "run", "--rm", "-i", "--name", name)
	argv = append(argv, r.runArgs...)
	if r.owner != "" {
		argv = append(argv, "--label", OwnerLabel+"="+r.owner)
	}
	argv = append(argv, "-v", f.Dir+":"+ContainerDir)
	if spec.Workdir != "" {
		argv = append(argv, "-v", spec.Workdir+":"+spec.Workdir, "-w", spec.Workdir)
	} else {
		argv = append(argv, "-w", ContainerDir)
	}
	env := map[string]string{}
	maps.Copy(env, spec.Env)
	maps.Copy(env, protocol.Env(spec, inside))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		argv = append(argv, "-e", k+"="+env[k])
	}
	if spec.AsUser != "" {
		argv = append(argv, "--user", spec.AsUser)
	}
	argv = append(argv, spec.Image)
	return append(argv, command...), nil
}

// ReapLeftovers removes every container, running or not, whose OwnerLabel
// is marker: the ones a previous run of the daemon with that mark left
// behind. Containers with another owner or none are never touched. It
// returns how many it removed; an empty marker removes nothing.
func (r *Runner) ReapLeftovers(ctx context.Context, marker string) (int, error) {
	if marker == "" {
		return 0, nil
	}
	cli, err := exec.LookPath(r.cli)
	if err != nil {
		return 0, fmt.Errorf("%s runner: %w", r.host.Kind, err)
	}
	left, err := r.owned(ctx, cli, marker)
	if err != nil || len(left) == 0 {
		return 0, err
	}
	seen := map[string]bool{}
	pause := 20 * time.Millisecond
	for {
		for _, id := range left {
			seen[id] = true
		}
		// As in remove: rm -f alone may wait for a stop timeout of its
		// own. kill fails for a container that is not running, and one rm
		// of several ids may skip the rest when one vanishes meanwhile
		// (podman's cleanup of a --rm container): one rm per id, then
		// list again.
		_ = r.cmd(ctx, cli, append([]string{"kill"}, left...)...).Run()
		var rmErrs []error
		for _, id := range left {
			if out, err := r.cmd(ctx, cli, "rm", "-f", id).CombinedOutput(); err != nil {
				rmErrs = append(rmErrs, fmt.Errorf("rm %s: %w: %s", id, err, strings.TrimSpace(string(out))))
			}
		}
		if left, err = r.owned(ctx, cli, marker); err != nil {
			return 0, err
		}
		if len(left) == 0 {
			return len(seen), nil
		}
		select {
		case <-ctx.Done():
			return len(seen) - len(left), fmt.Errorf("%s runner: %d containers labelled %s=%s left (%v): %w",
				r.host.Kind, len(left), OwnerLabel, marker, errors.Join(rmErrs...), ctx.Err())
		case <-time.After(pause):
		}
		if pause < 500*time.Millisecond {
			pause *= 2
		}
	}
}

// owned lists the full ids of the containers, running or not, whose
// OwnerLabel is marker.
func (r *Runner) owned(ctx context.Context, cli, marker string) ([]string, error) {
	out, err := r.cmd(ctx, cli, "ps", "-a", "-q", "--no-trunc", "--filter", "label="+OwnerLabel+"="+marker).Output()
	if err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			return nil, fmt.Errorf("%s runner: %s ps: %w: %s", r.host.Kind, r.cli, err, strings.TrimSpace(string(exitErr.Stderr)))
		}
		return nil, fmt.Errorf("%s runner: %s ps: %w", r.host.Kind, r.cli, err)
	}
	return strings.Fields(string(out)), nil
}

// remove stops (with the grace, when graceful) and removes the container,
// then waits until the CLI no longer knows it.
func (r *Runner) remove(ctx context.Context, cli, name string, graceful bool) error {
	if graceful {
		secs := strconv.Itoa(int(math.Ceil(r.host.KillGrace.Seconds())))
		// Fails when the container does not exist (yet, or any more); rm
		// and the wait below are what count.
		_ = r.cmd(ctx, cli, "stop", "-t", secs, name).Run()
	}
	// rm -f alone may wait for a stop timeout of its own; kill first.
	_ = r.cmd(ctx, cli, "kill", name).Run()
	rmOut, rmErr := r.cmd(ctx, cli, "rm", "-f", name).CombinedOutput()
	pause := 20 * time.Millisecond
	for {
		if err := r.cmd(ctx, cli, "container", "inspect", "--format", "{{.Id}}", name).Run(); err != nil {
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				return nil
			}
			return fmt.Errorf("inspect %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %s still exists (rm: %v %s): %w", name, rmErr, strings.TrimSpace(string(rmOut)), ctx.Err())
		case <-time.After(pause):
		}
		if pause < 500*time.Millisecond {
			pause *= 2
		}
		_ = r.cmd(ctx, cli, "kill", name).Run()
		_ = r.cmd(ctx, cli, "rm", "-f", name).Run()
	}
}

func (r *Runner) cmd(ctx context.Context, cli string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, cli, append(append([]string(nil), r.globalArgs...), args...)...)
}
