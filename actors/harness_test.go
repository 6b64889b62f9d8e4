package actors_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors"
	"nymph/actors/poller"
	"nymph/daemon/outbox"
	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/runners"
	"nymph/runners/echo"
	"nymph/runners/process"
	"nymph/test/fakecp"
)

type harness struct {
	t       *testing.T
	cp      *fakecp.CP
	d       *actors.Daemon
	ob      *outbox.Outbox
	client  *uplink.Client
	workdir string
	waited  bool
}

type setup struct {
	cpOpts   []fakecp.Option
	settings func(*actors.Settings)
	deps     func(*actors.Deps)
	opts     []actors.Option
	level    zerolog.Level
	// logTo takes the daemon's log instead of t.Log.
	logTo   io.Writer
	noStart bool
}

func baseSettings(workdir string) actors.Settings {
	return actors.Settings{
		Poll: poller.Settings{
			Hello: messages.HelloRequest{
				MachineID: "m1", Label: "test box", Tags: []string{"arch=x86_64"}, Lanes: []string{"q1"},
				Capabilities: messages.Capabilities{Runners: []string{"process", "echo"}, Workdir: workdir},
				Versions:     messages.Versions{Daemon: ptr("test"), Protocol: ptr("1")},
			},
			ProvisionalID:  "m1-01PROVISIONAL",
			Queue:          "q1",
			WaitMax:        2 * time.Second,
			RequestTimeout: 5 * time.Second,
			KeepAlive:      -1,
		},
		RetryMin:      10 * time.Millisecond,
		RetryMax:      40 * time.Millisecond,
		Workdir:       workdir,
		DefaultRunner: "process",
		KillGrace:     200 * time.Millisecond,
	}
}

func newHarness(t *testing.T, s setup) *harness {
	t.Helper()
	cp := fakecp.New(t, s.cpOpts...)
	client, err := uplink.New(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	level := s.level
	if level == 0 {
		level = zerolog.InfoLevel
	}
	var logTo io.Writer = newTestLog(t)
	if s.logTo != nil {
		logTo = s.logTo
	}
	log := zerolog.New(logTo).Level(level).With().Timestamp().Logger()
	workdir := t.TempDir()
	ob, err := outbox.Open(filepath.Join(workdir, "outbox"), client, log, outbox.WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	settings := baseSettings(workdir)
	if s.settings != nil {
		s.settings(&settings)
	}
	deps := actors.Deps{
		Server:  client,
		Results: ob,
		Journal: ob,
		Backlog: ob,
		Runners: map[string]runners.Runner{
			"process": process.New(log, process.WithKillGrace(200*time.Millisecond)),
			"echo":    echo.New(),
		},
		Reprobe: func(context.Context) messages.Capabilities {
			return messages.Capabilities{Runners: []string{"process", "echo", "docker"}, Workdir: workdir}
		},
		Log: log,
	}
	if s.deps != nil {
		s.deps(&deps)
	}
	d, err := actors.New(settings, deps, s.opts...)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, cp: cp, d: d, ob: ob, client: client, workdir: workdir}
	t.Cleanup(h.stop)
	if !s.noStart {
		if err := d.Start(); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// stop shuts the daemon down (if the test did not) and flushes the outbox.
func (h *harness) stop() {
	if !h.waited {
		h.d.Shutdown(0)
		h.wait(20 * time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.ob.Close(ctx)
	h.client.CloseIdleConnections()
}

func (h *harness) wait(timeout time.Duration) error {
	h.t.Helper()
	h.waited = true
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := h.d.Wait(ctx)
	if ctx.Err() != nil {
		h.t.Fatalf("daemon did not stop within %v", timeout)
	}
	return err
}

func (h *harness) waitPolls(n int) {
	h.t.Helper()
	h.cp.Wait(10*time.Second, strconv.Itoa(n)+" polls", func() bool { return len(h.cp.Polls()) >= n })
}

// waitPollAnswered waits for a poll the fake answered with status.
func (h *harness) waitPollAnswered(status int) {
	h.t.Helper()
	h.cp.Wait(10*time.Second, "a poll answered "+strconv.Itoa(status), func() bool {
		for _, r := range h.cp.Requests() {
			if r.Route == fakecp.RoutePoll && r.Status == status {
				return true
			}
		}
		return false
	})
}

func (h *harness) exec(id, command string, mod ...func(*messages.Exec)) string {
	e := messages.Exec{ExecID: id, Command: command, Env: map[string]string{}}
	for _, m := range mod {
		m(&e)
	}
	return h.cp.QueueExec(e)
}

func withTimeout(s float64) func(*messages.Exec) {
	return func(e *messages.Exec) { e.TimeoutS = &s }
}

func withEnv(k, v string) func(*messages.Exec) {
	return func(e *messages.Exec) { e.Env[k] = v }
}

func ptr[T any](v T) *T { return &v }

func errOf(r messages.ExecResult) string {
	if r.Error == nil {
		return "<nil>"
	}
	return *r.Error
}

// children lists live processes whose parent is this test process.
func children() []int {
	self := []byte(" " + strconv.Itoa(os.Getpid()) + " ")
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		// after ") S " comes the ppid
		rest := stat[i+4:]
		if bytes.HasPrefix(rest, self[1:]) {
			out = append(out, pid)
		}
	}
	return out
}

// testLog writes to t.Log until the test's cleanup, then drops: actor
// timers may still fire into dead letters after the daemon stopped.
type testLog struct {
	mu   sync.Mutex
	t    testing.TB
	live bool
}

func newTestLog(t testing.TB) *testLog {
	l := &testLog{t: t, live: true}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.live = false
	})
	return l
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.live {
		l.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
