package realparts

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestPodmanBashImage runs what a rendered bootstrap needs: bash itself
// (arrays, [[ ]], pipefail), busybox's wget and sha256sum, on the host
// network the podman provider uses.
func TestPodmanBashImage(t *testing.T) {
	image, ctx := timed(t, "PodmanBashImage", PodmanBashImage, 60*time.Second)
	t.Logf("image %s", image)

	script := `set -euo pipefail; a=(x y); [[ ${#a[@]} == 2 ]]; command -v wget sha256sum >/dev/null; printf hi | sha256sum; echo "bash $BASH_VERSION"`
	args := append(PodmanGlobalArgs(), "run", "--rm", "--network", "host")
	args = append(append(args, PodmanLimitArgs()...), image, "bash", "-c", script)
	out, err := exec.CommandContext(ctx, "podman", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("podman %v: %v\n%s", args, err, out)
	}
	// sha256("hi")
	if !strings.Contains(string(out), "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4") || !strings.Contains(string(out), "bash 5") {
		t.Fatalf("bootstrap tools in %s: %q", image, out)
	}
}
