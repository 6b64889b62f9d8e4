package main

import (
	"errors"
	"reflect"
	"runtime"
	"testing"

	"github.com/rs/zerolog"

	"nymph/config"
)

func TestAvailableFollowsConfiguredBinaries(t *testing.T) {
	rc := config.Default().Runners
	rc.Docker.CLI = "podman"
	rc.Python.Python = "/opt/py/bin/python3"
	rc.Slurm.BinDir = "/opt/slurm/bin"
	have := map[string]bool{"bash": true, "podman": true, "/opt/slurm/bin/srun": true}
	look := func(f string) (string, error) {
		if have[f] {
			return f, nil
		}
		return "", errors.New("not found")
	}
	ok, missing := available([]string{"process", "echo", "python", "docker", "gvisor", "slurm"}, rc, look)
	if !reflect.DeepEqual(ok, []string{"process", "echo", "docker", "slurm"}) {
		t.Fatalf("available %v", ok)
	}
	if len(missing) != 2 || missing["python"] == nil || missing["gvisor"] == nil {
		t.Fatalf("missing %v", missing)
	}
}

func TestRegistryHasEveryConfiguredKindAndProcess(t *testing.T) {
	rc := config.Default().Runners
	reg := runnerRegistry([]string{"echo", "gvisor"}, rc, "", zerolog.Nop())
	for _, k := range []string{"echo", "gvisor", "process"} {
		if r, ok := reg[k]; !ok || r.Kind() != k {
			t.Fatalf("registry %v lacks %s", reg, k)
		}
	}
	if len(reg) != 3 {
		t.Fatalf("registry %v", reg)
	}
}

// [runtime] max_procs caps the runtime's processors, never raises them,
// and gives way to $GOMAXPROCS.
func TestMaxProcsCapsTheRuntime(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(was) })
	runtime.GOMAXPROCS(4)
	log := zerolog.Nop()
	capProcs(2, "4", log)
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("with $GOMAXPROCS set: %d processors, want 4", got)
	}
	capProcs(0, "", log)
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("max_procs = 0: %d processors, want 4", got)
	}
	capProcs(8, "", log)
	if got := runtime.GOMAXPROCS(0); got != 4 {
		t.Fatalf("max_procs above the runtime's choice: %d processors, want 4", got)
	}
	capProcs(1, "", log)
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("max_procs = 1: %d processors", got)
	}
}
