// Package procs owns the number of processors the Go runtime gives the
// control plane (GOMAXPROCS), which it adapts to the load.
//
// A control plane that serves one operator's execs is bound by latency,
// not CPU: each request hands work from goroutine to goroutine (the
// connection's, a parked poll's, the one waiting for a result), and with
// a processor per CPU every such hand-off wakes an idle thread, which
// spins and sleeps again. On a two-core host that was a quarter of the
// control plane's CPU per exec, and the exec's latency with it. One
// processor makes the hand-offs plain goroutine switches, but caps a busy
// control plane at one CPU. So the runtime gets one processor while the
// process uses well under one CPU, and every processor it may use as
// soon as it needs more.
package procs

import (
	"context"
	"runtime"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Thresholds, in CPUs used by the process over a window. Raising takes
// one window at Raise or more: one processor is close to saturated.
// Lowering takes LowerAfter windows in a row under Lower. The same work
// costs more CPU with more processors (that is the point of having one),
// so Lower is measured with Max processors: 0.6 of a CPU there is well
// under Raise with one, and the count does not swing back and forth.
const (
	Raise      = 0.85
	Lower      = 0.6
	LowerAfter = 8
	// Window is how often the load is looked at.
	Window = 125 * time.Millisecond
)

// Policy decides the processor count from the load. It is not safe for
// concurrent use; Run owns it.
type Policy struct {
	// Max is the count when busy: the runtime's own choice.
	Max   int
	quiet int // windows in a row under Lower
	cur   int
}

// NewPolicy starts at one processor.
func NewPolicy(max int) *Policy { return &Policy{Max: max, cur: 1} }

// Next is the count for the next window, given the CPUs the process used
// in the last one.
func (p *Policy) Next(used float64) int {
	switch {
	case used >= Raise:
		p.quiet = 0
		p.cur = p.Max
	case used < Lower && p.cur > 1:
		p.quiet++
		if p.quiet >= LowerAfter {
			p.quiet = 0
			p.cur = 1
		}
	default:
		p.quiet = 0
	}
	return p.cur
}

// CPUTime is the CPU time the process has used, user and system.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Adapter runs a Policy against the process.
type Adapter struct {
	// Max, Window: as for Policy and the package's Window.
	Max    int
	Window time.Duration
	// CPU and Now read the process's CPU time and the clock; Set applies
	// a count. The defaults are the real ones (CPUTime, time.Now,
	// runtime.GOMAXPROCS).
	CPU func() time.Duration
	Now func() time.Time
	Set func(int)
	// Changed, when set, is told every count applied, after Set.
	Changed func(n int)
	Log     zerolog.Logger
}

// Run adapts the count until ctx is done, and then leaves the runtime
// with Max processors. It starts at one.
func (a *Adapter) Run(ctx context.Context) {
	cpu, now, set := a.CPU, a.Now, a.Set
	if cpu == nil {
		cpu = CPUTime
	}
	if now == nil {
		now = time.Now
	}
	if set == nil {
		set = func(n int) { runtime.GOMAXPROCS(n) }
	}
	window := a.Window
	if window <= 0 {
		window = Window
	}
	p := NewPolicy(a.Max)
	apply := func(n int) {
		set(n)
		if a.Changed != nil {
			a.Changed(n)
		}
	}
	cur := 1
	apply(cur)
	defer func() {
		if cur != a.Max {
			apply(a.Max)
		}
	}()
	t := time.NewTicker(window)
	defer t.Stop()
	lastCPU, lastAt := cpu(), now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, at := cpu(), now()
		wall := at.Sub(lastAt)
		if wall <= 0 {
			continue
		}
		used := float64(c-lastCPU) / float64(wall)
		lastCPU, lastAt = c, at
		if n := p.Next(used); n != cur {
			a.Log.Debug().Int("gomaxprocs", n).Float64("cpus_used", used).Msg("runtime processors adapted to the load")
			cur = n
			apply(n)
		}
	}
}
