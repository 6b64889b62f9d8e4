// Package gvisor owns the "gvisor" runner: an invocation runs inside a
// gVisor sandbox, whose user-space kernel stands between the function and
// the host kernel, with no network.
//
// Without Spec.Image it runs `runsc --network=none do` over the host
// filesystem (`--rootless` when the daemon is not root). The host
// filesystem is visible and writable from the sandbox (runsc's
// -force-overlay=false), which the function protocol needs for the result
// and error files; what the sandbox isolates is system calls and the
// network. What runs is what the process runner runs: Spec.Script as
// `bash <ScratchDir>/script`, or Function.Module with Function.Qualname as
// argv[1]; Spec.AsUser wraps it in `runuser -u USER --` inside the sandbox.
// runsc keeps its state in a fresh directory under the state root (it is
// runsc's TMPDIR, and so also the sandbox's): Run removes it afterwards, so
// even a sandbox killed with SIGKILL leaves nothing behind, and runsc's
// processes can be found by that path: Run does not return while any is
// left. The directory cannot live in the scratch directory, whose parents
// may be private: the sandbox process runs as nobody and must reach it.
//
// With Spec.Image the invocation goes to a container runner configured to
// use runsc as its runtime (WithContainerRunner): for docker,
// docker.WithRunArgs("--runtime=runsc"); for podman,
// docker.WithGlobalArgs("--runtime", "/usr/bin/runsc", "--runtime-flag",
// "network=none", ...), since runsc refuses podman's root network namespace.
// Those containers carry the daemon's owner label like the docker runner's,
// and ReapLeftovers removes the ones a killed daemon left behind.
package gvisor

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

// Kind is the run_config.runner name of this runner.
const Kind = "gvisor"

// leftoverTimeout bounds the wait for sandbox processes that outlive runsc.
const leftoverTimeout = 10 * time.Second

// Runner runs invocations in gVisor sandboxes.
type Runner struct {
	host       protocol.Host
	runsc      string
	stateRoot  string
	globalArgs []string
	containers *docker.Runner
}

var _ runners.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithRunsc sets the runsc binary (default "runsc").
func WithRunsc(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.runsc = path
		}
	}
}

// WithStateRoot sets where per-run runsc state directories are made
// (default the system temp dir). Every parent must be searchable by
// nobody.
func WithStateRoot(dir string) Option {
	return func(r *Runner) { r.stateRoot = dir }
}

// WithGlobalArgs adds runsc flags put before `do` (--network=none and, for
// a non-root daemon, --rootless are always there).
func WithGlobalArgs(args ...string) Option {
	return func(r *Runner) { r.globalArgs = append([]string(nil), args...) }
}

// WithKillGrace sets the time between SIGTERM and SIGKILL when a run is
// stopped (default 5 s).
func WithKillGrace(d time.Duration) Option {
	return func(r *Runner) { r.host.SetKillGrace(d) }
}

// WithContainerRunner sets the runner of invocations that name an image;
// it must be configured to use runsc as the container runtime.
func WithContainerRunner(c *docker.Runner) Option {
	return func(r *Runner) { r.containers = c }
}

// New returns a gvisor runner.
func New(log zerolog.Logger, opts ...Option) *Runner {
	return protocol.Apply(&Runner{host: protocol.NewHost(Kind, log), runsc: "runsc"}, opts)
}

// Kind implements runners.Runner.
func (r *Runner) Kind() string { return Kind }

// Run implements runners.Runner.
func (r *Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if spec.Image != "" {
		if r.containers == nil {
			return protocol.Invalid("run_config.image: the gvisor runner has no container CLI configured"), nil
		}
		return r.containers.Run(ctx, spec)
	}
	if spec.Script == "" && spec.Function.Module == "" {
		return protocol.Invalid("function.module is required for the gvisor runner when no script is given"), nil
	}
	log := r.host.RunLog(spec).Logger()
	var state string // runsc's, made by Build
	defer func() { os.RemoveAll(state) }()
	return r.host.Exec(ctx, spec, protocol.Job{Log: log, Build: func(f protocol.Files, _ string) (protocol.Launch, error) {
		command, err := r.host.Command(spec, f)
		if err != nil {
			return protocol.Launch{}, err
		}
		if state, err = os.MkdirTemp(r.stateRoot, "nymph-runsc-"); err != nil {
			return protocol.Launch{}, fmt.Errorf("state dir: %w", err)
		}
		if err := os.Chmod(state, 0o711); err != nil {
			return protocol.Launch{}, fmt.Errorf("state dir: %w", err)
		}
		workdir := protocol.Workdir(spec)
		argv := []string{r.runsc}
		if os.Geteuid() != 0 {
			argv = append(argv, "--rootless")
		}
		argv = append(argv, "--network=none")
		argv = append(argv, r.globalArgs...)
		argv = append(argv, "do", "-force-overlay=false", "-quiet", "-cwd", workdir)
		return protocol.Launch{
			Command: procgroup.Command{
				Argv: append(argv, command...),
				Env:  protocol.HostEnv(spec, f, map[string]string{"TMPDIR": state}),
				Dir:  workdir,
			},
			After: func(procgroup.Result) {
				if err := reapSandbox(state); err != nil {
					log.Error().Err(err).Msg("sandbox processes left behind")
				}
			},
		}, nil
	}})
}

// ReapLeftovers removes the containers of image runs that a previous run
// of the daemon marked marker left behind (see docker.Runner.ReapLeftovers).
// Without a container runner there is nothing to remove.
func (r *Runner) ReapLeftovers(ctx context.Context, marker string) (int, error) {
	if r.containers == nil {
		return 0, nil
	}
	return r.containers.ReapLeftovers(ctx, marker)
}

// reapSandbox kills any sandbox or gofer process still naming the state
// directory (the sandbox runs in a session of its own, outside runsc's
// process group) and waits until none is left.
func reapSandbox(state string) error {
	deadline := time.Now().Add(leftoverTimeout)
	pause := 5 * time.Millisecond
	for {
		pids, err := procgroup.WithCmdline(state)
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pids %v still running", pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(pause)
		if pause < 100*time.Millisecond {
			pause *= 2
		}
	}
}
