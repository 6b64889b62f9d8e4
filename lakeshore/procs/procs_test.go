package procs_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/procs"
)

// The policy raises at once, lowers only after a quiet spell, and does
// not swing on a load between its thresholds.
func TestPolicyRaisesAtOnceAndLowersAfterAQuietSpell(t *testing.T) {
	p := procs.NewPolicy(4)
	for _, step := range []struct {
		used float64
		want int
	}{
		{0.1, 1}, {0.6, 1}, {0.84, 1}, // under Raise: one
		{0.85, 4},          // a busy window: every processor
		{0.7, 4}, {0.2, 4}, // between the thresholds, then quiet once
		{0.9, 4}, // busy again: the quiet spell starts over
	} {
		if got := p.Next(step.used); got != step.want {
			t.Fatalf("after %.2f CPUs: %d processors, want %d", step.used, got, step.want)
		}
	}
	for i := 1; i < procs.LowerAfter; i++ {
		if got := p.Next(0.1); got != 4 {
			t.Fatalf("quiet window %d: %d processors, want 4 until %d", i, got, procs.LowerAfter)
		}
	}
	if got := p.Next(0.1); got != 1 {
		t.Fatalf("after %d quiet windows: %d processors, want 1", procs.LowerAfter, got)
	}
}

// fakeLoad is a fake CPU clock: the process's CPU time advances at the
// rate set, in CPUs, by the real clock.
type fakeLoad struct {
	mu   sync.Mutex
	rate float64
	cpu  time.Duration
	at   time.Time
}

func (f *fakeLoad) set(rate float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	f.rate = rate
}

func (f *fakeLoad) advance() {
	now := time.Now()
	if !f.at.IsZero() {
		f.cpu += time.Duration(f.rate * float64(now.Sub(f.at)))
	}
	f.at = now
}

func (f *fakeLoad) read() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	return f.cpu
}

// The adapter starts at one processor, follows the load up and down, and
// leaves the runtime's own count behind when it stops.
func TestAdapterFollowsTheLoadAndRestoresWhenDone(t *testing.T) {
	load := &fakeLoad{}
	changes := make(chan int, 16)
	var set []int
	var mu sync.Mutex
	a := &procs.Adapter{Max: 3, Window: time.Millisecond, CPU: load.read,
		Set:     func(n int) { mu.Lock(); set = append(set, n); mu.Unlock() },
		Changed: func(n int) { changes <- n }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	expect := func(want int, what string) {
		t.Helper()
		select {
		case got := <-changes:
			if got != want {
				t.Fatalf("%s: %d processors, want %d", what, got, want)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s: no change to %d processors", what, want)
		}
	}
	expect(1, "start")
	load.set(1.5)
	expect(3, "busy")
	load.set(0.05)
	expect(1, "quiet")
	cancel()
	expect(3, "stopped")
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(set) != 4 {
		t.Fatalf("Set called with %v, want [1 3 1 3]", set)
	}
}

// CPUTime is the process's own CPU time: it grows while this goroutine
// computes.
func TestCPUTimeGrowsWithWork(t *testing.T) {
	start := procs.CPUTime()
	if start <= 0 {
		t.Fatalf("CPU time %v", start)
	}
	x := 0
	for procs.CPUTime()-start < 20*time.Millisecond {
		for i := 0; i < 1e6; i++ {
			x += i
		}
	}
	runtime.KeepAlive(x)
}
