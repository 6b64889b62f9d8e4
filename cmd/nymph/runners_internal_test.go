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
	for _, step := range []struct {
		maxProcs int
		env      string
		want     int
		what     string
	}{
		{2, "4", 4, "with $GOMAXPROCS set"},
		{0, "", 4, "max_procs = 0"},
		{8, "", 4, "max_procs above the runtime's choice"},
		{1, "", 1, "max_procs = 1"},
	} {
		capProcs(step.maxProcs, step.env, log)
		if got := runtime.GOMAXPROCS(0); got != step.want {
			t.Fatalf("%s: %d processors, want %d", step.what, got, step.want)
		}
	}
}
