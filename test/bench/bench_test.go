//go:build bench

package bench

import (
	"fmt"
	"os"
	"testing"
	"time"

	"nymph/test/harness"
)

// TestBench prints the figures of `make bench`. Every target is a ratio
// against a baseline taken in this same run.
func TestBench(t *testing.T) {
	rep := &report{}
	defer rep.print(os.Stdout)

	base := baselines(t, rep)
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "bench"})
	cpRSS, err := rssKB(cp.PID())
	if err != nil {
		t.Fatal(err)
	}
	rep.add("lakeshore serve idle RSS (one daemon polling)", fmt.Sprintf("%.1f MB", float64(cpRSS)/1024), "", 0, "<= 40 MB", boolp(cpRSS <= 40*1024))
	cliStartRows(t, rep, cp, base)
	execRT, perSec := execRows(t, rep, cp, "bench", d.PID(), base)

	runRows(t, rep, cp, execRT, perSec)
	otaRows(t, rep, cp)
	identityRows(t, rep, cp, "bench")

	// Idle figures: a fresh daemon left alone for a few poll cycles.
	idle := cp.StartDaemon(t, harness.DaemonOptions{Label: "idle", WaitMaxS: 2})
	t0, _ := cpuTicks(idle.PID())
	idleWindow := 6 * time.Second
	time.Sleep(idleWindow) // measuring idle CPU is the point: nothing to wait on
	t1, _ := cpuTicks(idle.PID())
	rss, err := rssKB(idle.PID())
	if err != nil {
		t.Fatal(err)
	}
	rep.add("nymph idle RSS", fmt.Sprintf("%.1f MB", float64(rss)/1024), "", 0, "<= 20 MB", boolp(rss <= 20*1024))
	rep.add("nymph idle CPU over "+idleWindow.String()+" (wait_max_s=2)", fmt.Sprintf("%d ticks", t1-t0), "", 0, "near zero", boolp(t1-t0 <= 10))
}
