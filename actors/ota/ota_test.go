package ota_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/ota"
	"nymph/actors/poller"
	"nymph/daemon/outbox"
	"nymph/daemon/selfupdate"
	"nymph/daemon/uplink"
	"nymph/dist"
	"nymph/lakeshore/releases"
	"nymph/messages"
	"nymph/runners"
	"nymph/runners/process"
	"nymph/test/fakeclock"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

// logBuf keeps the daemon's log for assertions and mirrors it to t.Log
// until the test ends.
type logBuf struct {
	mu   sync.Mutex
	t    testing.TB
	live bool
	buf  bytes.Buffer
}

func newLogBuf(t testing.TB) *logBuf {
	l := &logBuf{t: t, live: true}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.live = false
	})
	return l
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.live {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (l *logBuf) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), sub)
}

// targetServer adds a target_nymph_version to every poll response, as the
// control plane does.
type targetServer struct {
	*uplink.Client
	target atomic.Pointer[string]
}

func (s *targetServer) Poll(ctx context.Context, req *messages.PollRequest) (*messages.PollResponse, error) {
	resp, err := s.Client.Poll(ctx, req)
	if err == nil {
		resp.TargetNymphVersion = s.target.Load()
	}
	return resp, err
}

// fakeInstaller records what it is asked to install; gate, when set, holds
// each Install until it is closed.
type fakeInstaller struct {
	mu       sync.Mutex
	calls    []messages.OtaUpdate
	exe      string
	selfExec bool
	err      error
	gate     chan struct{}
}

func (f *fakeInstaller) Install(ctx context.Context, cmd messages.OtaUpdate) (selfupdate.Installed, error) {
	f.mu.Lock()
	f.calls = append(f.calls, cmd)
	gate, err := f.gate, f.err
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return selfupdate.Installed{}, ctx.Err()
		}
	}
	if err != nil {
		return selfupdate.Installed{}, err
	}
	return selfupdate.Installed{Version: cmd.Version, Path: f.exe, SHA256: cmd.SHA256}, nil
}

func (f *fakeInstaller) SelfExec() bool  { return f.selfExec }
func (f *fakeInstaller) ExePath() string { return f.exe }
func (f *fakeInstaller) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

type rig struct {
	t      *testing.T
	cp     *fakecp.CP
	srv    *targetServer
	d      *actors.Daemon
	ob     *outbox.Outbox
	log    *logBuf
	deps   *ota.Deps
	waited bool
}

// newRig starts a daemon with the OTA actor over a fake control plane.
// exe is a private file standing for the daemon's binary.
func newRig(t *testing.T, inst ota.Installer, mod func(*ota.Deps)) *rig {
	t.Helper()
	cp := fakecp.New(t, fakecp.WithMaxHold(200*time.Millisecond))
	client, err := uplink.New(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	srv := &targetServer{Client: client}
	lb := newLogBuf(t)
	log := zerolog.New(lb).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	workdir := t.TempDir()
	ob, err := outbox.Open(filepath.Join(workdir, "outbox"), client, log, outbox.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	running := filepath.Join(t.TempDir(), "running-image")
	if err := os.WriteFile(running, []byte("the running build"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon's Wait waits for the update goroutines too.
	jobs := new(sync.WaitGroup)
	deps := &ota.Deps{
		Settings:     ota.Settings{Version: "v1", Grace: 10 * time.Second, Triple: dist.DefaultTriple()},
		Jobs:         jobs,
		Installer:    inst,
		State:        ota.NewState(),
		Log:          log.With().Str("actor", ota.Name).Logger(),
		RunningImage: running,
		Outcomes:     ob,
		WorkerID:     func() string { return "w-fake" },
	}
	if mod != nil {
		mod(deps)
	}
	settings := actors.Settings{
		Poll: poller.Settings{
			Hello: messages.HelloRequest{
				MachineID: "m1", Label: "ota", Tags: []string{}, Lanes: []string{},
				Capabilities: messages.Capabilities{Runners: []string{"process"}, Workdir: workdir},
				Versions:     messages.Versions{Daemon: ptr("v1")},
			},
			ProvisionalID:  "m1-PROVISIONAL",
			WaitMax:        200 * time.Millisecond,
			RequestTimeout: 5 * time.Second,
			KeepAlive:      -1,
		},
		RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond,
		Workdir: workdir, DefaultRunner: "process", KillGrace: 200 * time.Millisecond,
	}
	d, err := actors.New(settings, actors.Deps{
		Server: srv, Results: ob,
		Runners: map[string]runners.Runner{"process": process.New(log, process.WithKillGrace(200*time.Millisecond))},
		Log:     log,
		Jobs:    jobs,
	}, actors.WithChild(ota.Name, ota.Props(deps), messages.KindOtaUpdate))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cp: cp, srv: srv, d: d, ob: ob, log: lb, deps: deps}
	t.Cleanup(func() {
		if !r.waited {
			d.Shutdown(0)
			r.wait()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ob.Close(ctx)
		client.CloseIdleConnections()
	})
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) wait() {
	r.t.Helper()
	r.waited = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.d.Wait(ctx); err != nil {
		r.t.Fatalf("daemon stop: %v", err)
	}
}

func (r *rig) update(version, url, sum string) string {
	return r.cp.QueueKind(messages.KindOtaUpdate, &messages.OtaUpdate{Version: version, URL: url, SHA256: sum})
}

// stillServing proves the daemon keeps polling and running work.
func (r *rig) stillServing(id string) {
	r.t.Helper()
	r.cp.QueueExec(messages.Exec{ExecID: id, Command: "echo " + id, Env: map[string]string{}})
	res := r.cp.WaitResult(id, 20*time.Second)
	if res.ExitCode != 0 || string(res.Stdout) != id+"\n" {
		r.t.Fatalf("exec %s after the update: exit %d stdout %q", id, res.ExitCode, res.Stdout)
	}
}

func (r *rig) waitLog(sub string, n int) {
	r.t.Helper()
	wait.For(r.t, 20*time.Second, "log line "+sub, func() bool { return r.log.count(sub) >= n })
}

// outcome waits for the ota.finished event of id (a command id, or an
// auto-update's) and returns it with its data. The outbox posts side by
// side, so outcomes are found by id, not by arrival.
func (r *rig) outcome(id string) (messages.Event, messages.OtaOutcome) {
	r.t.Helper()
	var ev messages.Event
	r.cp.Wait(20*time.Second, "the ota.finished event of "+id, func() bool {
		for _, e := range r.cp.Events() {
			if e.Kind == messages.EventOtaFinished && e.InvocationID == id {
				ev = e
				return true
			}
		}
		return false
	})
	var o messages.OtaOutcome
	if err := messages.Unmarshal(ev.Data, &o); err != nil {
		r.t.Fatalf("ota.finished data: %v", err)
	}
	if ev.WorkerID != "w-fake" {
		r.t.Fatalf("ota.finished from worker %q", ev.WorkerID)
	}
	return ev, o
}

// wantRefused checks the outcome of a command: refused with code and a
// reason that says why.
func (r *rig) wantRefused(cmdID, code, reason string) {
	r.t.Helper()
	_, o := r.outcome(cmdID)
	if o.Outcome != messages.OtaRefused || o.Code != code || o.Reason == nil ||
		!strings.Contains(*o.Reason, reason) || o.Source != messages.OtaSourceCommand {
		r.t.Fatalf("outcome of %s: %+v, want refused %s %q", cmdID, o, code, reason)
	}
}

func ptr[T any](v T) *T { return &v }

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// elfBytes is a small real executable for this machine: what a valid
// update looks like to the installer's checks.
func elfBytes(t *testing.T) []byte {
	t.Helper()
	for _, p := range []string{"/usr/bin/true", "/bin/true"} {
		if b, err := os.ReadFile(p); err == nil {
			return b
		}
	}
	t.Skip("no /usr/bin/true to serve as an update")
	return nil
}

func serve(t *testing.T, body []byte) string {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	t.Cleanup(s.Close)
	return s.URL + "/nymph"
}

// privateExe writes a stand-in for the daemon's binary and returns its path.
func privateExe(t *testing.T) (string, []byte) {
	t.Helper()
	old := []byte("#!/bin/sh\necho old build\n")
	p := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(p, old, 0o755); err != nil {
		t.Fatal(err)
	}
	return p, old
}

func assertUnchanged(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s changed (%d bytes, want %d)", path, len(got), len(want))
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("leftovers next to the binary: %v", names)
	}
}

func realUpdater(t *testing.T, exe string) *selfupdate.Updater {
	t.Helper()
	return selfupdate.New(zerolog.New(newLogBuf(t)), selfupdate.Options{ExePath: exe, DisableSelfExec: true, Args: []string{exe}, Env: []string{}})
}

// A checksum that is not 64 hex characters is refused before anything is
// fetched; the daemon keeps polling.
func TestNonHexChecksumRefused(t *testing.T) {
	exe, old := privateExe(t)
	inst := &fakeInstaller{exe: exe, selfExec: true}
	r := newRig(t, inst, nil)
	first := r.update("v2", "http://127.0.0.1:1/nymph", "not-a-checksum")
	second := r.update("v2", "http://127.0.0.1:1/nymph", strings.Repeat("g", 64))
	r.waitLog("ota_update refused", 2)
	r.wantRefused(first, messages.OtaCodeInvalidCommand, "is not exactly 64 ASCII hex characters")
	r.wantRefused(second, messages.OtaCodeInvalidCommand, "is not exactly 64 ASCII hex characters")
	r.stillServing("after-refusal")
	if inst.Calls() != 0 {
		t.Fatalf("Install called %d times for invalid checksums", inst.Calls())
	}
	assertUnchanged(t, exe, old)
	if _, ok := r.deps.State.Handoff(); ok {
		t.Fatal("a refused update left a handoff")
	}
}

// A wrong checksum or a truncated download leaves the binary byte-for-byte
// intact, no temporary file, and the daemon polling.
func TestFailedInstallKeepsBinaryAndPolling(t *testing.T) {
	exe, old := privateExe(t)
	r := newRig(t, realUpdater(t, exe), nil)
	good := elfBytes(t)

	mismatch := r.update("v2", serve(t, good), strings.Repeat("ab", 32))
	r.waitLog("update failed", 1)
	assertUnchanged(t, exe, old)
	r.stillServing("after-mismatch")
	r.wantRefused(mismatch, messages.OtaCodeChecksumMismatch, "sha256 mismatch")

	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "100000")
		_, _ = w.Write(good[:len(good)/3])
	}))
	t.Cleanup(cut.Close)
	truncated := r.update("v2", cut.URL+"/nymph", sum(good))
	r.waitLog("update failed", 2)
	assertUnchanged(t, exe, old)
	r.stillServing("after-truncation")
	r.wantRefused(truncated, messages.OtaCodeFailed, "unexpected EOF")
	if _, ok := r.deps.State.Handoff(); ok {
		t.Fatal("a failed update left a handoff")
	}
}

// With the self-exec off the new binary is installed and applies at the
// next restart; the daemon does not drain and keeps serving.
func TestSelfExecDisabledInstallsAndResumes(t *testing.T) {
	exe, _ := privateExe(t)
	r := newRig(t, realUpdater(t, exe), nil)
	good := elfBytes(t)
	id := r.update("v2", serve(t, good), sum(good))
	r.waitLog("applies at the next restart", 1)
	got, _ := os.ReadFile(exe)
	if !bytes.Equal(got, good) {
		t.Fatal("the new binary is not installed")
	}
	if _, o := r.outcome(id); o.Outcome != messages.OtaInstalled || o.Version != "v2" ||
		o.Applies != messages.OtaAppliesNextRestart || o.SHA256 != sum(good) || o.Reason != nil {
		t.Fatalf("outcome of %s: %+v", id, o)
	}
	r.stillServing("after-install")
	if _, ok := r.deps.State.Handoff(); ok {
		t.Fatal("self-exec disabled, yet a handoff is pending")
	}
	// The same update again needs no download: the file is already there.
	r.update("v2", "http://127.0.0.1:1/unreachable", sum(good))
	r.waitLog("already installed", 1)
	r.stillServing("after-repeat")
}

// An update whose checksum is the running image's is a no-op: a command
// redelivered to the new binary after its exec never loops.
func TestAlreadyRunningIsSkipped(t *testing.T) {
	exe, old := privateExe(t)
	inst := &fakeInstaller{exe: exe, selfExec: true}
	r := newRig(t, inst, nil)
	running, _ := os.ReadFile(r.deps.RunningImage)
	id := r.update("v1", "http://127.0.0.1:1/nymph", sum(running))
	r.waitLog("already running", 1)
	if _, o := r.outcome(id); o.Outcome != messages.OtaAlreadyRunning {
		t.Fatalf("outcome of %s: %+v", id, o)
	}
	r.stillServing("after-skip")
	if inst.Calls() != 0 {
		t.Fatal("installed a binary that is already running")
	}
	assertUnchanged(t, exe, old)
}

// A second update while one is in progress is refused and logged.
func TestSecondUpdateRefusedWhileBusy(t *testing.T) {
	exe, _ := privateExe(t)
	inst := &fakeInstaller{exe: exe, err: errors.New("boom"), gate: make(chan struct{})}
	r := newRig(t, inst, nil)
	first := r.update("v2", "http://127.0.0.1:1/a", strings.Repeat("a", 64))
	wait.For(t, 20*time.Second, "the first install to start", func() bool { return inst.Calls() == 1 })
	busy := r.update("v3", "http://127.0.0.1:1/b", strings.Repeat("b", 64))
	r.waitLog("another update is in progress", 1)
	r.wantRefused(busy, messages.OtaCodeBusy, "another update is in progress")
	close(inst.gate)
	r.waitLog("update failed", 1)
	r.wantRefused(first, messages.OtaCodeFailed, "boom")
	r.stillServing("after-busy")
	if inst.Calls() != 1 {
		t.Fatalf("Install called %d times, want 1", inst.Calls())
	}
}

// A successful install with the self-exec on stops new work, lets the
// running exec finish and report, then stops the daemon with a handoff.
func TestInstalledDrainsBeforeHandoff(t *testing.T) {
	exe, _ := privateExe(t)
	inst := &fakeInstaller{exe: exe, selfExec: true}
	r := newRig(t, inst, nil)
	gate := filepath.Join(t.TempDir(), "gate")
	started := filepath.Join(t.TempDir(), "started")
	r.cp.QueueExec(messages.Exec{ExecID: "long", Env: map[string]string{},
		Command: "touch " + started + "; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo done"})
	wait.For(t, 20*time.Second, "the long exec to start", func() bool { _, err := os.Stat(started); return err == nil })

	id := r.update("v2", "http://127.0.0.1:1/nymph", strings.Repeat("c", 64))
	r.waitLog("draining in-flight execs", 1)
	// The outcome is out before the exec of the new binary.
	if _, o := r.outcome(id); o.Outcome != messages.OtaInstalled || o.Applies != messages.OtaAppliesNow {
		t.Fatalf("outcome of %s: %+v", id, o)
	}
	select {
	case <-r.d.Done():
		t.Fatal("the daemon stopped before its running exec finished")
	default:
	}
	// No new work is taken while draining.
	r.waitLog("poller stopping", 1)
	r.cp.QueueExec(messages.Exec{ExecID: "late", Command: "true", Env: map[string]string{}})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	res := r.cp.WaitResult("long", 20*time.Second)
	if res.ExitCode != 0 || string(res.Stdout) != "done\n" {
		t.Fatalf("long exec: exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	r.wait()
	if got, ok := r.deps.State.Handoff(); !ok || got.Version != "v2" {
		t.Fatalf("handoff = %+v, %v", got, ok)
	}
	if _, ok := r.cp.Result("late"); ok {
		t.Fatal("an exec queued after the install ran")
	}
}

// Auto-update builds the URL from its own control plane and the release's
// sidecar, converges, and with the self-exec off does not download again.
func TestAutoUpdateConverges(t *testing.T) {
	store, err := releases.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	good := elfBytes(t)
	if _, err := store.Publish(context.Background(), bytes.NewReader(good), "v2", dist.DefaultTriple()); err != nil {
		t.Fatal(err)
	}
	var downloads atomic.Int32
	rel := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !strings.HasSuffix(req.URL.Path, ".sha256") {
			downloads.Add(1)
		}
		store.Handler(dist.DefaultPrefix).ServeHTTP(w, req)
	}))
	t.Cleanup(rel.Close)

	exe, _ := privateExe(t)
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	r := newRig(t, realUpdater(t, exe), func(d *ota.Deps) {
		d.AutoUpdate, d.CheckInterval, d.ServerURL, d.Now = true, time.Minute, rel.URL, clock.Now
		d.Checksum = func(ctx context.Context, u string) (string, error) { return dist.FetchChecksum(ctx, nil, u) }
	})
	r.srv.target.Store(ptr("v2"))
	r.waitLog("applies at the next restart", 1)
	if got, _ := os.ReadFile(exe); !bytes.Equal(got, good) {
		t.Fatal("auto-update did not install the target")
	}
	// No command names an auto-update: its outcome is keyed by version and
	// start.
	if _, o := r.outcome(messages.AutoUpdateEventID("v2", clock.Now())); o.Source != messages.OtaSourceAuto || o.Outcome != messages.OtaInstalled {
		t.Fatalf("auto-update outcome: %+v", o)
	}
	clock.Advance(2 * time.Minute)
	r.waitLog("already installed", 1)
	if n := downloads.Load(); n != 1 {
		t.Fatalf("%d downloads, want 1", n)
	}
}

// A target that cannot be had (no such release) is tried once per
// interval, however often the daemon polls.
func TestAutoUpdateDoesNotLoop(t *testing.T) {
	exe, old := privateExe(t)
	inst := &fakeInstaller{exe: exe, selfExec: true}
	var checks atomic.Int32
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	r := newRig(t, inst, func(d *ota.Deps) {
		d.AutoUpdate, d.CheckInterval, d.ServerURL, d.Now = true, time.Minute, "http://cp.invalid", clock.Now
		d.Checksum = func(_ context.Context, u string) (string, error) {
			checks.Add(1)
			if want := "http://cp.invalid/v1/releases/v9/" + dist.DefaultTriple(); u != want {
				t.Errorf("auto-update URL %q, want %q", u, want)
			}
			return "", errors.New("HTTP 404 Not Found")
		}
	})
	// The running version as target: nothing happens.
	r.srv.target.Store(ptr("v1"))
	polls := len(r.cp.Polls())
	r.cp.Wait(20*time.Second, "polls", func() bool { return len(r.cp.Polls()) >= polls+3 })
	if n := checks.Load(); n != 0 {
		t.Fatalf("%d checks for the running version", n)
	}

	r.srv.target.Store(ptr("v9"))
	wait.For(t, 20*time.Second, "the first check", func() bool { return checks.Load() == 1 })
	r.waitLog("update failed", 1)
	polls = len(r.cp.Polls())
	r.cp.Wait(20*time.Second, "more polls", func() bool { return len(r.cp.Polls()) >= polls+5 })
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d checks within one interval, want 1", n)
	}
	clock.Advance(61 * time.Second)
	wait.For(t, 20*time.Second, "the check of the next interval", func() bool { return checks.Load() == 2 })
	if inst.Calls() != 0 {
		t.Fatal("installed without a checksum")
	}
	assertUnchanged(t, exe, old)
	r.stillServing("after-auto")
}
