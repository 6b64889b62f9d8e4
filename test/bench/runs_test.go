//go:build bench

package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/test/harness"
)

// runRows measures function invocations: the CLI round trip of an echo
// run against the `daemon exec <d> true` round trip (execRT), and how many
// invocations one daemon with max_invocations = 8 completes per second
// against the back-to-back exec rate (execRate).
func runRows(t *testing.T, rep *report, cp *harness.ControlPlane, execRT time.Duration, execRate float64) {
	t.Helper()
	const queue = "bench-runs"
	cp.StartDaemon(t, harness.DaemonOptions{Label: "bench-runs", Queue: queue, Runners: []string{"echo", "process"}, MaxInvocations: 8})

	runRT := timeN(t, 30, func() error {
		r := cp.CLI(t, "run", "--queue", queue, "--runner", "echo", "--args-json", `{"x": 1}`, "m:f")
		if r.Code != 0 {
			return fmt.Errorf("exit %d: %s", r.Code, r.Stderr)
		}
		return nil
	})
	rep.add("lakeshore run --runner echo round trip", ms(runRT), "exec true "+ms(execRT), float64(runRT)/float64(execRT),
		"<= 1.5 x exec true", boolp(float64(runRT) <= 1.5*float64(execRT)))

	client, err := opclient.New(cp.URL, cp.AdminToken, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		runner string
		n      int
		req    operatorapi.InvocationRequest
	}{
		{"echo", 1000, operatorapi.InvocationRequest{Function: "m:f", Args: []byte("x")}},
		{"process", 300, operatorapi.InvocationRequest{Script: "true"}},
	} {
		runner := c.runner
		c.req.Queue = queue
		c.req.RunConfig.Runner = &runner
		perSec := invocationRate(t, client, c.req, c.n)
		var ok *bool
		target := ""
		if runner == "echo" {
			target = ">= 1 x b2b exec"
			ok = boolp(perSec >= execRate)
		}
		rep.add(fmt.Sprintf("%s invocations/s, max_invocations=8 (n=%d)", runner, c.n), fmt.Sprintf("%.0f /s", perSec),
			fmt.Sprintf("b2b exec %.0f /s", execRate), perSec/execRate, target, ok)
	}
}

// invocationRate submits n copies of req from 8 goroutines through
// opclient, waits until every one has succeeded, and returns the rate.
func invocationRate(t *testing.T, client *opclient.Client, req operatorapi.InvocationRequest, n int) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ids := make(chan string, n)
	errs := make(chan error, 8)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				sub, err := client.SubmitInvocation(ctx, req)
				if err != nil {
					errs <- fmt.Errorf("submit %d: %w", i, err)
					return
				}
				ids <- sub.Invocation.ID
			}
		}(w)
	}
	wg.Wait()
	close(ids)
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		inv, err := client.WaitInvocation(ctx, id, nil)
		if err != nil {
			t.Fatalf("wait %s: %v", id, err)
		}
		if inv.State != operatorapi.InvocationSucceeded {
			t.Fatalf("invocation %s ended %s: %+v", id, inv.State, inv.Error)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}
