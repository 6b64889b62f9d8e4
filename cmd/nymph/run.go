package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/ledger"
	"nymph/actors/metrics"
	"nymph/actors/ota"
	"nymph/actors/poller"
	"nymph/buildinfo"
	"nymph/config"
	"nymph/daemon/hostinfo"
	"nymph/daemon/orphans"
	"nymph/daemon/outbox"
	"nymph/daemon/uplink"
	"nymph/daemon/workdirlock"
	"nymph/gopool"
	"nymph/identity"
	"nymph/messages"
	"nymph/runners"
	"nymph/timerslack"
)

// outboxFlush bounds the last attempt to post pending results at exit;
// what is left stays in the workdir for the next start.
const outboxFlush = 10 * time.Second

// recoveredFlush bounds the wait at start for the outcomes of the jobs a
// dead process left to be posted.
const recoveredFlush = 10 * time.Second

func runDaemon(ctx context.Context, configPath, queueFlag string) error {
	cfg, err := config.Load(configPath)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	cfg.ResolveQueue(queueFlag, os.Getenv(config.EnvQueue))
	log := newLogger(cfg.Log.Level, cfg.Log.Format, os.Stderr)
	for _, w := range cfg.Warnings {
		log.Warn().Msg(w)
	}
	capProcs(cfg.Runtime.MaxProcs, os.Getenv("GOMAXPROCS"), log)
	if n, err := timerslack.Coarsen(time.Duration(cfg.Runtime.TimerSlackUS) * time.Microsecond); err != nil {
		log.Info().Err(err).Msg("timer slack left as the kernel's")
	} else if n > 0 {
		log.Debug().Int("timer_slack_us", cfg.Runtime.TimerSlackUS).Int("threads", n).Msg("timer slack set")
	}
	if err := os.MkdirAll(cfg.Runtime.Workdir, 0o755); err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("[runtime] workdir: %w", err)}
	}
	// One daemon per workdir, before anything else touches it: a second
	// one would sweep the first one's jobs as orphans and share its outbox.
	lock, err := workdirlock.Acquire(cfg.Runtime.Workdir)
	if err != nil {
		return &exitError{code: exitFailed, err: err}
	}
	defer lock.Release()
	// Jobs left running by a previous incarnation that died without
	// stopping them (SIGKILL, OOM) carry this workdir's mark: end them
	// before anything new starts, then mark this process for the next time.
	// Holding the lock, this process knows that incarnation is dead.
	marker := orphans.Marker(cfg.Runtime.Workdir)
	if killed, err := orphans.Reap("/proc", marker); err != nil {
		log.Warn().Err(err).Msg("could not look for processes left by a previous run")
	} else if len(killed) > 0 {
		log.Warn().Ints("pids", killed).Msg("killed processes left running by a previous run of this daemon")
	}
	if err := orphans.Mark(marker); err != nil {
		return &exitError{code: exitFailed, err: err}
	}
	// Runners put the mark on containers and jobs, which live outside this
	// process tree, so the sweep above cannot reach them; each runner ends
	// its own.
	registry := runnerRegistry(cfg.Runtime.Runners, cfg.Runners, marker, log)
	kinds := ordered(cfg.Runtime.Runners, slices.Sorted(maps.Keys(registry)))
	reapLeftovers(ctx, kinds, registry, marker, log)

	probe := hostinfo.New()
	machineID, err := probe.MachineID(cfg.Daemon.MachineID)
	if err != nil {
		return &exitError{code: exitFailed, err: err}
	}
	if _, missing := available(kinds, cfg.Runners, exec.LookPath); len(missing) > 0 {
		for _, k := range slices.Sorted(maps.Keys(missing)) {
			log.Warn().Str("runner", k).Err(missing[k]).Msg("runner configured but its executable is missing; not advertised until it is found")
		}
	}
	reprobe := func(context.Context) messages.Capabilities {
		caps := probe.Capabilities(kinds, cfg.Runtime.MaxInvocations, cfg.Runtime.Workdir)
		// What this host can run depends on the configured executables
		// ([runners.<kind>]), not on the default names.
		caps.Runners, _ = available(kinds, cfg.Runners, exec.LookPath)
		return caps
	}
	versions := probe.Versions(ctx, buildinfo.Version)
	hello := messages.HelloRequest{
		MachineID:    machineID,
		Label:        cfg.Daemon.Label,
		Tags:         hostinfo.Tags(cfg.Daemon.Tags, versions),
		Lanes:        cfg.Daemon.Lanes,
		Capabilities: reprobe(ctx),
		Versions:     versions,
		Incarnation:  hostinfo.NewIncarnation(), // once per process: every re-hello reuses it
		// keep_alive_s = 0 takes one job: our control plane then hands
		// this daemon no other.
		SingleJob: cfg.Runtime.KeepAliveS == 0,
	}

	opts := []uplink.Option{}
	if cfg.Server.TokenFile != "" {
		opts = append(opts, uplink.WithTokenFile(cfg.Server.TokenFile))
	}
	if cfg.Server.CAFile != "" {
		opts = append(opts, uplink.WithCAFile(cfg.Server.CAFile))
	}
	holder, idOpts, err := identityWiring(cfg, log)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	opts = append(opts, idOpts...)
	client, err := uplink.New(cfg.Server.URL, opts...)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	// One pool of goroutines for the actor tree and the result deliveries
	// (package gopool); it outlives both.
	pool := gopool.New(actors.IdleGoroutines)
	defer pool.Close()
	box, err := outbox.Open(filepath.Join(cfg.Runtime.Workdir, "outbox"), client, log, outbox.WithGoroutines(pool))
	if err != nil {
		return &exitError{code: exitFailed, err: err}
	}
	// The jobs the dead incarnation was running (ended above) get their
	// outcome now: "the daemon restarted, outcome unknown".
	recovered, err := box.Recover()
	if err != nil {
		log.Error().Err(err).Msg("could not read the job journal; jobs a previous run left are not reported")
	}
	if cfg.Runtime.KeepAliveS == 0 && len(recovered) > 0 {
		// A single-job daemon takes exactly one job: the dead process had
		// taken it, so this one reports it and exits, whatever the wait.
		return finishSingleJob(ctx, box, recovered, log)
	}
	if len(recovered) > 0 {
		// Before hello: the daemon's own account of an interrupted job
		// ("restarted, outcome unknown") reaches the control plane before
		// the new process shows itself, whatever the control plane makes
		// of a worker that comes back without its jobs. Bounded, so an
		// unreachable control plane delays the start, never blocks it.
		flushCtx, cancel := context.WithTimeout(ctx, recoveredFlush)
		if err := box.Flush(flushCtx); err != nil {
			log.Warn().Err(err).Msg("interrupted jobs' outcomes not posted yet; they are retried in the background")
		}
		cancel()
	}

	keepAlive := time.Duration(cfg.Runtime.KeepAliveS) * time.Second
	if cfg.Runtime.KeepAliveS < 0 {
		keepAlive = -1
	}
	settings := actors.Settings{
		Poll: poller.Settings{
			Hello:          hello,
			ProvisionalID:  hostinfo.ProvisionalWorkerID(machineID),
			Queue:          cfg.Daemon.Queue,
			WaitMax:        seconds(cfg.Poll.WaitMaxS),
			MaxInvocations: cfg.Runtime.MaxInvocations,
			KeepAlive:      keepAlive,
		},
		RetryMin:      seconds(cfg.Poll.RetryMinS),
		RetryMax:      seconds(cfg.Poll.RetryMaxS),
		Workdir:       cfg.Runtime.Workdir,
		DefaultRunner: cfg.Runtime.DefaultRunner,
		Metrics: actors.MetricsSettings{
			Textfile: cfg.Metrics.Textfile, Interval: seconds(cfg.Metrics.IntervalS), Version: buildinfo.Version,
		},
	}
	grace := seconds(cfg.Runtime.ShutdownGraceS)
	updater, otaDeps, err := otaWiring(cfg, grace, log)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	// One count for jobs, update downloads and key rotations: the
	// daemon's Wait waits for all of them.
	jobs := new(sync.WaitGroup)
	otaDeps.Jobs = jobs
	// The daemon's poller state, once it is built; rotate_key comes only
	// after hello, long after.
	var state *poller.State
	// Update outcomes go through the outbox: one that installs is posted
	// before the exec, or by the new binary from the workdir.
	otaDeps.Outcomes, otaDeps.WorkerID = box, func() string { return state.WorkerID() }
	keysOpt := keysChild(holder, client, cfg, func() string { return state.WorkerID() }, jobs, log)
	d, err := actors.New(settings, actors.Deps{
		Server: loggingServer{Client: client, log: log}, Results: box, Journal: box, Backlog: box, Runners: registry, Reprobe: reprobe, Log: log,
		Jobs: jobs, Goroutines: pool,
	}, actors.WithChild(ota.Name, ota.Props(otaDeps), messages.KindOtaUpdate), keysOpt)
	if err != nil {
		return &exitError{code: exitUsage, err: err}
	}
	// A recovered job was reported; a redelivery of its command (the dead
	// process had not acknowledged it) must not run it again.
	for _, e := range recovered {
		d.Ledger().MarkDone(ledger.Kind(e.Kind), e.ID)
		// This process reported it: it counts among this process's outcomes.
		d.Metrics().JobFinished(e.Kind, metrics.OutcomeLost)
	}
	state = d.PollerState()
	log.Info().Str("version", buildinfo.Version).Str("server", cfg.Server.URL).Str("machine_id", machineID).
		Str("queue", cfg.Daemon.Queue).Strs("runners", hello.Capabilities.Runners).Msg("nymph starting")
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	if err := d.Start(); err != nil {
		return &exitError{code: exitFailed, err: err}
	}

	var signalled atomic.Bool // a signal wins over an update's exec
	go func() {
		n := 0
		for {
			select {
			case s := <-sigs:
				n++
				signalled.Store(true)
				switch n {
				case 1:
					log.Info().Str("signal", s.String()).Dur("grace", grace).Msg("stopping: running work gets the shutdown grace")
					d.Shutdown(grace)
				case 2:
					log.Warn().Str("signal", s.String()).Msg("second signal: stopping now")
					d.StopNow()
				default:
					log.Error().Str("signal", s.String()).Msg("third signal: exiting without reporting")
					os.Exit(exitFailed)
				}
			case <-d.Done():
				return
			}
		}
	}()

	runErr := d.Wait(context.Background())
	flushCtx, cancel := context.WithTimeout(context.Background(), outboxFlush)
	defer cancel()
	if err := box.Close(flushCtx); err != nil {
		log.Warn().Err(err).Msg("results left for the next start")
	}
	if tf := d.Textfile(); tf != nil {
		// The writer's last word came before the outbox was closed: this
		// one says what it left for the next start.
		_ = tf.Write()
	}
	if runErr == nil {
		if err := handOff(updater, otaDeps.State, signalled.Load(), lock, log); err != nil {
			return &exitError{code: exitFailed, err: err}
		}
	}
	var rej *actors.RejectError
	switch {
	case errors.As(runErr, &rej):
		log.Error().Str("code", rej.Code).Str("message", rej.Message).Msg("the control plane rejected this daemon")
		return &exitError{code: exitRejected, err: runErr}
	case runErr != nil:
		log.Error().Err(runErr).Msg("daemon failed")
		return &exitError{code: exitFailed, err: runErr}
	}
	log.Info().Msg("nymph stopped")
	return nil
}

// finishSingleJob posts the outcomes of the jobs a dead single-job daemon
// process left (its one job, and refusals it had not posted yet) and returns
// once they are stored by the control plane, or at a signal, when they stay
// in the outbox for a later start.
func finishSingleJob(ctx context.Context, box *outbox.Outbox, recovered []outbox.JournalEntry, log zerolog.Logger) error {
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ids := make([]string, 0, len(recovered))
	for _, e := range recovered {
		ids = append(ids, e.Kind+" "+e.ID)
	}
	log.Warn().Strs("jobs", ids).Msg("single-job daemon restarted: its job was taken by the previous process, which died; reporting it as interrupted and exiting without taking another")
	err := box.Flush(ctx)
	closeCtx, cancel := context.WithTimeout(context.Background(), outboxFlush)
	defer cancel()
	if cerr := box.Close(closeCtx); err == nil {
		err = cerr
	}
	if err != nil {
		log.Warn().Err(err).Msg("interrupted job's outcome left for the next start")
		return &exitError{code: exitFailed, err: err}
	}
	log.Info().Msg("nymph stopped")
	return nil
}

// leftoverReaper is a runner whose work can outlive a killed daemon outside
// its process tree (a container, a SLURM job) and that can end what a
// previous run of the daemon marked marker left behind.
type leftoverReaper interface {
	ReapLeftovers(ctx context.Context, marker string) (int, error)
}

// leftoverTimeout bounds the start-up sweep, so an unreachable
// engine or controller delays the start, never blocks it.
const leftoverTimeout = 30 * time.Second

// reapLeftovers has every runner in kinds that can, end the work a previous
// run of this daemon left behind, all at once, and returns when all are
// done: before any new work, which carries the same mark. Failures are
// logged: a runner's tool may be missing on this host, and the daemon must
// start anyway.
func reapLeftovers(ctx context.Context, kinds []string, registry map[string]runners.Runner, marker string, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, leftoverTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, k := range kinds {
		r, ok := registry[k].(leftoverReaper)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := r.ReapLeftovers(ctx, marker)
			if err != nil {
				log.Warn().Str("runner", k).Err(err).Msg("could not end all containers or jobs left by a previous run")
			}
			if n > 0 {
				log.Warn().Str("runner", k).Int("count", n).Msg("ended containers or jobs left running by a previous run of this daemon")
			} else if err == nil {
				log.Info().Str("runner", k).Int("count", 0).Msg("no containers or jobs left by a previous run")
			}
		}()
	}
	wg.Wait()
}

// ordered keeps the config's order of the kinds the registry has.
func ordered(configured, have []string) []string {
	var out []string
	for _, k := range configured {
		if slices.Contains(have, k) {
			out = append(out, k)
		}
	}
	return out
}

// The implementations chosen here satisfy what the tree declares it needs.
var (
	_ actors.Server  = (*uplink.Client)(nil)
	_ actors.Results = (*outbox.Outbox)(nil)
	_ ota.Outcomes   = (*outbox.Outbox)(nil)
	_ actors.Journal = (*outbox.Outbox)(nil)
	_ outbox.Poster  = (*uplink.Client)(nil)
	_ uplink.Signer  = (*identity.Key)(nil)
)

// capProcs applies [runtime] max_procs, unless $GOMAXPROCS (env) already
// chose; it never raises what the runtime chose (a cgroup's CPU limit).
func capProcs(maxProcs int, env string, log zerolog.Logger) {
	if maxProcs <= 0 || env != "" {
		return
	}
	if n := runtime.GOMAXPROCS(0); maxProcs < n {
		runtime.GOMAXPROCS(maxProcs)
		log.Debug().Int("gomaxprocs", maxProcs).Int("cpus", n).Msg("Go runtime capped to [runtime] max_procs")
	}
}
