// Package ota owns over-the-air updates inside the daemon's actor tree: the
// ota_update command and auto-update towards the control plane's
// target_nymph_version.
//
// The actor never blocks in Receive. An update runs in a goroutine that
// checks whether the binary is already in place, otherwise downloads and
// installs it through the Installer (package nymph/daemon/selfupdate), and reports back.
// Then:
//
//   - on failure the running binary is untouched (the Installer guarantees
//     it), the reason is logged, and the daemon keeps polling;
//   - with the self-exec off, the new binary applies at the next restart and
//     nothing else changes;
//   - otherwise the actor records a handoff in State and asks the root for a
//     graceful shutdown bounded by the shutdown grace: polling stops,
//     in-flight execs and runs finish (or are killed and reported when the
//     grace ends) and their results are posted. The caller that waits for
//     the daemon (cmd/nymph) then flushes the outbox and execs the new
//     binary when State.Handoff says so — same PID, original arguments.
//
// Only one update runs at a time; another one arriving meanwhile is refused
// and logged. Auto-update ([runtime] auto_update) builds the command from
// the daemon's own control plane — <server>/v1/releases/<version>/<triple>
// and its .sha256 sidecar — and tries at most once per check interval,
// whatever the outcome, so a missing release or a bad checksum never turns
// into a download loop.
//
// Every update that ends is reported to the control plane as an
// ota.finished event (installed and when it applies, already running, or
// refused with a code and the reason), through the outbox, so it survives
// the exec of the new binary and a control plane that is briefly down.
//
// What must survive a crash of the actor (the update in progress, the last
// auto-update attempt, the handoff) lives in State.
package ota

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/poller"
	"nymph/daemon/selfupdate"
	"nymph/dist"
	"nymph/messages"
)

// Name is the actor's name under the root.
const Name = "ota"

// DefaultCheckInterval is auto_update_check_interval_s's default.
const DefaultCheckInterval = time.Hour

// Installer puts a new binary in place; *selfupdate.Updater satisfies it.
type Installer interface {
	Install(ctx context.Context, cmd messages.OtaUpdate) (selfupdate.Installed, error)
	// SelfExec reports whether the installed binary can replace this
	// process; if not, it applies at the next restart.
	SelfExec() bool
	// ExePath is the file Install replaces.
	ExePath() string
}

// Outcomes takes each update's outcome event and posts it durably (the
// outbox): it must reach the operator even when the daemon execs the new
// binary right after, or the control plane is down for a while.
type Outcomes interface {
	Event(e *messages.Event) error
}

// ChecksumFunc returns the sha256 published for the binary at binaryURL
// (its .sha256 sidecar); dist.FetchChecksum with a client fits.
type ChecksumFunc func(ctx context.Context, binaryURL string) (string, error)

// Settings are the actor's knobs.
type Settings struct {
	// Version is the running version (buildinfo.Version); a target equal
	// to it needs no update.
	Version string
	// Grace bounds the drain of in-flight work before the exec
	// ([runtime] shutdown_grace_s).
	Grace time.Duration
	// AutoUpdate follows target_nymph_version at most once per
	// CheckInterval (default DefaultCheckInterval).
	AutoUpdate    bool
	CheckInterval time.Duration
	// ServerURL is the control plane auto-update downloads from.
	ServerURL string
	// Triple is this host's release triple (dist.TripleForArch).
	Triple string
}

// Deps is everything the actor uses. It outlives every incarnation.
type Deps struct {
	Settings
	Installer Installer
	// Checksum reads a release's sidecar; required with AutoUpdate.
	Checksum ChecksumFunc
	State    *State
	Log      zerolog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// RunningImage is a path whose content is the program running now
	// (default /proc/self/exe, which still reads the old image after the
	// file was replaced).
	RunningImage string
	// Jobs counts update goroutines, so that the daemon's Wait lets a
	// download cancelled by the shutdown remove its temporary file before
	// the process exits or execs (default: a count of its own).
	Jobs *sync.WaitGroup
	// PropsOptions are added to the actor's props.
	PropsOptions []actor.PropsOption
	// Outcomes, when set, gets an ota.finished event for every update
	// that ends, installed or refused; WorkerID names the daemon in it.
	Outcomes Outcomes
	WorkerID func() string
}

// State is what survives the actor: the update in progress, the last
// auto-update attempt, and the handoff to the new binary. It is safe for
// concurrent use.
type State struct {
	mu        sync.Mutex
	seq       uint64
	busy      uint64 // seq of the update in progress, 0 if none
	cancel    context.CancelFunc
	lastCheck time.Time
	stopping  bool
	handoff   *selfupdate.Installed
	running   string // sha256 of the running image, once computed
}

// NewState returns the state of a daemon that has not updated yet.
func NewState() *State { return &State{} }

// Handoff reports the binary installed for an exec once the daemon has
// drained: when ok, the caller should exec it rather than exit.
func (s *State) Handoff() (selfupdate.Installed, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handoff == nil {
		return selfupdate.Installed{}, false
	}
	return *s.handoff, true
}

// Props returns the props of the OTA actor.
func Props(deps *Deps) *actor.Props {
	d := *deps
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.State == nil {
		d.State = NewState()
	}
	if d.CheckInterval <= 0 {
		d.CheckInterval = DefaultCheckInterval
	}
	if d.RunningImage == "" {
		d.RunningImage = "/proc/self/exe"
	}
	if d.Jobs == nil {
		d.Jobs = new(sync.WaitGroup)
	}
	return actor.PropsFromProducer(func() actor.Actor { return &otaActor{d: &d} }, d.PropsOptions...)
}

// Sources of an update, for the log.
const (
	sourceCommand = "ota_update"
	sourceAuto    = "auto_update"
)

// outcome of one update attempt, reported to the actor.
type outcome int

const (
	failed outcome = iota
	alreadyRunning
	alreadyInstalled
	installed
)

// done is the self-message an update goroutine ends with.
type done struct {
	seq     uint64
	source  string
	cmdID   string
	started time.Time
	cmd     messages.OtaUpdate
	result  outcome
	inst    selfupdate.Installed
	err     error
}

type otaActor struct {
	d *Deps
}

func (a *otaActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Dispatch:
		cmd, ok := m.Body.(*messages.OtaUpdate)
		if !ok {
			a.d.Log.Warn().Str("command_id", m.CommandID).Str("kind", m.Kind).Msg("ota: not an ota_update; skipped")
			return
		}
		a.command(ctx, m.CommandID, *cmd)
	case *poller.TargetVersion:
		a.target(ctx, m.Version)
	case *done:
		a.finish(ctx, m)
	case *messages.Shutdown:
		// Whoever stops the daemon — a signal, the idle policy or this
		// actor's own handoff — no new update starts, and a download still
		// running is abandoned (Install removes its temporary file).
		if cancel := a.d.State.stop(true); cancel != nil {
			cancel()
		}
	case *actor.Stopping:
		if cancel := a.d.State.stop(false); cancel != nil {
			cancel()
		}
	}
}

// stop returns the cancel of the update in progress, if any; stopping
// also refuses every update from now on.
func (s *State) stop(stopping bool) context.CancelFunc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stopping {
		s.stopping = true
	}
	return s.cancel
}

// command handles an ota_update from the control plane.
func (a *otaActor) command(ctx actor.Context, cmdID string, cmd messages.OtaUpdate) {
	log := a.d.Log.With().Str("command_id", cmdID).Str("source", sourceCommand).Str("version", cmd.Version).
		Str("url", dist.RedactURL(cmd.URL)).Logger()
	if err := selfupdate.Validate(cmd); err != nil {
		log.Warn().Err(err).Msg("ota_update refused; the running binary is unchanged and the daemon keeps polling")
		a.report(done{source: sourceCommand, cmdID: cmdID, cmd: cmd, err: err}, "")
		return
	}
	seq, ctxInstall, err := a.begin(log)
	if err != nil {
		a.report(done{source: sourceCommand, cmdID: cmdID, cmd: cmd, err: err}, "")
		return
	}
	log.Info().Str("sha256", strings.ToLower(cmd.SHA256)).Msg("ota_update accepted: installing")
	a.spawn(ctx, ctxInstall, seq, func(c context.Context) done {
		return a.apply(c, done{seq: seq, source: sourceCommand, cmdID: cmdID, cmd: cmd})
	})
}

// target handles the target_nymph_version of a poll response.
func (a *otaActor) target(ctx actor.Context, version string) {
	if !a.d.AutoUpdate || version == "" || version == a.d.Version {
		return
	}
	st := a.d.State
	now := a.d.Now()
	st.mu.Lock()
	due := st.lastCheck.IsZero() || now.Sub(st.lastCheck) >= a.d.CheckInterval
	idle := st.busy == 0 && !st.stopping
	if due && idle {
		// Counted when tried, not when it succeeds: a failing update is
		// retried no sooner than the interval.
		st.lastCheck = now
	}
	st.mu.Unlock()
	if !due || !idle {
		return
	}
	binURL := dist.URLFor(a.d.ServerURL, dist.DefaultPrefix, version, a.d.Triple)
	log := a.d.Log.With().Str("source", sourceAuto).Str("version", version).Str("url", dist.RedactURL(binURL)).Logger()
	if a.d.Checksum == nil || a.d.Triple == "" || a.d.ServerURL == "" {
		log.Warn().Msg("auto-update: no release source configured; not updating")
		return
	}
	seq, ctxInstall, err := a.begin(log)
	if err != nil {
		a.report(done{source: sourceAuto, started: now, cmd: messages.OtaUpdate{Version: version, URL: binURL}, err: err}, "")
		return
	}
	log.Info().Str("running", a.d.Version).Dur("next_check_in", a.d.CheckInterval).
		Msg("auto-update: the control plane's target differs from the running version; updating")
	a.spawn(ctx, ctxInstall, seq, func(c context.Context) done {
		d := done{seq: seq, source: sourceAuto, started: now, cmd: messages.OtaUpdate{Version: version, URL: binURL}}
		sum, err := a.d.Checksum(c, binURL)
		if err != nil {
			d.err = fmt.Errorf("auto-update: read the checksum of %s: %w", dist.RedactURL(binURL), err)
			return d
		}
		d.cmd.SHA256 = sum
		if err := selfupdate.Validate(d.cmd); err != nil {
			d.err = err
			return d
		}
		return a.apply(c, d)
	})
}

// errStopping refuses an update that arrives while the daemon stops.
var errStopping = errors.New("ota: the daemon is stopping")

// begin claims the single update slot; it logs and returns why not when an
// update is already running or the daemon is stopping.
func (a *otaActor) begin(log zerolog.Logger) (uint64, context.Context, error) {
	st := a.d.State
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.handoff != nil:
		log.Warn().Err(selfupdate.ErrBusy).Msg("update refused: a new binary is installed and the daemon is draining to exec it")
		return 0, nil, fmt.Errorf("%w: a new binary is installed and the daemon is draining to exec it", selfupdate.ErrBusy)
	case st.stopping:
		log.Warn().Msg("update refused: the daemon is stopping")
		return 0, nil, errStopping
	case st.busy != 0:
		log.Warn().Err(selfupdate.ErrBusy).Msg("update refused: another update is in progress")
		return 0, nil, selfupdate.ErrBusy
	}
	st.seq++
	st.busy = st.seq
	c, cancel := context.WithCancel(context.Background())
	st.cancel = cancel
	return st.seq, c, nil
}

func (a *otaActor) spawn(ctx actor.Context, c context.Context, seq uint64, work func(context.Context) done) {
	sys, self := ctx.ActorSystem(), ctx.Self()
	a.d.Jobs.Add(1)
	go func() {
		defer a.d.Jobs.Done()
		d := work(c)
		d.seq = seq
		sys.Root.Send(self, &d)
	}()
}

// apply installs cmd unless this binary already runs or is already in
// place. It runs in the update goroutine.
func (a *otaActor) apply(c context.Context, d done) done {
	want := strings.ToLower(d.cmd.SHA256)
	if sum, err := a.runningSum(); err == nil && sum == want {
		d.result = alreadyRunning
		return d
	}
	if sum, err := fileSum(a.d.Installer.ExePath()); err == nil && sum == want {
		d.result = alreadyInstalled
		d.inst = selfupdate.Installed{Version: d.cmd.Version, Path: a.d.Installer.ExePath(), SHA256: sum}
		return d
	}
	inst, err := a.d.Installer.Install(c, d.cmd)
	if err != nil {
		d.err = err
		return d
	}
	d.result, d.inst = installed, inst
	return d
}

// runningSum hashes the running image once per process.
func (a *otaActor) runningSum() (string, error) {
	st := a.d.State
	st.mu.Lock()
	sum := st.running
	st.mu.Unlock()
	if sum != "" {
		return sum, nil
	}
	sum, err := fileSum(a.d.RunningImage)
	if err != nil {
		return "", err
	}
	st.mu.Lock()
	st.running = sum
	st.mu.Unlock()
	return sum, nil
}

func (a *otaActor) finish(ctx actor.Context, d *done) {
	st := a.d.State
	st.mu.Lock()
	if d.seq != st.busy {
		st.mu.Unlock()
		return
	}
	st.busy, st.cancel = 0, nil
	stopping := st.stopping
	st.mu.Unlock()

	log := a.d.Log.With().Str("source", d.source).Str("version", d.cmd.Version).Logger()
	if d.cmdID != "" {
		log = log.With().Str("command_id", d.cmdID).Logger()
	}
	switch d.result {
	case failed:
		ev := log.Warn().Err(d.err)
		if d.source == sourceAuto {
			ev = ev.Dur("next_check_in", a.d.CheckInterval)
		}
		ev.Msg("update failed: the running binary is unchanged and the daemon keeps polling")
		a.report(*d, "")
		return
	case alreadyRunning:
		log.Info().Msg("update skipped: this binary is already running")
		a.report(*d, "")
		return
	}
	if !a.d.Installer.SelfExec() || stopping {
		a.report(*d, messages.OtaAppliesNextRestart)
	} else {
		a.report(*d, messages.OtaAppliesNow)
	}
	if !a.d.Installer.SelfExec() {
		msg := "new binary installed; self-exec is disabled, so it applies at the next restart"
		if d.result == alreadyInstalled {
			msg = "the new binary is already installed (no download); self-exec is disabled, so it applies at the next restart"
		}
		log.Info().Str("path", d.inst.Path).Msg(msg)
		return
	}
	if d.result == alreadyInstalled {
		log.Info().Str("path", d.inst.Path).Msg("the new binary is already installed; no download needed")
	}
	if stopping {
		log.Info().Str("path", d.inst.Path).Msg("new binary installed while the daemon stops; it runs at the next start")
		return
	}
	st.mu.Lock()
	inst := d.inst
	st.handoff = &inst
	st.mu.Unlock()
	log.Info().Str("path", d.inst.Path).Dur("grace", a.d.Grace).
		Msg("new binary installed: no new work; draining in-flight execs and runs before exec")
	ctx.Send(ctx.Parent(), &messages.Shutdown{Grace: a.d.Grace})
}

// report hands an update's outcome to the outbox: refused when d.err is
// set, else what d.result says; applies is when an installed binary runs.
// The outcome of an ota_update belongs to its command; that of an
// auto-update to messages.AutoUpdateEventID of its start.
func (a *otaActor) report(d done, applies string) {
	if a.d.Outcomes == nil {
		return
	}
	o := messages.OtaOutcome{Source: d.source, Version: d.cmd.Version, SHA256: strings.ToLower(d.cmd.SHA256)}
	switch {
	case d.err != nil || d.result == failed:
		o.Outcome, o.Code = messages.OtaRefused, refusalCode(d.err)
		reason := "unknown"
		if d.err != nil {
			reason = d.err.Error()
		}
		o.Reason = &reason
	case d.result == alreadyRunning:
		o.Outcome = messages.OtaAlreadyRunning
	default:
		o.Outcome, o.Applies = messages.OtaInstalled, applies
	}
	id := d.cmdID
	if d.source == sourceAuto {
		id = messages.AutoUpdateEventID(d.cmd.Version, d.started)
	}
	wid := ""
	if a.d.WorkerID != nil {
		wid = a.d.WorkerID()
	}
	ev, err := messages.NewEvent(id, messages.EventOtaFinished, wid, &o, a.d.Now())
	if err == nil {
		err = a.d.Outcomes.Event(ev)
	}
	if err != nil {
		a.d.Log.Error().Err(err).Str("version", d.cmd.Version).Msg("update outcome not stored for posting")
	}
}

// refusalCode names why an update was refused, for the operator.
func refusalCode(err error) string {
	switch {
	case errors.Is(err, selfupdate.ErrChecksumMismatch):
		return messages.OtaCodeChecksumMismatch
	case errors.Is(err, selfupdate.ErrInvalidCommand):
		return messages.OtaCodeInvalidCommand
	case errors.Is(err, selfupdate.ErrNotExecutable):
		return messages.OtaCodeNotExecutable
	case errors.Is(err, selfupdate.ErrBusy):
		return messages.OtaCodeBusy
	case errors.Is(err, errStopping):
		return messages.OtaCodeStopping
	}
	return messages.OtaCodeFailed
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("ota: hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("ota: hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
