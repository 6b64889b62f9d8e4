package protocol

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/procgroup"
)

// Host is what every runner of a command keeps, set by its options: its
// kind, the daemon's log, the kill grace, the shell of Spec.Script and the
// runuser of Spec.AsUser. The run itself is Exec's.
type Host struct {
	Kind           string
	Log            zerolog.Logger
	KillGrace      time.Duration
	Shell, Runuser string
}

// NewHost returns the defaults: bash, runuser and procgroup's kill grace.
func NewHost(kind string, log zerolog.Logger) Host {
	return Host{Kind: kind, Log: log, KillGrace: procgroup.DefaultKillGrace, Shell: "bash", Runuser: "runuser"}
}

// Apply configures r with opts, in order, and returns it.
func Apply[R any, O ~func(*R)](r *R, opts []O) *R {
	for _, o := range opts {
		o(r)
	}
	return r
}

// SetKillGrace sets the time between SIGTERM and SIGKILL when a run is
// stopped; a d that is not positive keeps the current one.
func (h *Host) SetKillGrace(d time.Duration) {
	if d > 0 {
		h.KillGrace = d
	}
}

// RunLog is the log of one run: the runner's kind and the invocation id.
func (h *Host) RunLog(spec runners.Spec) zerolog.Context {
	return h.Log.With().Str("runner", h.Kind).Str("invocation_id", spec.InvocationID)
}

// FunctionArgv is Function.Module, with Function.Qualname, when set, as
// its one argument.
func FunctionArgv(fn messages.FunctionRef) []string {
	if fn.Module == "" {
		return nil
	}
	if fn.Qualname == "" {
		return []string{fn.Module}
	}
	return []string{fn.Module, fn.Qualname}
}

// invalidSpec marks an error that is the spec's fault: Exec reports it as
// a failed outcome (Invalid), not as the runner's error.
type invalidSpec struct{ error }

// Command is what runs for spec where the host's files are seen as they
// are (on the host, in a sandbox, in a job): Spec.Script under the shell,
// otherwise fn, by default FunctionArgv; for Spec.AsUser the scratch
// directory is handed to that user and the command wrapped in runuser.
func (h *Host) Command(spec runners.Spec, f Files, fn ...string) ([]string, error) {
	argv := fn
	if spec.Script != "" {
		if err := WriteScript(f, spec.Script); err != nil {
			return nil, err
		}
		argv = []string{h.Shell, f.Script}
	} else if len(argv) == 0 {
		argv = FunctionArgv(spec.Function)
	}
	if spec.AsUser != "" {
		if err := GiveTo(f, spec.AsUser); err != nil {
			return nil, invalidSpec{err}
		}
		argv = append([]string{h.Runuser, "-u", spec.AsUser, "--"}, argv...)
	}
	return argv, nil
}

// Job is how a runner kind runs one invocation. Log is the run's (RunLog
// and what names the run); Bin, when set, is the executable it cannot do
// without, looked up before anything is written and passed to Build;
// Build makes the command once the scratch directory is prepared.
type Job struct {
	Log   zerolog.Logger
	Bin   string
	Build func(f Files, bin string) (Launch, error)
}

// Launch is the command Build made: Argv, Env, Dir and Stop are the
// runner's, Exec sets the rest.
type Launch struct {
	procgroup.Command
	// Remove, when set, runs after a stopped run, given RemoveTimeout even
	// though the run's context is done: a command stopped while it was
	// still submitting may have left what it starts outside its process
	// group (a container, a batch job) behind. Left and Stopping are the
	// log messages of an error of Remove and of Command.Stop.
	Remove         func(ctx context.Context) error
	RemoveTimeout  time.Duration
	Left, Stopping string
	// After, when set, runs once the command has ended, before the outcome
	// is read.
	After func(procgroup.Result)
}

// Exec runs one invocation the way every command runner does: it checks
// Spec.Env, looks up job.Bin, prepares the scratch directory, has
// job.Build make the command, runs it in its own process group with the
// args file on stdin, and reads the outcome from the files it left (see
// Collect). Errors are the runner's ("<kind> runner: ..."), except those of
// the spec itself, which are failed outcomes.
func (h *Host) Exec(ctx context.Context, spec runners.Spec, job Job) (runners.Outcome, error) {
	if err := CheckEnv(spec.Env); err != nil {
		return Invalid(err.Error()), nil
	}
	bin := job.Bin
	if bin != "" {
		var err error
		if bin, err = exec.LookPath(bin); err != nil {
			return h.fail(err)
		}
	}
	files, err := Prepare(spec)
	if err != nil {
		return h.fail(err)
	}
	l, err := job.Build(files, bin)
	if err != nil {
		return h.fail(err)
	}
	c := l.Command
	c.Stdin, c.Output, c.Timeout, c.KillGrace = files.Args, spec.Output, spec.Timeout, h.KillGrace
	c.Stdout, c.Stderr = spec.Stdout, spec.Stderr

	log := job.Log
	log.Debug().Strs("argv", c.Argv).Msg("starting")
	res, err := procgroup.Run(ctx, c)
	if err != nil {
		return h.fail(err)
	}
	if res.Stopped != procgroup.NotStopped && l.Remove != nil {
		removeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.RemoveTimeout)
		if err := l.Remove(removeCtx); err != nil {
			log.Error().Err(err).Msg(l.Left)
		}
		cancel()
	}
	if res.StopErr != nil {
		log.Warn().Err(res.StopErr).Msg(l.Stopping)
	}
	if l.After != nil {
		l.After(res)
	}
	out := Collect(files, res, spec.Timeout)
	log.Debug().Str("state", out.State).Int("exit_code", out.ExitCode).Msg("finished")
	return out, nil
}

func (h *Host) fail(err error) (runners.Outcome, error) {
	var bad invalidSpec
	if errors.As(err, &bad) {
		return Invalid(err.Error()), nil
	}
	return runners.Outcome{}, fmt.Errorf("%s runner: %w", h.Kind, err)
}
