package providers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/providers"
	"nymph/test/wait"
)

// launcher writes a wrapper that runs testdata/script/name with
// LAUNCHER_STATE=state and env, and returns its path: the provider's
// --command.
func launcher(t *testing.T, name, state string, env ...string) string {
	t.Helper()
	target, err := filepath.Abs(filepath.Join("testdata", "script", name))
	if err != nil {
		t.Fatal(err)
	}
	body := "#!/bin/sh\nexport LAUNCHER_STATE='" + state + "'\n"
	for _, kv := range env {
		body += "export " + kv + "\n"
	}
	body += "exec '" + target + "' \"$@\"\n"
	path := filepath.Join(t.TempDir(), strings.TrimSuffix(name, ".sh"))
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func newScript(t *testing.T, command string) *providers.Script {
	t.Helper()
	s, err := providers.NewScript("plug", providers.ScriptSpec{Command: command}, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	// Throttled runs are retried at once: the backoff itself is package
	// backoff's, tested there.
	s.RetryMin, s.RetryMax = time.Millisecond, time.Millisecond
	return s
}

func readState(t *testing.T, state, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestScriptLaunchConsoleTerminate goes through the three operations of
// the protocol against cloud.sh, and checks the request it received.
func TestScriptLaunchConsoleTerminate(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	s := newScript(t, launcher(t, "cloud.sh", state))
	ctx := testContext(t)
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}

	workerID := randomHex(t, 12)
	bootstrap := "#!/bin/bash\n# a \"quoted\" \"worker_id\":\"not-this\" line\ntoken='tok-" + randomHex(t, 8) + "'\n"
	inst, err := s.Launch(ctx, providers.LaunchRequest{
		WorkerID: workerID, Name: "gpu-00", Bootstrap: bootstrap,
		Capacity: json.RawMessage(`{"instance_type":"g5.xlarge"}`),
	})
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	if inst.ID != "inst-"+workerID {
		t.Fatalf("instance id %q, want inst-%s", inst.ID, workerID)
	}
	var req struct {
		Version   int             `json:"version"`
		WorkerID  string          `json:"worker_id"`
		Name      string          `json:"name"`
		Bootstrap string          `json:"bootstrap"`
		Capacity  json.RawMessage `json:"capacity"`
	}
	if err := json.Unmarshal([]byte(readState(t, state, "instances/"+inst.ID)), &req); err != nil {
		t.Fatal(err)
	}
	if req.Version != providers.ScriptProtocolVersion || req.WorkerID != workerID || req.Name != "gpu-00" ||
		req.Bootstrap != bootstrap || string(req.Capacity) != `{"instance_type":"g5.xlarge"}` {
		t.Fatalf("launch request as the script got it: %+v", req)
	}

	console, err := s.ConsoleLog(ctx, inst.ID, false)
	if err != nil || console != "console of "+inst.ID+"\nbooted\n" {
		t.Fatalf("ConsoleLog: %q, %v", console, err)
	}
	for i := 0; i < 2; i++ {
		if err := s.Terminate(ctx, inst.ID); err != nil {
			t.Fatalf("Terminate #%d: %v", i+1, err)
		}
	}
	if _, err := s.ConsoleLog(ctx, inst.ID, true); !errors.Is(err, providers.ErrInstanceGone) {
		t.Fatalf("ConsoleLog of a terminated instance: %v, want ErrInstanceGone", err)
	}
	want := "launch-start " + workerID + " 1\nlaunch-end " + workerID + " 0\n" +
		"console-log " + inst.ID + "\nterminate " + inst.ID + "\nterminate " + inst.ID + "\nconsole-log " + inst.ID
	if got := readState(t, state, "calls"); got != want {
		t.Fatalf("calls:\n%s\nwant:\n%s", got, want)
	}

	// A launch with no capacity sends null.
	other := randomHex(t, 12)
	if _, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: other, Bootstrap: "true\n"}); err != nil {
		t.Fatalf("Launch without capacity: %v", err)
	}
	if got := readState(t, state, "instances/inst-"+other); !strings.Contains(got, `"capacity":null`) {
		t.Fatalf("request without capacity: %s", got)
	}
	if _, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: other, Capacity: json.RawMessage(`{"bad"`)}); err == nil || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("Launch with malformed capacity: %v", err)
	}
}

// TestScriptThrottledIsRetried: two exits 75, then an answer.
func TestScriptThrottledIsRetried(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	s := newScript(t, launcher(t, "throttle-twice.sh", state))
	workerID := randomHex(t, 12)
	inst, err := s.Launch(testContext(t), providers.LaunchRequest{WorkerID: workerID, Bootstrap: "true\n"})
	if err != nil || inst.ID != "inst-"+workerID {
		t.Fatalf("Launch through two throttles: %+v, %v", inst, err)
	}
	if got := readState(t, state, "throttled"); got != "2" {
		t.Fatalf("throttled %s times, want 2", got)
	}
}

// TestScriptThrottledUntilContextEnds: a throttled launch waits in its
// backoff, and gives up when its ctx ends.
func TestScriptThrottledUntilContextEnds(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	s := newScript(t, launcher(t, "throttle-twice.sh", state))
	s.RetryMin, s.RetryMax = time.Hour, time.Hour
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() {
		_, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: randomHex(t, 12)})
		done <- err
	}()
	wait.For(t, time.Minute, "the first throttled run", func() bool {
		b, _ := os.ReadFile(filepath.Join(state, "throttled"))
		return strings.TrimSpace(string(b)) == "1"
	})
	// The count is written just before the script exits 75, so the cancel
	// lands in the backoff (the usual case: it is an hour) or, rarely, in
	// the last instant of that run; either way Launch must end with ctx.
	cancel()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("Launch cancelled while throttled: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Launch did not return when its ctx ended")
	}
}

// TestScriptFailureCarriesStderr: a failure's error ends with the script's
// last stderr line, and is bounded.
func TestScriptFailureCarriesStderr(t *testing.T) {
	t.Parallel()
	s := newScript(t, launcher(t, "fail.sh", t.TempDir()))
	_, err := s.Launch(testContext(t), providers.LaunchRequest{WorkerID: randomHex(t, 12)})
	if err == nil {
		t.Fatal("Launch of fail.sh succeeded")
	}
	msg := err.Error()
	if !strings.Contains(msg, "exit status 3") || !strings.HasSuffix(msg, "InsufficientCapacity: no machines of that type in this zone") {
		t.Fatalf("error of a failed launch: %s", msg)
	}
	if strings.Contains(msg, "noise line 1:") || len(msg) > 4<<10+200 {
		t.Fatalf("error quotes %d bytes of stderr, want the last 4 KiB", len(msg))
	}
}

// TestScriptGarbageAnswers: a malformed answer is an error naming what is
// wrong with it.
func TestScriptGarbageAnswers(t *testing.T) {
	t.Parallel()
	s := newScript(t, launcher(t, "garbage.sh", t.TempDir()))
	ctx := testContext(t)
	if _, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: randomHex(t, 12)}); err == nil || !strings.Contains(err.Error(), `"instance_id" must be a string, not 42`) {
		t.Errorf("Launch answered a number: %v", err)
	}
	if _, err := s.ConsoleLog(ctx, "inst-1", true); err == nil || !strings.Contains(err.Error(), "not a JSON object") || !strings.Contains(err.Error(), "503 Service Unavailable") {
		t.Errorf("console-log answered HTML: %v", err)
	}
	if err := s.Terminate(ctx, "inst-1"); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Errorf("terminate answered an array: %v", err)
	}
}

// hangWatch makes the FIFO hang.sh's child holds open and reads it: ready
// is closed when the child has written "started", and gone receives what
// was read once every writer has closed it, that is once the child is
// dead.
func hangWatch(t *testing.T, state string) (ready <-chan struct{}, gone <-chan string) {
	t.Helper()
	fifo := filepath.Join(state, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	readyc, gonec := make(chan struct{}), make(chan string, 1)
	go func() {
		f, err := os.Open(fifo) // blocks until a writer opens it
		if err != nil {
			gonec <- "open: " + err.Error()
			return
		}
		defer f.Close()
		r := bufio.NewReader(f)
		line, _ := r.ReadString('\n')
		close(readyc)
		rest, _ := io.ReadAll(r)
		gonec <- line + string(rest)
	}()
	t.Cleanup(func() {
		// Release a reader still blocked in open (no child ever came).
		if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	return readyc, gonec
}

// TestScriptHangTimesOut: a launch that never answers ends at its timeout,
// and the script's child dies with it.
func TestScriptHangTimesOut(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	_, gone := hangWatch(t, state)
	s := newScript(t, launcher(t, "hang.sh", state))
	s.LaunchTimeout = 500 * time.Millisecond
	_, err := s.Launch(testContext(t), providers.LaunchRequest{WorkerID: randomHex(t, 12)})
	if err == nil || !strings.Contains(err.Error(), "no answer within 500ms") || !strings.Contains(err.Error(), "process group was killed") {
		t.Fatalf("Launch of hang.sh: %v", err)
	}
	// Launch returns once the group is gone, so no writer can open the
	// FIFO any more: release a reader that never met one, then every
	// writer is closed unless the child survived.
	if w, err := os.OpenFile(filepath.Join(state, "fifo"), os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		w.Close()
	}
	select {
	case got := <-gone:
		if got == "" {
			t.Log("hang.sh was killed before it started its child")
		} else if got != "started\n" {
			t.Fatalf("fifo read %q", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("hang.sh's child outlived the timeout")
	}
}

// TestScriptHangCancelled: a launch whose ctx ends kills the script and
// the child it started.
func TestScriptHangCancelled(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	ready, gone := hangWatch(t, state)
	s := newScript(t, launcher(t, "hang.sh", state))
	ctx, cancel := context.WithCancel(testContext(t))
	done := make(chan error, 1)
	go func() {
		_, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: randomHex(t, 12)})
		done <- err
	}()
	select {
	case <-ready:
	case <-time.After(time.Minute):
		t.Fatal("hang.sh never started its child")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Launch: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Launch did not return when its ctx ended")
	}
	select {
	case got := <-gone:
		if got != "started\n" {
			t.Fatalf("fifo read %q", got)
		}
	case <-time.After(time.Minute):
		t.Fatal("hang.sh's child outlived the cancelled launch")
	}
}

// TestScriptConcurrentLaunchesOverlap: launches from several goroutines
// run at once, and cloud.sh's peak records how many.
func TestScriptConcurrentLaunchesOverlap(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	const n = 3
	s := newScript(t, launcher(t, "cloud.sh", state, "LAUNCHER_HOLD=3", "LAUNCHER_HOLD_SECONDS=60"))
	ctx := testContext(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Launch(ctx, providers.LaunchRequest{WorkerID: randomHex(t, 12)})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Launch: %v", err)
		}
	}
	if peak, inflight := readState(t, state, "peak"), readState(t, state, "inflight"); peak != "3" || inflight != "0" {
		t.Fatalf("peak %s, in flight %s: want 3 and 0", peak, inflight)
	}
	if calls := readState(t, state, "calls"); strings.Count(calls, "launch-start") != n || strings.Count(calls, "launch-end") != n {
		t.Fatalf("calls:\n%s", calls)
	}
}

func TestScriptCheck(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	notExec := filepath.Join(t.TempDir(), "launcher")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{notExec, "/nonexistent/launcher", "no-such-launcher-on-path"} {
		if err := newScript(t, cmd).Check(ctx); err == nil || !strings.Contains(err.Error(), "--command "+cmd) {
			t.Errorf("Check of %s: %v, want an error naming --command", cmd, err)
		}
	}
}

func TestScriptSpecValidate(t *testing.T) {
	for _, c := range []struct {
		command string
		valid   bool
	}{
		{"/usr/local/bin/gcloud-launcher", true},
		{"gcloud-launcher", true},
		{"", false},
		{" /x", false},
		{"./launcher", false},
		{"bin/launcher", false},
	} {
		err := providers.ScriptSpec{Command: c.command}.Validate()
		if c.valid != (err == nil) || err != nil && !strings.Contains(err.Error(), "--command") {
			t.Errorf("Validate(%q) = %v", c.command, err)
		}
	}
	if _, err := providers.NewScript("plug", providers.ScriptSpec{}, zerolog.Nop()); err == nil {
		t.Error("NewScript accepted an empty command")
	}
}
