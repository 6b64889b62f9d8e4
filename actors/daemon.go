// Package actors owns the nymph daemon's actor tree (protoactor-go):
//
//	nymph (root supervisor, OneForOne)
//	├── poller        hello, long-poll, backoff, cursor, hibernate, idle policy
//	├── setup         serial FIFO of setup scripts (package setupqueue)
//	├── execs         one child per exec (package execs)
//	├── invocations   one child per run (package invocations)
//	├── metrics       the metrics textfile's writer, when one is configured
//	└── …             extra children added with WithChild (OTA, keys)
//
// The root restarts a crashed child and respawns a stopped one, under a
// name of its own ("poller~2"; Child finds the current one); a child that
// crashes more than MaxRestarts times within RestartWindow escalates: the
// daemon stops with an error and exits non-zero, for the service manager to
// restart it fresh. The root also routes the commands the poller decodes,
// takes every job's end notice (jobs outlive their parent's incarnation,
// so they report to the root, which passes the notice to the current
// parent) and wakes the poller then, and runs the shutdown: Shutdown{grace}
// stops polling and lets running work finish; a scheduler timer sends
// GraceExpired, after which running work is killed and reported; when
// nothing is left the root stops itself, and Done is closed.
//
// State that must survive crashes lives outside the actors: the ledger (jobs
// and exactly-once reporting), the setup FIFO, the poller's State and the
// metrics Recorder (which every actor that counts something is given).
package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/execs"
	"nymph/actors/invocations"
	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/actors/metrics"
	"nymph/actors/poller"
	"nymph/actors/setupqueue"
	"nymph/gopool"
	"nymph/messages"
	"nymph/runners"
)

// Names of the root and its children.
const (
	RootName        = "nymph"
	PollerName      = "poller"
	SetupName       = "setup"
	ExecsName       = "execs"
	InvocationsName = "invocations"
)

// Settings are the daemon's knobs, resolved from the config by the caller.
type Settings struct {
	// Poll holds the hello request, queue, wait, permits and idle policy.
	Poll               poller.Settings
	RetryMin, RetryMax time.Duration
	// Workdir is where execs run by default and where scratch lives.
	Workdir       string
	DefaultRunner string
	// KillGrace is the exec settle grace between SIGTERM and SIGKILL.
	KillGrace time.Duration
	// Namespace is used to presign payload downloads (default "default").
	Namespace string
	// MaxRestarts within RestartWindow before a crashing child escalates
	// (defaults 10 and 1 minute).
	MaxRestarts   int
	RestartWindow time.Duration
	// StopTimeout bounds the wait for reports after GraceExpired (default 10 s).
	StopTimeout time.Duration
	// Metrics, when its Textfile is set, has the tree write its metrics there.
	Metrics MetricsSettings
}

// MetricsSettings configure the metrics textfile (see package metrics).
type MetricsSettings struct {
	// Textfile is the file written (ending in .prom); empty writes none.
	Textfile string
	// Interval is the time between two writes (default 5 s, at least 1 s).
	Interval time.Duration
	// Version labels nymph_build_info.
	Version string
}

// Server is the control plane client the tree uses.
type Server interface {
	poller.Server
	execs.Server
	invocations.EventPoster
}

// Results takes finished results durably (the outbox): exec results, run
// acks, and events (setup outcomes, run output left over at a run's end).
type Results interface {
	execs.Results
	invocations.Acks
	setupqueue.Outcomes
}

// Journal records each exec and run durably before it is spawned (the
// outbox's job journal).
type Journal interface {
	jobparent.Journal
}

// Deps are the implementations the caller chose.
type Deps struct {
	Server  Server
	Results Results
	// Journal records jobs before they run, so a start after a crash can
	// report the ones that were running; nil journals nothing.
	Journal Journal
	// Backlog counts the results not posted yet (the outbox), for the
	// metrics; nil leaves that number out.
	Backlog metrics.Backlog
	// Runners maps a runner kind to its implementation; setups use
	// Runners["process"].
	Runners map[string]runners.Runner
	// Reprobe returns the host's capabilities (after a setup asks for it).
	Reprobe func(ctx context.Context) messages.Capabilities
	Log     zerolog.Logger
	// Rand is the backoff jitter source (default math/rand).
	Rand func() float64
	// Now is the clock (default time.Now).
	Now func() time.Time
	// BaseEnv is the environment execs inherit (default os.Environ()).
	BaseEnv []string
	// Jobs is the one count of background goroutines that Wait waits
	// for: the tree's jobs and setups, and those of every extra child
	// given the same count (OTA downloads, key rotations). Default: a
	// count of the tree's own.
	Jobs *sync.WaitGroup
	// Goroutines runs the tree's short-lived goroutines (mailbox runs,
	// polls, jobs) on goroutines used again (package gopool). Default: a
	// pool of the tree's own, closed by Wait.
	Goroutines *gopool.Pool
}

// Option adds to the tree.
type Option func(*options)

type extraChild struct {
	name  string
	props *actor.Props
	kinds []string
}

type options struct {
	extras    []extraChild
	propsOpts []actor.PropsOption
}

// WithChild adds a child to the root: it is spawned, supervised and
// respawned like the others, receives every command of the given kinds as a
// *messages.Dispatch, and gets Shutdown and GraceExpired. This is how the
// OTA actor (ota_update) and the keys actor (rotate_key) plug in. The child
// that takes ota_update also gets each *poller.TargetVersion, and may ask for
// a graceful stop by sending *messages.Shutdown to its parent (the OTA
// actor drains in-flight work that way before the new binary is exec'd).
func WithChild(name string, props *actor.Props, kinds ...string) Option {
	return func(o *options) { o.extras = append(o.extras, extraChild{name: name, props: props, kinds: kinds}) }
}

// WithPropsOptions adds props options (receiver middleware, say) to every
// actor of the tree.
func WithPropsOptions(opts ...actor.PropsOption) Option {
	return func(o *options) { o.propsOpts = append(o.propsOpts, opts...) }
}

// RejectError is returned by Wait when the control plane rejected hello.
type RejectError struct {
	Code    string
	Message string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("hello rejected: %s: %s", e.Code, e.Message)
}

// Daemon is one running actor tree.
type Daemon struct {
	settings Settings
	deps     Deps
	opts     options
	log      zerolog.Logger

	system *actor.ActorSystem
	ledger *ledger.Ledger
	fifo   *setupqueue.FIFO
	state  *poller.State
	rec    *metrics.Recorder
	// textfile is nil unless Settings.Metrics.Textfile is set.
	textfile *metrics.Textfile

	pollerDeps      *poller.Deps
	setupDeps       *setupqueue.Deps
	execDeps        *execs.Deps
	invocationsDeps *invocations.Deps
	writerDeps      *metrics.WriterDeps

	// ownPool: deps.Goroutines was made by New, and Wait closes it.
	ownPool bool

	mu      sync.Mutex
	rootPID *actor.PID
	kids    map[string]*actor.PID
	done    chan struct{}
	err     error
}

// New builds a daemon; Start runs it.
func New(s Settings, d Deps, opts ...Option) (*Daemon, error) {
	if d.Server == nil || d.Results == nil {
		return nil, errors.New("actors: Server and Results are required")
	}
	if _, ok := d.Runners[s.DefaultRunner]; !ok {
		return nil, fmt.Errorf("actors: default runner %q is not in the runner registry", s.DefaultRunner)
	}
	if _, ok := d.Runners["process"]; !ok {
		return nil, errors.New("actors: the process runner is required (setup runs through it)")
	}
	if s.Workdir == "" {
		return nil, errors.New("actors: Workdir is required")
	}
	if s.Namespace == "" {
		s.Namespace = "default"
	}
	if s.MaxRestarts <= 0 {
		s.MaxRestarts = 10
	}
	if s.RestartWindow <= 0 {
		s.RestartWindow = time.Minute
	}
	if s.StopTimeout <= 0 {
		s.StopTimeout = 10 * time.Second
	}
	if d.Rand == nil {
		d.Rand = rand.Float64
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.BaseEnv == nil {
		d.BaseEnv = os.Environ()
	}
	if d.Jobs == nil {
		d.Jobs = new(sync.WaitGroup)
	}
	ownPool := d.Goroutines == nil
	if ownPool {
		d.Goroutines = gopool.New(IdleGoroutines)
	}
	// Every actor of the tree runs its mailbox on the pool: the default
	// dispatcher starts a goroutine per burst of messages.
	o := options{propsOpts: []actor.PropsOption{actor.WithDispatcher(poolDispatcher{d.Goroutines})}}
	for _, opt := range opts {
		opt(&o)
	}
	dm := &Daemon{settings: s, deps: d, opts: o, log: d.Log, done: make(chan struct{}), ownPool: ownPool}
	dm.ledger = ledger.New(d.Now)
	dm.fifo = setupqueue.NewFIFO()
	dm.state = poller.NewState(s.RetryMin, s.RetryMax, d.Rand, d.Now())
	dm.rec = metrics.NewRecorder()
	dm.rec.Known(metrics.KindExec, append(execs.Outcomes(), metrics.OutcomeLost)...)
	dm.rec.Known(metrics.KindRun, append(invocations.States(), metrics.OutcomeLost)...)
	dm.rec.Known(metrics.KindSetup, messages.StateSucceeded, messages.StateFailed)
	if m := s.Metrics; m.Textfile != "" {
		tf, err := metrics.NewTextfile(m.Textfile, metrics.Sources{
			Recorder: dm.rec, Jobs: running{dm.ledger, dm.fifo}, Backlog: d.Backlog, Worker: dm.state,
			Label: s.Poll.Hello.Label, MachineID: s.Poll.Hello.MachineID, Version: m.Version,
		}, d.Log.With().Str("actor", metrics.Name).Logger())
		if err != nil {
			return nil, fmt.Errorf("actors: %w", err)
		}
		if m.Interval <= 0 {
			m.Interval = 5 * time.Second
		}
		dm.textfile = tf
		dm.writerDeps = &metrics.WriterDeps{Textfile: tf, Interval: m.Interval, Jobs: d.Jobs, PropsOptions: o.propsOpts}
	}

	protoLog := d.Log.With().Str("component", "protoactor").Logger()
	dm.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(zerolog.NewSlogHandler(protoLog))
	}))

	dm.pollerDeps = &poller.Deps{
		Settings: s.Poll, Server: d.Server, State: dm.state, Ledger: dm.ledger, Setups: dm.fifo, Metrics: dm.rec,
		Log: d.Log.With().Str("actor", PollerName).Logger(), Now: d.Now, PropsOptions: o.propsOpts, Goroutines: d.Goroutines,
	}
	dm.setupDeps = &setupqueue.Deps{
		FIFO: dm.fifo, Runner: d.Runners["process"], Workdir: s.Workdir, Reprobe: d.Reprobe, Sink: dm.state,
		Outcomes: d.Results, WorkerID: dm.state.WorkerID, Metrics: dm.rec,
		Log: d.Log.With().Str("actor", SetupName).Logger(), Jobs: d.Jobs, PropsOptions: o.propsOpts,
	}
	wiring := func(name string) jobparent.Wiring {
		return jobparent.Wiring{Ledger: dm.ledger, Journal: d.Journal, Log: d.Log.With().Str("actor", name).Logger(), Jobs: d.Jobs,
			PropsOptions: o.propsOpts, Finished: dm.system.NewLocalPID(RootName), Goroutines: d.Goroutines}
	}
	dm.execDeps = &execs.Deps{
		Wiring: wiring(ExecsName),
		Shell: &execs.Shell{Workdir: s.Workdir, KillGrace: s.KillGrace, Namespace: s.Namespace, BaseEnv: d.BaseEnv,
			Server: d.Server, Log: d.Log.With().Str("actor", ExecsName).Logger()},
		Results: d.Results, Metrics: dm.rec,
	}
	dm.invocationsDeps = &invocations.Deps{
		Wiring:  wiring(InvocationsName),
		Runners: d.Runners, DefaultRunner: s.DefaultRunner, Workdir: s.Workdir,
		Acks: d.Results, WorkerID: dm.state.WorkerID, Payloads: d.Server, Namespace: s.Namespace,
		Events: d.Server, Leftovers: d.Results, Metrics: dm.rec,
	}
	return dm, nil
}

// Start spawns the root supervisor, which spawns the tree and says hello.
func (d *Daemon) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rootPID != nil {
		return errors.New("actors: daemon already started")
	}
	props := actor.PropsFromProducer(func() actor.Actor { return newRoot(d) }, d.opts.propsOpts...)
	pid, err := d.system.Root.SpawnNamed(props, RootName)
	if err != nil {
		return fmt.Errorf("actors: spawn root: %w", err)
	}
	d.rootPID = pid
	return nil
}

// Shutdown starts a graceful stop: no more polls, running work gets grace,
// then it is killed and reported.
func (d *Daemon) Shutdown(grace time.Duration) {
	d.send(&messages.Shutdown{Grace: grace})
}

// StopNow ends the grace at once: running work is killed and reported, and
// the daemon stops.
func (d *Daemon) StopNow() {
	d.send(&messages.GraceExpired{})
}

func (d *Daemon) send(msg any) {
	d.mu.Lock()
	pid := d.rootPID
	d.mu.Unlock()
	if pid != nil {
		d.system.Root.Send(pid, msg)
	}
}

// Done is closed when the root has stopped.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// Wait blocks until the root has stopped and every goroutine Deps.Jobs
// counts has ended — each job has handed its result over, each key
// rotation written its key (or ctx ends) — shuts the actor system down, and returns
// why the daemon stopped: nil, a *RejectError, or an escalated crash.
func (d *Daemon) Wait(ctx context.Context) error {
	select {
	case <-d.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	jobs := make(chan struct{})
	go func() {
		d.deps.Jobs.Wait()
		close(jobs)
	}()
	select {
	case <-jobs:
	case <-ctx.Done():
		return ctx.Err()
	}
	d.system.Shutdown()
	if d.ownPool {
		d.deps.Goroutines.Close()
	}
	return d.Err()
}

// Err is why the daemon stopped, once Done is closed.
func (d *Daemon) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

func (d *Daemon) setErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		d.err = err
	}
}

// System is the actor system (for tests and extra children).
func (d *Daemon) System() *actor.ActorSystem { return d.system }

// PID addresses an actor of the tree by its path under the root, for
// example PID(ExecsName, execs.ChildName(id)), as first spawned; Child
// follows a respawned child.
func (d *Daemon) PID(path ...string) *actor.PID {
	id := RootName
	for _, p := range path {
		id += "/" + p
	}
	return d.system.NewLocalPID(id)
}

// Child is the current incarnation of one of the root's children
// (PollerName, SetupName, ExecsName, InvocationsName or an extra), or nil
// while it is being replaced. A respawned child has a name of its own, so
// this, not PID, finds it.
func (d *Daemon) Child(name string) *actor.PID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.kids[name]
}

func (d *Daemon) setChild(name string, pid *actor.PID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.kids == nil {
		d.kids = map[string]*actor.PID{}
	}
	if pid == nil {
		delete(d.kids, name)
		return
	}
	d.kids[name] = pid
}

// Ledger is the job bookkeeping (read-only use outside the tree).
func (d *Daemon) Ledger() *ledger.Ledger { return d.ledger }

// SetupQueue is the setup FIFO.
func (d *Daemon) SetupQueue() *setupqueue.FIFO { return d.fifo }

// PollerState is the poller's surviving state.
func (d *Daemon) PollerState() *poller.State { return d.state }

// Metrics is the daemon's Recorder: what the tree counted, for a caller
// that counts something of its own (the jobs a start reports as lost).
func (d *Daemon) Metrics() *metrics.Recorder { return d.rec }

// Textfile is the metrics file's writer, or nil when none is configured.
// Once Wait has returned, a caller may Write it once more, after what it
// does last (closing the outbox).
func (d *Daemon) Textfile() *metrics.Textfile { return d.textfile }

// running answers metrics.Jobs from the ledger and the setup FIFO.
type running struct {
	ledger *ledger.Ledger
	fifo   *setupqueue.FIFO
}

var _ metrics.Jobs = running{}

// Running counts jobs accepted and not reported yet: an exec or run holds
// its permit from its dispatch, a setup runs one at a time.
func (r running) Running(kind string) int {
	switch kind {
	case metrics.KindExec:
		return r.ledger.Active(ledger.Exec)
	case metrics.KindRun:
		return r.ledger.Active(ledger.Run)
	case metrics.KindSetup:
		if r.fifo.Busy() {
			return 1
		}
	}
	return 0
}
