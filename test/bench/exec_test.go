//go:build bench

package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
	"nymph/test/realparts"
)

// TestExecBench prints only the baselines and the single exec path's rows
// (go test -tags bench -run TestExecBench -v ./test/bench/), a quicker
// loop than the whole of `make bench` while working on that path.
func TestExecBench(t *testing.T) {
	rep := &report{}
	defer rep.print(os.Stdout)

	base := baselines(t, rep)
	cpEnv, nyEnv := benchEnv()
	cp := harness.StartControlPlane(t, harness.CPOptions{Env: cpEnv})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "bench", Env: nyEnv})
	cliStartRows(t, rep, cp, base)
	execRows(t, rep, cp, "bench", d.PID(), base)
}

// base holds the baselines every ratio is taken against.
type base struct {
	bash, sshCold, sshWarm time.Duration
	// sshMux runs `true` over the warm ControlMaster, for rows that
	// measure it again beside their own figure.
	sshMux func() error
}

// baselines measures a bare bash spawn and ssh over a real sshd on
// loopback, cold and over a warm ControlMaster.
func baselines(t *testing.T, rep *report) base {
	t.Helper()
	var b base
	b.bash = timeN(t, 200, bashTrue)
	rep.add("baseline: bash -c true spawn (median)", ms(b.bash), "", 0, "", nil)

	sshd := realparts.StartSSHD(t)
	ctx := context.Background()
	b.sshCold = timeN(t, 10, func() error { return sshd.Command(ctx, "true").Run() })
	rep.add("baseline: ssh alias true, cold (median)", ms(b.sshCold), "", 0, "", nil)
	sshd.ControlMaster(t)
	b.sshMux = func() error { return sshd.MuxCommand(ctx, "true").Run() }
	b.sshWarm = timeN(t, 50, b.sshMux)
	rep.add("baseline: ssh alias true, ControlMaster (median)", ms(b.sshWarm), "", 0, "", nil)
	return b
}

// execRows measures the single exec path on the daemon labelled label
// (process daemonPID): the CLI's `daemon exec <d> true` round trip against
// ssh, and 1,000 back-to-back execs through opclient (queue and wait in one
// request, as the CLI does) against the raw spawn rate of `bash -c true`,
// with the CPU each process on the path spent per exec (on a machine of
// two cores the path is serial, so its CPU is its wall time). It returns
// the round trip and the rate, the baselines of later rows.
//
// The two targets' baselines are measured again here, in turns with what
// they are compared with (an ssh, then an exec; ten spawns, then fifty
// execs): on a shared machine the load swings by half within a minute,
// and a baseline taken a minute before is one of another machine.
func execRows(t *testing.T, rep *report, cp *harness.ControlPlane, label string, daemonPID int, b base) (time.Duration, float64) {
	t.Helper()
	ctx := context.Background()
	cliExec := func() error {
		r := cp.CLI(t, "daemon", "exec", label, "true")
		if r.Code != 0 {
			return fmt.Errorf("exit %d: %s", r.Code, r.Stderr)
		}
		return nil
	}
	const pairs = 40
	var sshDs, execDs []time.Duration
	for i := 0; i < pairs; i++ {
		sshDs = append(sshDs, timeOnce(t, b.sshMux))
		execDs = append(execDs, timeOnce(t, cliExec))
	}
	sshWarm, execRT := median(sshDs), median(execDs)
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "ssh cold "+ms(b.sshCold), float64(execRT)/float64(b.sshCold), "<= 0.1 x ssh cold", boolp(float64(execRT) <= 0.1*float64(b.sshCold)))
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "ssh warm "+ms(sshWarm)+" (in turns)", float64(execRT)/float64(sshWarm), "<= 1 x ssh warm", boolp(execRT <= sshWarm))
	rep.add("lakeshore daemon exec <d> true round trip", ms(execRT), "bash spawn "+ms(b.bash), float64(execRT)/float64(b.bash), "", nil)

	client, err := opclient.New(cp.URL, cp.AdminToken, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := cp.WaitForWorker(t, label)
	// This process is the operator client here, and runs as the CLI does
	// (cmd/lakeshore: one processor); the spawns it is compared with run
	// in the same setting, in turns with the execs.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	one := func(i int) { execTrue(ctx, t, client, w.ID, i) }
	cpu := func() [4]time.Duration { return pathCPU(t, cp.PID(), daemonPID) }
	const n, round, spawns = 1000, 50, 10
	var execTime, spawnTime time.Duration
	var spent [4]time.Duration
	for done := 0; done < n; done += round {
		start := time.Now()
		for j := 0; j < spawns; j++ {
			if err := bashTrue(); err != nil {
				t.Fatal(err)
			}
		}
		spawnTime += time.Since(start)
		cpu0 := cpu()
		start = time.Now()
		for j := 0; j < round; j++ {
			one(done + j)
		}
		execTime += time.Since(start)
		cpu1 := cpu()
		for i := range spent {
			spent[i] += cpu1[i] - cpu0[i]
		}
	}
	perSec := float64(n) / execTime.Seconds()
	rawRate := float64(n/round*spawns) / spawnTime.Seconds()
	rep.add(fmt.Sprintf("%d back-to-back execs on one daemon", n), fmt.Sprintf("%.0f /s", perSec), fmt.Sprintf("raw spawn %.0f /s (in turns)", rawRate), perSec/rawRate, ">= 0.5 x raw spawn", boolp(perSec >= 0.5*rawRate))
	for i, who := range []string{"lakeshore serve", "nymph itself", "nymph's children (bash)", "the operator client"} {
		rep.add("  CPU per exec: "+who, ms(spent[i]/n), "", 0, "", nil)
	}
	return execRT, perSec
}

// execTrue queues `true` on worker workerID and waits until it finished,
// as `lakeshore daemon exec` does: one request that queues and waits, then
// a wait on the exec for as long as that one ended early.
func execTrue(ctx context.Context, t *testing.T, client *opclient.Client, workerID string, i int) {
	t.Helper()
	acc, first, err := client.SubmitExec(ctx, workerID, operatorapi.ExecRequest{Command: "true"}, 20*time.Second)
	if err != nil {
		t.Fatalf("exec %d: %v", i, err)
	}
	for first == nil || first.State != operatorapi.ExecFinished {
		e, err := client.GetExec(ctx, acc.ExecID, 20*time.Second, 0)
		if err != nil {
			t.Fatalf("get exec %d: %v", i, err)
		}
		first = &e
	}
}

// benchEnv reads BENCH_CP_ENV and BENCH_NYMPH_ENV: one VAR=value each for
// the control plane's and the daemon's environment, to compare runtime
// settings in one sitting (BENCH_CP_ENV=GOMAXPROCS=2: the control plane
// with every processor, as before --procs auto).
func benchEnv() (cpEnv, nymphEnv []string) {
	if v := os.Getenv("BENCH_CP_ENV"); v != "" {
		cpEnv = []string{v}
	}
	if v := os.Getenv("BENCH_NYMPH_ENV"); v != "" {
		nymphEnv = []string{v}
	}
	return cpEnv, nymphEnv
}

// pathCPU is the CPU spent so far by each process on the exec path: the
// control plane, the daemon, the daemon's children and this process (the
// operator client).
func pathCPU(t *testing.T, cpPID, daemonPID int) (c [4]time.Duration) {
	t.Helper()
	var err error
	if c[0], _, err = procCPU(cpPID); err == nil {
		if c[1], c[2], err = procCPU(daemonPID); err == nil {
			c[3], _, err = procCPU(os.Getpid())
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}
