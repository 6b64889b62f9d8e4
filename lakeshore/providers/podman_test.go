package providers_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/providers"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// podmanSpec is a provider of image with the flags podman needs here: the
// global ones through --cli, the rlimits through --run-arg.
func podmanSpec(image string) providers.PodmanSpec {
	return providers.PodmanSpec{
		Image:   image,
		CLI:     realparts.PodmanCLI(),
		RunArgs: append(realparts.PodmanLimitArgs(), "--pull=never"),
	}
}

func newPodman(t *testing.T, spec providers.PodmanSpec) (*providers.Podman, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bootstraps")
	p, err := providers.NewPodman("local", spec, dir, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	return p, dir
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestPodmanLaunchConsoleTerminate launches a container whose bootstrap
// prints and keeps running, reads its output through ConsoleLog, checks
// the token is nowhere podman or the process table shows, and terminates
// it (twice).
func TestPodmanLaunchConsoleTerminate(t *testing.T) {
	t.Parallel()
	image := realparts.PodmanBashImage(t)
	p, dir := newPodman(t, podmanSpec(image))
	ctx := testContext(t)
	if err := p.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}

	// The control plane the daemon dials is on this host's loopback.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello from the host")
	}))
	t.Cleanup(srv.Close)

	workerID := randomHex(t, 12)
	token := "tok-" + randomHex(t, 16)
	bootstrap := "#!/bin/bash\nset -eu\ntoken='" + token + "'\n" +
		"echo \"booted as uid $(id -u) with ${#token} token bytes\"\n" +
		"echo \"fetched: $(wget -q -O - " + srv.URL + "/)\"\n" +
		"echo 'a line on stderr' >&2\n" +
		"exec sleep 100000\n"
	inst, err := p.Launch(ctx, providers.LaunchRequest{WorkerID: workerID, Name: "podman-test", Bootstrap: bootstrap})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	t.Cleanup(func() {
		_ = exec.Command("podman", append(realparts.PodmanGlobalArgs(), "rm", "-f", "-t", "0", inst.ID)...).Run()
	})

	var console string
	wait.For(t, time.Minute, "the bootstrap's output in ConsoleLog", func() bool {
		console, err = p.ConsoleLog(ctx, inst.ID, true)
		if err != nil {
			t.Fatalf("ConsoleLog: %v", err)
		}
		return strings.Contains(console, "a line on stderr")
	})
	if !strings.Contains(console, "booted as uid 0 with 36 token bytes") || !strings.Contains(console, "fetched: hello from the host") {
		t.Fatalf("console log lacks the bootstrap's stdout: %q", console)
	}
	if got := realparts.Podman(t, "inspect", "--format", "{{.State.Running}} {{.Name}} {{index .Config.Labels \"lakeshore.worker\"}} {{index .Config.Labels \"lakeshore.name\"}} {{.HostConfig.NetworkMode}}", inst.ID); got != "true lakeshore-"+workerID+" "+workerID+" podman-test host" {
		t.Fatalf("container state, name, label, network: %q", got)
	}

	// The token is in no place podman or ps show: not the container's
	// description (command, environment, labels) nor any process's
	// command line or environment on this host.
	if inspect := realparts.Podman(t, "inspect", inst.ID); strings.Contains(inspect, token) {
		t.Fatalf("podman inspect shows the token:\n%s", inspect)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, proc := range procs {
		for _, f := range []string{"cmdline", "environ"} {
			if b, err := os.ReadFile(filepath.Join(proc, f)); err == nil && strings.Contains(string(b), token) {
				t.Fatalf("%s/%s shows the token", proc, f)
			}
		}
	}
	files, _ := os.ReadDir(dir)
	if len(files) != 1 {
		t.Fatalf("bootstrap dir holds %v, want one file", files)
	}
	if st, err := os.Stat(filepath.Join(dir, files[0].Name())); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("bootstrap file mode: %v, %v", st.Mode(), err)
	}

	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("Terminate: %v", err)
	}
	if err := exec.Command("podman", append(realparts.PodmanGlobalArgs(), "container", "exists", inst.ID)...).Run(); err == nil {
		t.Fatal("the container still exists after Terminate")
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("Terminate left %v in the bootstrap dir", files)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("Terminate of a removed container: %v", err)
	}
	if _, err := p.ConsoleLog(ctx, inst.ID, true); !errors.Is(err, providers.ErrInstanceGone) {
		t.Fatalf("ConsoleLog of a removed container: %v, want ErrInstanceGone", err)
	}
}

// TestPodmanMissingImage: Check names the image and the fix, and a launch
// of it fails leaving neither a container nor a bootstrap file behind.
func TestPodmanMissingImage(t *testing.T) {
	t.Parallel()
	realparts.RequireRoot(t)
	realparts.RequireTool(t, "podman", "runc")
	image := "localhost/lakeshore-no-such-image:" + randomHex(t, 4)
	p, dir := newPodman(t, podmanSpec(image))
	ctx := testContext(t)

	err := p.Check(ctx)
	if err == nil || !strings.Contains(err.Error(), image+" does not exist on this host") || !strings.Contains(err.Error(), "pull") {
		t.Fatalf("Check of a missing image: %v", err)
	}

	workerID := randomHex(t, 12)
	if _, err := p.Launch(ctx, providers.LaunchRequest{WorkerID: workerID, Bootstrap: "echo never\n"}); err == nil {
		t.Fatal("Launch of a missing image succeeded")
	} else {
		t.Logf("Launch: %v", err)
	}
	if err := exec.Command("podman", append(realparts.PodmanGlobalArgs(), "container", "exists", "lakeshore-"+workerID)...).Run(); err == nil {
		t.Fatal("a failed launch left its container")
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Fatalf("a failed launch left %v in the bootstrap dir", files)
	}
}

// TestPodmanBrokenCLI: a CLI that is missing, or that podman rejects,
// fails Check naming --cli.
func TestPodmanBrokenCLI(t *testing.T) {
	t.Parallel()
	realparts.RequireRoot(t)
	realparts.RequireTool(t, "podman", "runc")
	image := realparts.PodmanImage(t)
	ctx := testContext(t)
	for _, cli := range []string{"/nonexistent/podman", "podman --no-such-global-flag"} {
		spec := podmanSpec(image)
		spec.CLI = cli
		p, _ := newPodman(t, spec)
		if err := p.Check(ctx); err == nil || !strings.Contains(err.Error(), "--cli") {
			t.Errorf("Check with --cli %q: %v, want an error naming --cli", cli, err)
		} else {
			t.Logf("Check with --cli %q: %v", cli, err)
		}
	}
}

func TestPodmanSpecValidate(t *testing.T) {
	for _, c := range []struct {
		spec providers.PodmanSpec
		flag string // "" means valid
	}{
		{providers.PodmanSpec{Image: "localhost/x:1"}, ""},
		{providers.PodmanSpec{Image: "localhost/x:1", CLI: "podman --runtime runc", RunArgs: []string{"--ulimit", "nofile=1024:1024"}}, ""},
		{providers.PodmanSpec{}, "--image"},
		{providers.PodmanSpec{Image: "--privileged"}, "--image"},
		{providers.PodmanSpec{Image: "x", CLI: "  "}, "--cli"},
		{providers.PodmanSpec{Image: "x", RunArgs: []string{""}}, "--run-arg"},
	} {
		err := c.spec.Validate()
		if c.flag == "" && err != nil || c.flag != "" && (err == nil || !strings.Contains(err.Error(), c.flag)) {
			t.Errorf("%+v: Validate = %v, want an error naming %q", c.spec, err, c.flag)
		}
	}
}

// TestPodmanCallEndsWithContext: a podman that never returns is killed
// when the call's ctx ends.
func TestPodmanCallEndsWithContext(t *testing.T) {
	t.Parallel()
	spec := podmanSpec("localhost/x:1")
	spec.CLI = launcher(t, "hang.sh", t.TempDir()) // a CLI that hangs
	p, _ := newPodman(t, spec)
	ctx, cancel := context.WithTimeout(testContext(t), 200*time.Millisecond)
	defer cancel()
	if err := p.Check(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Check with a hanging CLI: %v, want the ctx's deadline", err)
	}
}
