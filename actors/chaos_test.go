package actors_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/execs"
	"nymph/actors/invocations"
	"nymph/actors/ledger"
	"nymph/daemon/orphans"
	"nymph/messages"
	"nymph/test/wait"
)

// poison makes any actor of the tree panic: the chaos middleware below is
// the only place that knows it, so production code carries no test hook.
type poison struct{}

func poisonMiddleware(next actor.ReceiverFunc) actor.ReceiverFunc {
	return func(c actor.ReceiverContext, env *actor.MessageEnvelope) {
		if _, ok := env.Message.(*poison); ok {
			panic("chaos: poisoned")
		}
		next(c, env)
	}
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test skipped in -short mode")
	}
	began := time.Now()
	const (
		nExecs  = 220
		nRuns   = 20
		nSetups = 15
	)
	mark := "NYMPH_CHAOS_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	markKey, markVal, _ := strings.Cut(mark, "=")
	h := newHarness(t, setup{
		level: zerolog.WarnLevel,
		opts:  []actors.Option{actors.WithPropsOptions(actor.WithReceiverMiddleware(poisonMiddleware))},
		settings: func(s *actors.Settings) {
			s.MaxRestarts = 1 << 20
			s.KillGrace = 100 * time.Millisecond
			s.Poll.WaitMax = 500 * time.Millisecond
			s.Poll.MaxInvocations = 64
		},
	})
	h.waitPolls(1)

	// Warm up, then take the goroutine baseline with the daemon idle.
	for i := range 4 {
		h.exec(fmt.Sprintf("warm-%d", i), "echo warm", func(e *messages.Exec) {
			e.Log = &messages.LogSink{StdoutURL: fmt.Sprintf("/v1/daemon/exec/warm-%d/chunk", i), FlushMs: 10}
		})
	}
	for i := range 4 {
		h.cp.WaitResult(fmt.Sprintf("warm-%d", i), 10*time.Second)
	}
	baseline := settledGoroutines(h)
	t.Logf("goroutine baseline %d", baseline)

	orderFile := filepath.Join(h.workdir, "setup-order")
	for i := range nSetups {
		h.cp.QueueSetup(messages.Setup{Name: ptr(fmt.Sprintf("s%d", i)), Script: fmt.Sprintf("sleep 0.02; echo %d >> %s", i, orderFile)})
	}

	// Chaos: crash and stop actors at random until told to stop.
	var crashes, stops atomic.Int64
	stopChaos := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		rng := rand.New(rand.NewPCG(1, 2))
		root := h.d.System().Root
		randomChild := func(kind ledger.Kind) *actor.PID {
			ids := h.d.Ledger().IDs(kind)
			if len(ids) == 0 {
				return nil
			}
			id := ids[rng.IntN(len(ids))]
			parent, child := h.d.Child(actors.ExecsName), execs.ChildName(id)
			if kind != ledger.Exec {
				parent, child = h.d.Child(actors.InvocationsName), invocations.ChildName(id)
			}
			if parent == nil {
				return nil
			}
			return actor.NewPID(parent.Address, parent.Id+"/"+child)
		}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopChaos:
				return
			case <-tick.C:
			}
			var pid *actor.PID
			isParent := false
			switch rng.IntN(10) {
			case 0:
				pid = h.d.Child(actors.PollerName)
			case 1:
				pid = h.d.Child(actors.SetupName)
			case 2:
				pid, isParent = h.d.Child(actors.ExecsName), true
			case 3:
				pid, isParent = h.d.Child(actors.InvocationsName), true
			case 4, 5, 6, 7:
				pid = randomChild(ledger.Exec)
			default:
				pid = randomChild(ledger.Run)
			}
			if pid == nil {
				continue
			}
			// Parents are hit rarely: a parent crash takes all its
			// children with it, and some work should also succeed.
			if isParent && rng.IntN(4) != 0 {
				continue
			}
			if rng.IntN(3) == 0 {
				root.Stop(pid)
				stops.Add(1)
			} else {
				root.Send(pid, &poison{})
				crashes.Add(1)
			}
		}
	}()

	// Work arrives in waves while the chaos runs.
	kinds := map[string]string{}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range nExecs {
		id := fmt.Sprintf("c%03d", i)
		e := messages.Exec{ExecID: id, Env: map[string]string{markKey: markVal}}
		switch r := rng.IntN(20); {
		case r < 10:
			kinds[id] = "short"
			e.Command = fmt.Sprintf("sleep 0.0%d; echo %s", 1+rng.IntN(9), id)
		case r < 14:
			kinds[id] = "stream"
			e.Command = "for j in 1 2 3; do echo s$j; sleep 0.01; done"
			e.Log = &messages.LogSink{StdoutURL: "/v1/daemon/exec/" + id + "/chunk", FlushMs: 10}
		case r < 17:
			kinds[id] = "timeout"
			e.Command = "sleep 5"
			e.TimeoutS = ptr(0.1 + 0.1*float64(rng.IntN(3)))
		default:
			kinds[id] = "medium"
			e.Command = fmt.Sprintf("sleep 0.%d", 2+rng.IntN(3))
		}
		h.cp.QueueExec(e)
		if i < nRuns {
			h.cp.QueueRun(messages.Run{InvocationID: fmt.Sprintf("r%02d", i), Script: ptr("sleep 0.05"),
				RunConfig: messages.RunConfig{Env: map[string]string{markKey: markVal}}})
		}
		if i%20 == 19 {
			time.Sleep(60 * time.Millisecond) // pacing the producer, not waiting for anything
		}
	}

	h.cp.Wait(45*time.Second, "every exec and run reported", func() bool {
		return len(h.cp.Results()) >= nExecs+4 && len(h.cp.Acks()) >= nRuns
	})
	wait.For(t, 30*time.Second, "setup queue drained", func() bool { return h.d.SetupQueue().Idle() })
	close(stopChaos)
	<-chaosDone
	t.Logf("chaos: %d crashes, %d stops", crashes.Load(), stops.Load())

	// The daemon still polls and runs work after the storm.
	h.exec("after-chaos", "echo alive")
	if r := h.cp.WaitResult("after-chaos", 20*time.Second); r.ExitCode != 0 || r.Stdout != "alive\n" {
		t.Fatalf("after chaos: %+v %s", r, errOf(r))
	}

	// Exactly once, every one.
	results := h.cp.Results()
	outcome := map[string]int{}
	for i := range nExecs {
		id := fmt.Sprintf("c%03d", i)
		rs := results[id]
		if len(rs) != 1 {
			t.Fatalf("exec %s reported %d times", id, len(rs))
		}
		r := rs[0]
		switch {
		case r.ExitCode == 0:
			outcome[kinds[id]+" ok"]++
			if kinds[id] == "timeout" {
				t.Errorf("%s: a timing-out exec exited 0", id)
			}
		case r.ExitCode == messages.ExitTimeout:
			outcome["timeout -2"]++
			if kinds[id] != "timeout" {
				t.Errorf("%s (%s): -2", id, kinds[id])
			}
		case r.ExitCode == messages.ExitFailed:
			outcome["-1: "+errOf(r)]++
			if r.Error == nil || *r.Error == "" {
				t.Errorf("%s: -1 without an error", id)
			}
		default:
			t.Errorf("%s (%s): unexpected exit %d %s", id, kinds[id], r.ExitCode, errOf(r))
		}
	}
	acks := map[string]int{}
	for _, a := range h.cp.Acks() {
		acks[a.InvocationID]++
	}
	for i := range nRuns {
		if n := acks[fmt.Sprintf("r%02d", i)]; n != 1 {
			t.Fatalf("run r%02d acked %d times", i, n)
		}
	}
	t.Logf("outcomes: %v", outcome)
	if outcome["short ok"] == 0 || outcome["timeout -2"] == 0 {
		t.Errorf("the chaos left no normal outcome at all: %v", outcome)
	}

	// Setups ran in FIFO order (an interrupted one runs again right away).
	b, err := os.ReadFile(orderFile)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, line := range strings.Fields(string(b)) {
		if len(order) == 0 || order[len(order)-1] != line {
			order = append(order, line)
		}
	}
	var want []string
	for i := range nSetups {
		want = append(want, strconv.Itoa(i))
	}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("setup order %v, want %v", order, want)
	}

	// No process or process group left, no goroutine leaked.
	wait.For(t, 10*time.Second, "no marked process alive", func() bool {
		pids, err := orphans.WithEnv("/proc", mark)
		return err == nil && len(pids) == 0
	})
	wait.For(t, 10*time.Second, "no child process alive", func() bool { return len(children()) == 0 })
	var last int
	ok := waitGoroutines(h, baseline, 20*time.Second, &last)
	if !ok {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("goroutines %d, baseline %d\n%s", last, baseline, buf[:n])
	}
	t.Logf("goroutines back to %d (baseline %d); chaos test took %v", last, baseline, time.Since(began))
}

// settledGoroutines drops pooled connections on both sides and returns the
// goroutine count once it stops moving.
func settledGoroutines(h *harness) int {
	prev := -1
	for range 50 {
		h.client.CloseIdleConnections()
		h.cp.CloseClientConnections()
		time.Sleep(100 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == prev {
			return n
		}
		prev = n
	}
	return prev
}

var goroutineSlack = 8

func waitGoroutines(h *harness, baseline int, timeout time.Duration, last *int) bool {
	return wait.Until(timeout, func() bool {
		h.client.CloseIdleConnections()
		h.cp.CloseClientConnections()
		*last = runtime.NumGoroutine()
		return *last <= baseline+goroutineSlack
	})
}

func TestRepeatedCrashesEscalate(t *testing.T) {
	h := newHarness(t, setup{
		opts:     []actors.Option{actors.WithPropsOptions(actor.WithReceiverMiddleware(poisonMiddleware))},
		settings: func(s *actors.Settings) { s.MaxRestarts = 2; s.RestartWindow = time.Minute },
	})
	h.waitPolls(1)
	h.exec("victim", "sleep 30")
	wait.For(t, 10*time.Second, "running", func() bool { return h.d.Ledger().Active() == 1 })
	for range 3 {
		h.d.System().Root.Send(h.d.Child(actors.PollerName), &poison{})
	}
	err := h.wait(20 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "crashed 3 times") {
		t.Fatalf("err = %v", err)
	}
	// the running exec was killed and reported on the way out
	if r := h.cp.WaitResult("victim", 10*time.Second); r.ExitCode != messages.ExitFailed {
		t.Fatalf("%+v", r)
	}
}
