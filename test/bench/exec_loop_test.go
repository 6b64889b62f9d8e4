//go:build bench

package bench

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/test/harness"
)

// TestExecLoop runs back-to-back execs of `true` on one daemon for
// BENCH_LOOP_S seconds (default 30), for profiling the single exec path
// from outside (perf record -p, perf trace): it logs the pids of the
// control plane, the daemon and this process first, then, per thousand
// execs, the rate and the CPU each of them spent per exec. It is no
// benchmark of its own (TestExecBench is, with its baselines in turns):
//
//	BENCH_LOOP_S=60 go test -tags bench -run TestExecLoop -v ./test/bench/
//
// BENCH_CP_ENV and BENCH_NYMPH_ENV add one VAR=value to the control
// plane's and the daemon's environment, as for TestExecBench.
func TestExecLoop(t *testing.T) {
	secs := 30
	if v := os.Getenv("BENCH_LOOP_S"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("BENCH_LOOP_S=%q: want a number of seconds, such as 60", v)
		}
		secs = n
	}
	cpEnv, nyEnv := benchEnv()
	cp := harness.StartControlPlane(t, harness.CPOptions{Env: cpEnv})
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "loop", Env: nyEnv})
	client, err := opclient.New(cp.URL, cp.AdminToken, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := cp.WaitForWorker(t, "loop")
	// As the CLI runs, and as TestExecBench's back-to-back turns do.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	t.Logf("pids: lakeshore serve %d, nymph %d, this process %d", cp.PID(), d.PID(), os.Getpid())
	cpu := func() [4]time.Duration { return pathCPU(t, cp.PID(), d.PID()) }
	ctx := context.Background()
	end := time.Now().Add(time.Duration(secs) * time.Second)
	const per = 1000
	for i := 0; time.Now().Before(end); {
		c0, start := cpu(), time.Now()
		for j := 0; j < per; j++ {
			execTrue(ctx, t, client, w.ID, i)
			i++
		}
		took, c1 := time.Since(start), cpu()
		each := func(k int) string { return ms((c1[k] - c0[k]) / per) }
		t.Logf("%d execs: %.0f /s; CPU per exec: lakeshore serve %s, nymph %s, bash %s, client %s",
			i, per/took.Seconds(), each(0), each(1), each(2), each(3))
	}
}
