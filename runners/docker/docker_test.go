package docker_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/runnertest"
	"nymph/test/realparts"
)

func podmanRunner(t *testing.T) *docker.Runner {
	return docker.New(zerolog.New(zerolog.NewTestWriter(t)),
		docker.WithCLI("podman"),
		docker.WithGlobalArgs(realparts.PodmanGlobalArgs()...),
		docker.WithRunArgs(realparts.PodmanRunArgs()...),
		docker.WithKillGrace(500*time.Millisecond))
}

func TestConformance(t *testing.T) {
	image := realparts.PodmanImage(t)
	runnertest.Run(t, func(t *testing.T) runners.Runner { return podmanRunner(t) },
		runnertest.Caps{Script: true, Image: image, Concurrency: 8})
}

func TestMissingImageIsFailedOutcome(t *testing.T) {
	r := docker.New(zerolog.Nop())
	out, err := r.Run(context.Background(), runners.Spec{InvocationID: "x", Script: "true", ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateFailed || out.Error == nil ||
		out.Error.Message != "run_config.image is required for the docker runner" {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
}

func TestCommandFromFunction(t *testing.T) {
	image := realparts.PodmanImage(t)
	spec := runners.Spec{
		InvocationID: "fn-" + strings.ReplaceAll(t.Name(), "/", "-"),
		Function:     messages.FunctionRef{Module: "cp", Qualname: "/etc/passwd"},
		Image:        image,
		ScratchDir:   t.TempDir(),
	}
	// cp with one argument fails: proves argv[1] is the qualname.
	out, err := podmanRunner(t).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateFailed || out.Error.Type != runners.ErrorTypeExit {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	spec.Function = messages.FunctionRef{Module: "/bin/sh"}
	spec.Args = []byte(`cat /etc/passwd > "$NYMPH_RESULT_PATH"`)
	out, err = podmanRunner(t).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateSucceeded || !strings.HasPrefix(string(out.Result), "root:x:0:0") {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
}

func TestCancelRemovesContainer(t *testing.T) {
	image := realparts.PodmanImage(t)
	id := "cancel-" + time.Now().Format("150405.000000")
	spec := runners.Spec{
		InvocationID: id,
		Script:       "echo READY\nsleep 1000\n",
		Image:        image,
		ScratchDir:   t.TempDir(),
		Timeout:      2 * time.Second,
	}
	out, err := podmanRunner(t).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateKilled || out.Error.Type != runners.ErrorTypeTimeout {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	args := append(realparts.PodmanGlobalArgs(), "container", "inspect", docker.ContainerName(id))
	err = exec.Command("podman", args...).Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("container %s still exists after Run returned (inspect: %v)", docker.ContainerName(id), err)
	}
}
