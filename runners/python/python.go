// Package python owns the "python" runner: an invocation calls a Python
// function `module:qualname` (Function.Module, Function.Qualname; the
// qualname may be dotted) through a small shim the binary carries. The shim
// is written to the scratch directory and run with python3 as a host child
// process in its own process group, exactly like the process runner.
//
// Args and result are msgpack. Args that decode to a map are passed as
// keyword arguments, a list as positional arguments, empty args as no
// arguments, anything else as one positional argument; the return value is
// msgpack-encoded into the result file. An exception becomes the error
// {type: the exception's class name, message: str(e), traceback}. The shim
// carries its own msgpack codec, so no third-party Python package is
// needed. Workdir is put first on PYTHONPATH, so a module next to the work
// is importable, and output is unbuffered so it streams.
//
// Spec.Script, when set, runs as a bash script as in the process runner.
package python

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/runners/protocol"
)

// Kind is the run_config.runner name of this runner.
const Kind = "python"

// ShimFile is the shim's file name inside the scratch directory.
const ShimFile = "nymph_shim.py"

//go:embed shim.py
var shim []byte

// Runner calls Python functions.
type Runner struct {
	host   protocol.Host
	python string
}

var _ runners.Runner = (*Runner)(nil)

// Option configures a Runner.
type Option func(*Runner)

// WithPython sets the interpreter (default "python3").
func WithPython(path string) Option {
	return func(r *Runner) {
		if path != "" {
			r.python = path
		}
	}
}

// WithKillGrace sets the time between SIGTERM and SIGKILL when a run is
// stopped (default 5 s).
func WithKillGrace(d time.Duration) Option {
	return func(r *Runner) { r.host.SetKillGrace(d) }
}

// New returns a python runner.
func New(log zerolog.Logger, opts ...Option) *Runner {
	return protocol.Apply(&Runner{host: protocol.NewHost(Kind, log), python: "python3"}, opts)
}

// Kind implements runners.Runner.
func (r *Runner) Kind() string { return Kind }

// Run implements runners.Runner.
func (r *Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if spec.Script == "" {
		if spec.Function.Module == "" {
			return protocol.Invalid("function.module is required for the python runner"), nil
		}
		if spec.Function.Qualname == "" {
			return protocol.Invalid("function.qualname is required for the python runner"), nil
		}
	}
	return r.host.Exec(ctx, spec, protocol.Job{
		Log: r.host.RunLog(spec).Logger(),
		Build: func(f protocol.Files, _ string) (protocol.Launch, error) {
			shimPath := filepath.Join(f.Dir, ShimFile)
			if spec.Script == "" {
				if err := os.WriteFile(shimPath, shim, 0o644); err != nil {
					return protocol.Launch{}, fmt.Errorf("write shim: %w", err)
				}
			}
			argv, err := r.host.Command(spec, f, r.python, shimPath, spec.Function.Module, spec.Function.Qualname)
			if err != nil {
				return protocol.Launch{}, err
			}
			workdir := protocol.Workdir(spec)
			return protocol.Launch{Command: procgroup.Command{
				Argv: argv, Env: protocol.HostEnv(spec, f, pythonEnv(spec, workdir)), Dir: workdir,
			}}, nil
		},
	})
}

// pythonEnv puts workdir first on PYTHONPATH and, unless spec.Env says
// otherwise, makes output unbuffered.
func pythonEnv(spec runners.Spec, workdir string) map[string]string {
	pythonPath := workdir
	prev, ok := spec.Env["PYTHONPATH"]
	if !ok {
		prev = os.Getenv("PYTHONPATH")
	}
	if prev != "" {
		pythonPath += string(os.PathListSeparator) + prev
	}
	extra := map[string]string{"PYTHONPATH": pythonPath}
	if _, set := spec.Env["PYTHONUNBUFFERED"]; !set {
		extra["PYTHONUNBUFFERED"] = "1"
	}
	return extra
}
