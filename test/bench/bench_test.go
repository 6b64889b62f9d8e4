//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
)

// TestBench prints the figures of `make bench`. Every target is a ratio
// against a baseline taken in this same run.
func TestBench(t *testing.T) {
	rep := &report{}
	defer rep.print(os.Stdout)

	// Baselines.
	bash := timeN(t, 200, bashTrue)
	rep.add("baseline: bash -c true spawn (median)", ms(bash), "", 0, "", nil)

	sshd := realparts.StartSSHD(t)
	ctx := context.Background()
	sshCold := timeN(t, 10, func() error { return sshd.Command(ctx, "true").Run() })
	rep.add("baseline: ssh alias true, cold (median)", ms(sshCold), "", 0, "", nil)
	sshd.ControlMaster(t)
	sshWarm := timeN(t, 50, func() error { return sshd.MuxCommand(ctx, "true").Run() })
	rep.add("baseline: ssh alias true, ControlMaster (median)", ms(sshWarm), "", 0, "", nil)

	// The system under test.
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	cp.StartDaemon(t, harness.DaemonOptions{Label: "bench"})
	cpRSS, err := rssKB(cp.PID())
	if err != nil {
		t.Fatal(err)
	}
	rep.add("lakeshore serve idle RSS (one daemon polling)", fmt.Sprintf("%.1f MB", float64(cpRSS)/1024), "", 0, "<= 40 MB", boolp(cpRSS <= 40*1024))

	execRT := timeN(t, 30, func() error {
		r := cp.CLI(t, "daemon", "exec", "bench", "true")
		if r.Code != 0 {
			return fmt.Errorf("exit %d: %s", r.Code, r.Stderr)
		}
		return nil
	})
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "ssh cold "+ms(sshCold), float64(execRT)/float64(sshCold), "<= 0.1 x ssh cold", boolp(float64(execRT) <= 0.1*float64(sshCold)))
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "ssh warm "+ms(sshWarm), float64(execRT)/float64(sshWarm), "<= 2 x ssh warm", boolp(float64(execRT) <= 2*float64(sshWarm)))
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "bash spawn "+ms(bash), float64(execRT)/float64(bash), "", nil)

	client, err := opclient.New(cp.URL, cp.AdminToken, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := cp.WaitForWorker(t, "bench")
	const n = 1000
	start := time.Now()
	for i := 0; i < n; i++ {
		acc, err := client.Exec(ctx, w.ID, operatorapi.ExecRequest{Command: "true"})
		if err != nil {
			t.Fatalf("exec %d: %v", i, err)
		}
		for {
			e, err := client.GetExec(ctx, acc.ExecID, 20*time.Second, 0)
			if err != nil {
				t.Fatalf("get exec %d: %v", i, err)
			}
			if e.State == operatorapi.ExecFinished {
				break
			}
		}
	}
	perSec := float64(n) / time.Since(start).Seconds()
	rawRate := 1 / bash.Seconds()
	rep.add(fmt.Sprintf("%d back-to-back execs on one daemon", n), fmt.Sprintf("%.0f /s", perSec), fmt.Sprintf("raw spawn %.0f /s", rawRate), perSec/rawRate, ">= 0.25 x raw spawn", boolp(perSec >= 0.25*rawRate))

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
