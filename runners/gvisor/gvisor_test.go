package gvisor_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/gvisor"
	"nymph/runners/runnertest"
	"nymph/test/realparts"
	"nymph/test/wait"
)

func newRunner(t *testing.T, runsc string, opts ...docker.Option) *gvisor.Runner {
	log := zerolog.New(zerolog.NewTestWriter(t))
	global := append([]string{"--runtime", runsc, "--runtime-flag", "network=none"}, realparts.PodmanGlobalArgs()...)
	// The later --runtime wins; drop the runc one realparts suggests.
	global = withoutRuntime(global[4:], global[:4])
	containers := docker.New(log, append([]docker.Option{
		docker.WithKind(gvisor.Kind),
		docker.WithCLI("podman"),
		docker.WithGlobalArgs(global...),
		docker.WithRunArgs(realparts.PodmanRunArgs()...),
		docker.WithKillGrace(500 * time.Millisecond)}, opts...)...)
	return gvisor.New(log, gvisor.WithRunsc(runsc), gvisor.WithKillGrace(500*time.Millisecond),
		gvisor.WithContainerRunner(containers))
}

// withoutRuntime drops "--runtime X" from args and prepends prefix.
func withoutRuntime(args, prefix []string) []string {
	out := append([]string(nil), prefix...)
	for i := 0; i < len(args); i++ {
		if args[i] == "--runtime" {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

func TestConformance(t *testing.T) {
	runsc := realparts.Runsc(t)
	runnertest.Run(t, func(t *testing.T) runners.Runner { return newRunner(t, runsc) },
		runnertest.Caps{Script: true, Sandboxed: true, Concurrency: 6})
}

func TestConformanceWithImage(t *testing.T) {
	runsc := realparts.Runsc(t)
	image := realparts.PodmanImage(t)
	runnertest.Run(t, func(t *testing.T) runners.Runner { return newRunner(t, runsc) },
		runnertest.Caps{Script: true, Sandboxed: true, Image: image, Concurrency: 4})
}

func TestRunsInsideSandbox(t *testing.T) {
	runsc := realparts.Runsc(t)
	image := realparts.PodmanImage(t)
	for _, img := range []string{"", image} {
		spec := runners.Spec{InvocationID: "sandboxed", ScratchDir: t.TempDir(), Image: img,
			Script: "dmesg > \"$NYMPH_RESULT_PATH\" 2>&1 || true\n"}
		out := runnertest.Outcome(t, newRunner(t, runsc), spec)
		if out.State != messages.StateSucceeded || !strings.Contains(string(out.Result), "gVisor") {
			t.Fatalf("image %q: outcome %+v result %q", img, out, out.Result)
		}
	}
}

func TestCancelLeavesNoRunscProcess(t *testing.T) {
	runsc := realparts.Runsc(t)
	scratch := t.TempDir()
	spec := runners.Spec{InvocationID: "cancel", ScratchDir: scratch, Script: "sleep 1000\n",
		Timeout: 1500 * time.Millisecond}
	out := runnertest.Outcome(t, newRunner(t, runsc), spec)
	if out.State != messages.StateKilled {
		t.Fatalf("outcome %+v", out)
	}
	runnertest.NoneNaming(t, scratch, "runsc processes left")
}

func TestImageWithoutContainerRunner(t *testing.T) {
	r := gvisor.New(zerolog.Nop())
	out := runnertest.Outcome(t, r, runners.Spec{InvocationID: "x", Image: "img", ScratchDir: t.TempDir()})
	if out.State != messages.StateFailed || !strings.Contains(out.Error.Message, "run_config.image") {
		t.Fatalf("outcome %+v", out)
	}
}

func TestReapLeftoversRemovesOwnImageContainers(t *testing.T) {
	runsc := realparts.Runsc(t)
	image := realparts.PodmanImage(t)
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	marker := "nymph-test-" + stamp
	r := newRunner(t, runsc, docker.WithOwner(marker))

	id := "reap-" + stamp
	name := docker.ContainerName(id)
	run := runnertest.StartOwned(t, r, marker, runners.Spec{
		InvocationID: id, Script: "sleep 1000\n", Image: image, ScratchDir: t.TempDir(),
	})
	// Another daemon's container (runc is enough to prove it is spared).
	other := realparts.Podman(t, append(append([]string{"run", "-d"}, realparts.PodmanRunArgs()...),
		"--label", docker.OwnerLabel+"="+marker+"-other", image, "sleep", "1000")...)
	t.Cleanup(func() {
		_ = exec.Command("podman", append(realparts.PodmanGlobalArgs(), "rm", "-f", "-t", "0", other)...).Run()
	})

	owned := "label=" + docker.OwnerLabel + "=" + marker
	wait.For(t, time.Minute, "container "+name+" labelled "+marker+" running", func() bool {
		return realparts.Podman(t, "ps", "-q", "--filter", owned, "--filter", "name="+name) != ""
	})
	n, err := r.ReapLeftovers(context.Background(), marker)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("removed %d containers, want 1", n)
	}
	out, runErr := run.Wait(t, time.Minute, "Run to return after its container was removed")
	if runErr != nil || out.State == messages.StateSucceeded {
		t.Fatalf("run of a removed container: outcome %+v error %v", out, runErr)
	}
	if left := realparts.Podman(t, "ps", "-a", "-q", "--filter", owned); left != "" {
		t.Fatalf("containers labelled %s left: %s", marker, left)
	}
	if state := realparts.Podman(t, "container", "inspect", "--format", "{{.State.Status}}", other); state != "running" {
		t.Fatalf("container %s of another owner is %q, want running", other, state)
	}
}

func TestReapLeftoversWithoutContainerRunner(t *testing.T) {
	r := gvisor.New(zerolog.Nop())
	if n, err := r.ReapLeftovers(context.Background(), "nymph-test"); n != 0 || err != nil {
		t.Fatalf("ReapLeftovers without a container runner = %d, %v", n, err)
	}
}
