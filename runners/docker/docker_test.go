package docker_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/procgroup"
	"nymph/runners/runnertest"
	"nymph/test/realparts"
	"nymph/test/wait"
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
	out := runnertest.Outcome(t, r, runners.Spec{InvocationID: "x", Script: "true", ScratchDir: t.TempDir()})
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
	out := runnertest.Outcome(t, podmanRunner(t), spec)
	if out.State != messages.StateFailed || out.Error.Type != runners.ErrorTypeExit {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	spec.Function = messages.FunctionRef{Module: "/bin/sh"}
	spec.Args = []byte(`cat /etc/passwd > "$NYMPH_RESULT_PATH"`)
	out = runnertest.Outcome(t, podmanRunner(t), spec)
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
	out := runnertest.Outcome(t, podmanRunner(t), spec)
	if out.State != messages.StateKilled || out.Error.Type != runners.ErrorTypeTimeout {
		t.Fatalf("outcome %+v error %+v", out, out.Error)
	}
	args := append(realparts.PodmanGlobalArgs(), "container", "inspect", docker.ContainerName(id))
	err := exec.Command("podman", args...).Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		t.Fatalf("container %s still exists after Run returned (inspect: %v)", docker.ContainerName(id), err)
	}
}

func TestReapLeftoversRemovesOnlyOwnContainers(t *testing.T) {
	image := realparts.PodmanImage(t)
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	marker := "nymph-test-" + stamp
	r := docker.New(zerolog.New(zerolog.NewTestWriter(t)),
		docker.WithCLI("podman"),
		docker.WithGlobalArgs(realparts.PodmanGlobalArgs()...),
		docker.WithRunArgs(realparts.PodmanRunArgs()...),
		docker.WithKillGrace(500*time.Millisecond),
		docker.WithOwner(marker))
	owned := "label=" + docker.OwnerLabel + "=" + marker

	// What a killed daemon leaves: a container its runner started, whose
	// CLI died with the daemon (SIGKILL), and one created but never
	// started.
	id := "reap-" + stamp
	name := docker.ContainerName(id)
	run := runnertest.StartOwned(t, r, marker, runners.Spec{
		InvocationID: id, Script: "sleep 1000\n", Image: image, ScratchDir: t.TempDir(),
	})
	created := realparts.Podman(t, "create", "--label", docker.OwnerLabel+"="+marker, image, "true")

	// Containers of another daemon, and of no daemon at all.
	var others []string
	t.Cleanup(func() {
		args := append(realparts.PodmanGlobalArgs(), "rm", "-f", "-t", "0")
		_ = exec.Command("podman", append(args, others...)...).Run()
	})
	runArgs := append([]string{"run", "-d"}, realparts.PodmanRunArgs()...)
	others = append(others, realparts.Podman(t, append(runArgs, "--label", docker.OwnerLabel+"="+marker+"-other", image, "sleep", "1000")...))
	others = append(others, realparts.Podman(t, append(runArgs, image, "sleep", "1000")...))

	wait.For(t, time.Minute, "invocation container running", func() bool {
		return realparts.Podman(t, "ps", "-q", "--filter", owned, "--filter", "name="+name) != ""
	})
	clients, err := procgroup.WithCmdline("run\x00--rm\x00-i\x00--name\x00" + name + "\x00")
	if err != nil || len(clients) == 0 {
		t.Fatalf("podman run client of %s: %v %v", name, clients, err)
	}
	for _, pid := range clients {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	out, runErr := run.Wait(t, time.Minute, "Run to return after its CLI was killed")
	if runErr != nil || out.State == messages.StateSucceeded {
		t.Fatalf("run whose CLI was killed: outcome %+v error %v", out, runErr)
	}
	if state := realparts.Podman(t, "container", "inspect", "--format", "{{.State.Status}}", name); state != "running" {
		t.Fatalf("container %s is %q once its CLI is gone, want running (the leftover this test is about)", name, state)
	}

	n, err := r.ReapLeftovers(context.Background(), marker)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("removed %d containers, want 2", n)
	}
	if left := realparts.Podman(t, "ps", "-a", "-q", "--filter", owned); left != "" {
		t.Fatalf("containers labelled %s left: %s", marker, left)
	}
	for _, c := range []string{name, created} {
		if exec.Command("podman", append(realparts.PodmanGlobalArgs(), "container", "exists", c)...).Run() == nil {
			t.Fatalf("container %s still exists", c)
		}
	}
	for _, c := range others {
		if state := realparts.Podman(t, "container", "inspect", "--format", "{{.State.Status}}", c); state != "running" {
			t.Fatalf("container %s of another owner is %q, want running", c, state)
		}
	}
}

func TestReapLeftoversWithoutMarker(t *testing.T) {
	// No mark, no sweep: not even the CLI is looked for.
	r := docker.New(zerolog.Nop(), docker.WithCLI("/nonexistent/podman"), docker.WithOwner(""))
	if n, err := r.ReapLeftovers(context.Background(), ""); n != 0 || err != nil {
		t.Fatalf("ReapLeftovers with no marker = %d, %v", n, err)
	}
}
