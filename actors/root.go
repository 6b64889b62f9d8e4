package actors

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"

	"nymph/actors/execs"
	"nymph/actors/invocations"
	"nymph/actors/metrics"
	"nymph/actors/poller"
	"nymph/actors/setupqueue"
	"nymph/messages"
)

// hardStop ends the wait for reports after GraceExpired.
type hardStop struct{}

// root is the supervisor. It implements actor.SupervisorStrategy itself so
// that supervision decisions can see its state.
type root struct {
	d     *Daemon
	self  *actor.PID
	sys   *actor.ActorSystem
	sched *scheduler.TimerScheduler
	kids  map[string]*actor.PID
	// born counts the incarnations of each child. A respawned child gets
	// a name of its own ("poller~2"): protoactor registers a new actor
	// under its name before its mailbox is ready, and a goroutine of the
	// previous incarnation still sending to the old name would reach,
	// and race with, that half-built mailbox.
	born   map[string]int
	props  map[string]*actor.Props
	order  []string
	routes map[string]string

	shutting     bool
	graceExpired bool
	cancelGrace  scheduler.CancelFunc
	cancelHard   scheduler.CancelFunc
}

var _ actor.SupervisorStrategy = (*root)(nil)

func newRoot(d *Daemon) *root {
	r := &root{d: d, kids: map[string]*actor.PID{}, born: map[string]int{}, props: map[string]*actor.Props{}, routes: map[string]string{}}
	add := func(name string, p *actor.Props) {
		r.props[name] = p
		r.order = append(r.order, name)
	}
	add(SetupName, setupqueue.Props(d.setupDeps))
	add(ExecsName, execs.Props(d.execDeps))
	add(InvocationsName, invocations.Props(d.invocationsDeps))
	if d.writerDeps != nil {
		add(metrics.Name, metrics.Props(d.writerDeps))
	}
	for _, x := range d.opts.extras {
		add(x.name, x.props)
		for _, k := range x.kinds {
			r.routes[k] = x.name
		}
	}
	// The poller goes last: commands it dispatches find their actors.
	add(PollerName, poller.Props(d.pollerDeps))
	return r
}

func (r *root) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.self, r.sys = ctx.Self(), ctx.ActorSystem()
		r.sched = scheduler.NewTimerScheduler(ctx)
		for _, name := range r.order {
			r.spawn(ctx, name)
		}
	case *actor.Terminated:
		r.childGone(ctx, m.Who)
	case *messages.Dispatch:
		r.route(ctx, m)
	case *messages.ExecFinished, *messages.RunFinished, *messages.SetupFinished:
		// Jobs report here, not to their parent, whose incarnation may
		// have changed since they started; the current one retires the
		// finished child.
		var wake any = &messages.Wake{}
		switch m.(type) {
		case *messages.ExecFinished:
			r.send(ctx, ExecsName, m)
			// The control plane needs no fresh poll to learn of it.
			wake = &poller.PermitFreed{}
		case *messages.RunFinished:
			r.send(ctx, InvocationsName, m)
		case *messages.SetupFinished:
			// A setup-queue actor that started while an earlier
			// incarnation's setup was still winding down found the queue
			// busy: this is its cue to go on.
			r.send(ctx, SetupName, &messages.Queued{})
		}
		r.send(ctx, PollerName, wake)
		r.checkDone(ctx)
	case *messages.ExecStarted:
		r.send(ctx, PollerName, m)
	case *poller.TargetVersion:
		// Auto-update belongs to whichever child takes ota_update.
		if name, ok := r.routes[messages.KindOtaUpdate]; ok {
			r.send(ctx, name, m)
		}
	case *messages.Registered:
		r.d.log.Info().Str("worker_id", m.WorkerID).Bool("provisional", m.Provisional).Msg("daemon registered")
	case *messages.HelloRejected:
		r.d.setErr(&RejectError{Code: m.Code, Message: m.Message})
		r.shutting, r.graceExpired = true, true
		ctx.Stop(ctx.Self())
	case *messages.IdleExit:
		r.d.log.Info().Str("reason", m.Reason).Msg("idle exit")
		r.beginShutdown(ctx, 0)
	case *messages.Shutdown:
		r.beginShutdown(ctx, m.Grace)
	case *messages.GraceExpired:
		r.expireGrace(ctx)
	case *hardStop:
		r.d.log.Error().Int("active", r.d.ledger.Active()).Msg("work still unreported after the grace; stopping anyway")
		ctx.Stop(ctx.Self())
	case *actor.Stopping, *actor.Restarting:
		// Children terminating now must not be respawned by this instance.
		r.shutting = true
		for _, c := range []scheduler.CancelFunc{r.cancelGrace, r.cancelHard} {
			if c != nil {
				c()
			}
		}
	case *actor.Stopped:
		r.d.log.Info().Msg("daemon stopped")
		close(r.d.done)
	}
}

func (r *root) spawn(ctx actor.Context, name string) {
	r.born[name]++
	actorName := name
	if n := r.born[name]; n > 1 {
		actorName = fmt.Sprintf("%s~%d", name, n)
	}
	pid, err := ctx.SpawnNamed(r.props[name], actorName)
	if err != nil {
		r.d.log.Error().Err(err).Str("child", name).Msg("cannot spawn child")
		return
	}
	r.kids[name] = pid
	r.d.setChild(name, pid)
}

func (r *root) send(ctx actor.Context, name string, msg any) {
	if pid, ok := r.kids[name]; ok {
		ctx.Send(pid, msg)
	}
}

// childGone respawns a child that was stopped while the daemon runs; its
// state lives outside it, so the new one carries on.
func (r *root) childGone(ctx actor.Context, who *actor.PID) {
	for name, pid := range r.kids {
		if !pid.Equal(who) {
			continue
		}
		// A terminated actor leaves the registry before its Terminated
		// is sent: one naming an actor still registered is a stale or
		// forged notice, and acting on it would leave the live child
		// without its place in the tree.
		if _, alive := r.sys.ProcessRegistry.Get(pid); alive {
			break
		}
		delete(r.kids, name)
		r.d.setChild(name, nil)
		if r.shutting {
			break
		}
		r.d.log.Warn().Str("child", name).Msg("child stopped; respawning it")
		// Its Started picks up whatever work is pending in its store.
		r.spawn(ctx, name)
		break
	}
	r.checkDone(ctx)
}

func (r *root) route(ctx actor.Context, m *messages.Dispatch) {
	log := r.d.log.With().Str("command_id", m.CommandID).Str("kind", m.Kind).Logger()
	switch b := m.Body.(type) {
	// The poller has already entered execs and runs in the ledger (it holds
	// their permits from the moment they are dispatched); a refused one is
	// there marked refused, and its parent reports the refusal.
	case *messages.Exec:
		if m.Refused != "" {
			log.Warn().Str("exec_id", b.ExecID).Str("reason", m.Refused).Msg("exec refused")
			r.send(ctx, ExecsName, &messages.Queued{})
			return
		}
		log.Info().Str("exec_id", b.ExecID).Msg("exec accepted")
		r.send(ctx, ExecsName, &messages.Queued{})
	case *messages.Run:
		if m.Refused != "" {
			log.Warn().Str("invocation_id", b.InvocationID).Str("reason", m.Refused).Msg("invocation refused")
			r.send(ctx, InvocationsName, &messages.Queued{})
			return
		}
		log.Info().Str("invocation_id", b.InvocationID).Msg("invocation accepted")
		r.send(ctx, InvocationsName, &messages.Queued{})
	case *messages.Setup:
		if r.shutting {
			log.Warn().Msg("setup received while stopping; dropped")
			return
		}
		r.d.fifo.Push(m.CommandID, b)
		log.Info().Int("queued", r.d.fifo.Len()).Msg("setup queued")
		r.send(ctx, SetupName, &messages.Queued{})
	case *messages.Cancel:
		if b.ExecID != nil {
			r.send(ctx, ExecsName, b)
		}
		if b.InvocationID != nil {
			r.send(ctx, InvocationsName, b)
		}
	default:
		if name, ok := r.routes[m.Kind]; ok {
			r.send(ctx, name, m)
			return
		}
		log.Info().Msg("command received; it is handled by its own actor when one is configured")
	}
}

func (r *root) beginShutdown(ctx actor.Context, grace time.Duration) {
	if r.shutting {
		return
	}
	r.shutting = true
	r.d.log.Info().Dur("grace", grace).Int("active", r.d.ledger.Active()).Msg("shutting down")
	for _, name := range r.order {
		r.send(ctx, name, &messages.Shutdown{Grace: grace})
	}
	r.cancelGrace = r.sched.SendOnce(grace, ctx.Self(), &messages.GraceExpired{})
	r.checkDone(ctx)
}

func (r *root) expireGrace(ctx actor.Context) {
	if r.graceExpired {
		return
	}
	if !r.shutting {
		r.shutting = true
		for _, name := range r.order {
			r.send(ctx, name, &messages.Shutdown{})
		}
	}
	r.graceExpired = true
	r.d.log.Warn().Int("active", r.d.ledger.Active()).Msg("shutdown grace over: killing running work")
	for _, name := range r.order {
		if name != PollerName {
			r.send(ctx, name, &messages.GraceExpired{})
		}
	}
	r.cancelHard = r.sched.SendOnce(r.d.settings.StopTimeout, ctx.Self(), &hardStop{})
	r.checkDone(ctx)
}

// checkDone stops the root once shutting down and nothing is left running.
func (r *root) checkDone(ctx actor.Context) {
	if r.shutting && r.d.ledger.Active() == 0 && !r.d.fifo.Busy() {
		ctx.Stop(ctx.Self())
	}
}

// HandleFailure implements actor.SupervisorStrategy: restart the crashed
// child, unless it keeps crashing, in which case the daemon stops with an
// error.
func (r *root) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, message any) {
	rs.Fail()
	n := rs.NumberOfFailures(r.d.settings.RestartWindow)
	log := r.d.log.With().Str("child", child.Id).Str("reason", fmt.Sprint(reason)).Int("failures", n).Logger()
	if n > r.d.settings.MaxRestarts {
		log.Error().Dur("window", r.d.settings.RestartWindow).Msg("child keeps crashing; escalating: the daemon stops")
		r.d.setErr(fmt.Errorf("actor %s crashed %d times within %v: %v", child.Id, n, r.d.settings.RestartWindow, reason))
		r.shutting, r.graceExpired = true, true
		sup.StopChildren(child)
		sys.Root.Stop(r.self)
		return
	}
	log.Error().Msg("child crashed; restarting it")
	sup.RestartChildren(child)
	// A child restarted during the shutdown is told again: its new
	// incarnation starts from scratch.
	if r.shutting {
		sys.Root.Send(child, &messages.Shutdown{})
		if r.graceExpired {
			sys.Root.Send(child, &messages.GraceExpired{})
		}
	}
}
