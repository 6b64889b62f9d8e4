package gvisor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/docker"
	"nymph/runners/gvisor"
	"nymph/runners/procgroup"
	"nymph/runners/runnertest"
	"nymph/test/realparts"
)

func newRunner(t *testing.T, runsc string) *gvisor.Runner {
	log := zerolog.New(zerolog.NewTestWriter(t))
	global := append([]string{"--runtime", runsc, "--runtime-flag", "network=none"}, realparts.PodmanGlobalArgs()...)
	// The later --runtime wins; drop the runc one realparts suggests.
	global = withoutRuntime(global[4:], global[:4])
	containers := docker.New(log,
		docker.WithKind(gvisor.Kind),
		docker.WithCLI("podman"),
		docker.WithGlobalArgs(global...),
		docker.WithRunArgs(realparts.PodmanRunArgs()...),
		docker.WithKillGrace(500*time.Millisecond))
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
		out, err := newRunner(t, runsc).Run(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
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
	out, err := newRunner(t, runsc).Run(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateKilled {
		t.Fatalf("outcome %+v", out)
	}
	if pids, _ := procgroup.WithCmdline(scratch); len(pids) != 0 {
		t.Fatalf("runsc processes left: %v", pids)
	}
}

func TestImageWithoutContainerRunner(t *testing.T) {
	r := gvisor.New(zerolog.Nop())
	out, err := r.Run(context.Background(), runners.Spec{InvocationID: "x", Image: "img", ScratchDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if out.State != messages.StateFailed || !strings.Contains(out.Error.Message, "run_config.image") {
		t.Fatalf("outcome %+v", out)
	}
}
