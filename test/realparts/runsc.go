package realparts

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// Runsc checks that gVisor can sandbox a command here (`runsc
// --network=none do /bin/true`, run as root over the host filesystem) and
// returns the runsc path.
func Runsc(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	runsc := RequireTool(t, "runsc")[0]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--network=none", "do", "/bin/true")
	cmd.Dir = t.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("realparts: runsc --network=none do /bin/true: %v\n%s", err, out)
	}
	return runsc
}
