package main

import (
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"nymph/config"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/echo"
	"nymph/runners/gvisor"
	"nymph/runners/process"
	"nymph/runners/python"
	"nymph/runners/slurm"
)

// runnerRegistry builds the configured runner kinds with their
// [runners.<kind>] settings. The process runner is always there, because
// setup scripts run through it. owner is the daemon's orphan mark, put on
// the containers and SLURM jobs that outlive a killed daemon so its next
// start can end them.
func runnerRegistry(kinds []string, rc config.Runners, owner string, log zerolog.Logger) map[string]runners.Runner {
	out := map[string]runners.Runner{}
	for _, k := range kinds {
		switch k {
		case process.Kind:
			out[k] = newProcess(rc, log)
		case echo.Kind:
			out[k] = echo.New()
		case python.Kind:
			out[k] = python.New(log,
				python.WithPython(rc.Python.Python),
				python.WithKillGrace(seconds(rc.Python.KillGraceS)))
		case docker.Kind:
			out[k] = docker.New(log,
				docker.WithCLI(rc.Docker.CLI),
				docker.WithGlobalArgs(rc.Docker.GlobalArgs...),
				docker.WithRunArgs(rc.Docker.RunArgs...),
				docker.WithShell(rc.Docker.Shell),
				docker.WithOwner(owner),
				docker.WithKillGrace(seconds(rc.Docker.KillGraceS)))
		case gvisor.Kind:
			g := rc.Gvisor
			opts := []gvisor.Option{
				gvisor.WithRunsc(g.Runsc),
				gvisor.WithGlobalArgs(g.GlobalArgs...),
				gvisor.WithStateRoot(g.StateRoot),
				gvisor.WithKillGrace(seconds(g.KillGraceS)),
			}
			if g.CLI != "" {
				opts = append(opts, gvisor.WithContainerRunner(docker.New(log,
					docker.WithKind(gvisor.Kind),
					docker.WithCLI(g.CLI),
					docker.WithGlobalArgs(g.ContainerGlobalArgs...),
					docker.WithRunArgs(g.ContainerRunArgs...),
					docker.WithShell(rc.Docker.Shell),
					docker.WithOwner(owner),
					docker.WithKillGrace(seconds(g.KillGraceS)))))
			}
			out[k] = gvisor.New(log, opts...)
		case slurm.Kind:
			out[k] = slurm.New(log,
				slurm.WithBinDir(rc.Slurm.BinDir),
				slurm.WithSrunArgs(rc.Slurm.SrunArgs...),
				slurm.WithEnv(rc.Slurm.Env...),
				slurm.WithOwner(owner),
				slurm.WithKillGrace(seconds(rc.Slurm.KillGraceS)))
		}
	}
	if _, ok := out[process.Kind]; !ok {
		out[process.Kind] = newProcess(rc, log)
	}
	return out
}

func newProcess(rc config.Runners, log zerolog.Logger) *process.Runner {
	return process.New(log, process.WithKillGrace(seconds(rc.Process.KillGraceS)))
}

// runnerBinary is the executable a runner kind cannot run without, as
// configured; "" for a kind that needs none.
func runnerBinary(kind string, rc config.Runners) string {
	switch kind {
	case process.Kind:
		return "bash"
	case python.Kind:
		return rc.Python.Python
	case docker.Kind:
		return rc.Docker.CLI
	case gvisor.Kind:
		return rc.Gvisor.Runsc
	case slurm.Kind:
		if rc.Slurm.BinDir != "" {
			return filepath.Join(rc.Slurm.BinDir, "srun")
		}
		return "srun"
	}
	return ""
}

// lookPath finds an executable.
type lookPath func(file string) (string, error)

// available returns the kinds, in order, whose configured executable is
// found now, and for the others what is missing. A daemon advertises only
// what it can run, so the control plane never dispatches a run that would
// fail for want of a binary.
func available(kinds []string, rc config.Runners, look lookPath) (ok []string, missing map[string]error) {
	ok = []string{}
	missing = map[string]error{}
	for _, k := range kinds {
		bin := runnerBinary(k, rc)
		if bin == "" {
			ok = append(ok, k)
			continue
		}
		if _, err := look(bin); err != nil {
			missing[k] = err
			continue
		}
		ok = append(ok, k)
	}
	return ok, missing
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
