package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
)

// Name is the writer actor's name under the root.
const Name = "metrics"

// WriterDeps is what the writer actor needs. It outlives every instance.
type WriterDeps struct {
	Textfile *Textfile
	// Interval is the time between two writes (at least a second).
	Interval time.Duration
	// Jobs counts the writes under way, so the daemon's Wait waits for the
	// last one.
	Jobs *sync.WaitGroup
	// PropsOptions are added to the actor's props.
	PropsOptions []actor.PropsOption

	// gen numbers the writer's timers across its incarnations, so a tick
	// that was already on its way when its timer was stopped is told from
	// the current one.
	gen atomic.Uint64
}

// tick is the writer's own timer message, sent Interval after the last.
type tick struct{ gen uint64 }

// Props returns the props of the writer: it writes the file when it starts,
// at every tick, and once more when it stops (the daemon's shutdown). The
// writes run on goroutines of their own, never in Receive (an fsync can
// take a while); a tick that finds one under way is dropped, the writes at
// a start and a stop wait for it. A restarted
// writer starts a new timer and writes at once: the counters live in the
// Recorder, so it loses nothing.
func Props(d *WriterDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &writer{d: d} }, d.PropsOptions...)
}

type writer struct {
	d      *WriterDeps
	gen    uint64
	cancel scheduler.CancelFunc
}

func (w *writer) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		w.arm(ctx)
		// A new incarnation's first write waits for one under way (its
		// previous incarnation's), so what changed since is not left to
		// the next tick.
		w.write(true)
	case *tick:
		if m.gen != w.gen {
			return // from a timer stopped after it fired
		}
		w.arm(ctx)
		w.write(false)
	case *actor.Stopping:
		w.stopTimer()
		// The last write waits for one under way: it has the final word.
		w.write(true)
	case *actor.Restarting:
		w.stopTimer()
	}
}

// arm sets the next tick. One-shot timers re-armed on each tick, as the
// poller's are: protoactor's SendRepeatedly reads its state unguarded
// while its cancel writes it, which the race detector reports when a
// restart cancels one.
func (w *writer) arm(ctx actor.Context) {
	w.gen = w.d.gen.Add(1)
	w.cancel = scheduler.NewTimerScheduler(ctx).SendOnce(max(w.d.Interval, time.Second), ctx.Self(), &tick{gen: w.gen})
}

func (w *writer) stopTimer() {
	if w.cancel != nil {
		w.cancel()
		w.cancel = nil
	}
}

// write writes on a goroutine of its own; wait: after the write under
// way, if any, instead of not at all.
func (w *writer) write(wait bool) {
	w.d.Jobs.Add(1)
	go func() {
		defer w.d.Jobs.Done()
		if wait {
			_ = w.d.Textfile.Write()
			return
		}
		w.d.Textfile.TryWrite()
	}()
}
