//go:build bench

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"nymph/test/harness"
	"nymph/test/wait"
)

// otaRows times an over-the-air update — from `lakeshore daemon update` to
// the new binary's first poll — against the same daemon's plain restart
// (SIGKILL, start, first poll). Both are seen at a proxy in front of the
// control plane, so the clock is the same for both.
func otaRows(t *testing.T, rep *report, cp *harness.ControlPlane) {
	t.Helper()
	v2 := harness.Version + "-bench-v2"
	v2Dir := t.TempDir()
	if err := harness.BuildVersion(harness.ModuleRoot(t), v2Dir, v2); err != nil {
		t.Fatal(err)
	}
	for path, version := range map[string]string{cp.Bins.Nymph: harness.Version, filepath.Join(v2Dir, "nymph"): v2} {
		if r := cp.CLI(t, "release", "publish", path, "--version", version); r.Code != 0 {
			t.Fatalf("release publish %s: %s", version, r.Stderr)
		}
	}
	b, err := os.ReadFile(cp.Bins.Nymph)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	proxy := harness.StartProxy(t, cp.URL)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "ota-bench", Bin: bin, ServerURL: proxy.URL})

	firstPoll := func(since time.Time) time.Duration {
		t.Helper()
		var at time.Time
		wait.For(t, 60*time.Second, "the first poll of the new process", func() bool {
			var ok bool
			at, ok = proxy.FirstPollAfterHello(since)
			return ok
		})
		return at.Sub(since)
	}
	const n = 5
	var update, restart []time.Duration
	pid := d.PID()
	for i := 0; i < n; i++ {
		version := []string{v2, harness.Version}[i%2]
		t0 := time.Now()
		if r := cp.CLI(t, "daemon", "update", "ota-bench", "--version", version); r.Code != 0 {
			t.Fatalf("daemon update: %s", r.Stderr)
		}
		update = append(update, firstPoll(t0))
	}
	if d.PID() != pid {
		t.Fatalf("the updated daemon is process %d, not %d", d.PID(), pid)
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		d.Kill()
		d.Start(d.Bin, nil)
		restart = append(restart, firstPoll(t0))
	}
	u, r := median(update), median(restart)
	rep.add(fmt.Sprintf("daemon update -> new binary's first poll (median of %d)", n), ms(u),
		"plain restart "+ms(r), float64(u)/float64(r), "<= 3 x plain restart", boolp(u <= 3*r))
}
