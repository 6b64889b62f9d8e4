// Package process owns the "process" runner: an invocation is a child
// process on the host, in its own process group, speaking the function
// protocol (see package runners).
//
// What runs:
//   - Spec.Script non-empty: the script is written to <ScratchDir>/script
//     and run as `bash <ScratchDir>/script` (not a login shell).
//   - otherwise Spec.Function: Function.Module is the executable (a path, or
//     a name looked up in PATH) and Function.Qualname, when non-empty, is
//     its single argument (argv[1]).
//
// Spec.AsUser wraps the command in `runuser -u USER --`; when the daemon is
// root the scratch directory is handed to that user first (its parents must
// be searchable by that user). The child's
// environment is the daemon's, with Spec.Env on top and the protocol
// variables last. A timeout or a cancelled context sends SIGTERM to the
// group and SIGKILL after the kill grace; the group is killed when the
// leader exits in any case, so nothing the run started outlives it.
package process

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

// Kind is the run_config.runner name of this runner.
const Kind = "process"

// Runner runs invocations as host child processes.
type Runner struct {
	host protocol.Host
}

var _ runners.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithKillGrace sets the time between SIGTERM and SIGKILL when a run is
// stopped (default 5 s).
func WithKillGrace(d time.Duration) Option {
	return func(r *Runner) { r.host.SetKillGrace(d) }
}

// WithBash sets the interpreter of scripts (default "bash").
func WithBash(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.host.Shell = path
		}
	}
}

// WithRunuser sets the runuser binary used for Spec.AsUser (default
// "runuser").
func WithRunuser(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.host.Runuser = path
		}
	}
}

// New returns a process runner.
func New(log zerolog.Logger, opts ...Option) *Runner {
	return protocol.Apply(&Runner{host: protocol.NewHost(Kind, log)}, opts)
}

// Kind implements runners.Runner.
func (r *Runner) Kind() string { return Kind }

// Run implements runners.Runner.
func (r *Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if spec.Script == "" && spec.Function.Module == "" {
		return protocol.Invalid("function.module is required for the process runner when no script is given"), nil
	}
	return r.host.Exec(ctx, spec, protocol.Job{
		Log: r.host.RunLog(spec).Logger(),
		Build: func(f protocol.Files, _ string) (protocol.Launch, error) {
			argv, err := r.host.Command(spec, f)
			return protocol.Launch{Command: procgroup.Command{
				Argv: argv, Env: protocol.HostEnv(spec, f, nil), Dir: protocol.Workdir(spec),
			}}, err
		},
	})
}
