package main

import (
	"errors"
	"reflect"
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
