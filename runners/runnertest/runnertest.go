// Package runnertest owns the one conformance suite every runner kind must
// pass. A kind's own _test.go calls Run with a factory and the Caps that say
// how the suite can express a function for it (a POSIX shell script, a
// Python function, or nothing at all for echo).
package runnertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/procgroup"
	"nymph/test/wait"
)

// Caps says what a runner kind supports, and so which form each scenario
// takes.
type Caps struct {
	// Script: Spec.Script runs as a shell script. The suite's scripts are
	// POSIX sh, so a busybox image is enough.
	Script bool
	// Python: Spec.Function is a Python function module:qualname, found in
	// Spec.Workdir, whose args and result are msgpack. When set, scenarios
	// take their Python form; Script then adds the script-only scenarios.
	Python bool
	// Echo: there is no process; the result is the args. Only the data,
	// concurrency and cancellation scenarios apply.
	Echo bool
	// Image is put in every Spec.Image.
	Image string
	// HostPIDs: the pids a function sees are this host's pids (false for
	// containers and sandboxes), so a grandchild can also be checked by pid.
	HostPIDs bool
	// Sandboxed: the function's processes are invisible in this host's
	// /proc (gVisor), so the suite can only check the host-side processes
	// of the run, which name the scratch directory, and not the marker.
	Sandboxed bool
	// Concurrency is how many runs the concurrency scenario starts at once
	// (default 20).
	Concurrency int
	// RunDeadline bounds each run the suite waits for (default 60 s).
	RunDeadline time.Duration
}

// Factory returns the runner under test.
type Factory func(t *testing.T) runners.Runner

// Run runs the conformance suite against the runner factory returns.
func Run(t *testing.T, factory Factory, caps Caps) {
	t.Helper()
	if caps.Concurrency <= 0 {
		caps.Concurrency = 20
	}
	if caps.RunDeadline <= 0 {
		caps.RunDeadline = 60 * time.Second
	}
	if !caps.Script && !caps.Python && !caps.Echo {
		t.Fatal("runnertest: Caps must set Script, Python or Echo")
	}
	s := &suite{factory: factory, caps: caps}
	t.Run("Success", s.success)
	t.Run("LargeArgs", s.largeArgs)
	t.Run("Concurrent", s.concurrent)
	t.Run("CancelBeforeStart", s.cancelBeforeStart)
	if caps.Echo {
		return
	}
	t.Run("EmptyResult", s.emptyResult)
	t.Run("StructuredFailure", s.structuredFailure)
	if caps.Script {
		t.Run("NonZeroExit", s.nonZeroExit)
	}
	t.Run("Timeout", s.timeout)
	t.Run("CancelKillsTree", s.cancelKillsTree)
	t.Run("EnvAndWorkdir", s.envAndWorkdir)
	t.Run("OutputStreamed", s.outputStreamed)
}

type suite struct {
	factory Factory
	caps    Caps
}

// pythonModule is the module the Python form of each scenario calls.
const pythonModule = `import os, subprocess, sys, time

def echo(**kw):
    return kw

def add(a, b):
    return a + b

def nothing():
    return None

def fail(message):
    raise ValueError(message)

def sleep(seconds):
    time.sleep(seconds)

def spawn(marker):
    p = subprocess.Popen(["sh", "-c", "sleep 1000; :", marker])
    print("READY %d" % p.pid, flush=True)
    time.sleep(1000)

def env(name):
    return [os.environ.get(name), os.getcwd(), os.environ.get("NYMPH_INVOCATION_ID"),
            os.environ.get("NYMPH_PARENT_INVOCATION_ID"), os.environ.get("NYMPH_ROOT_INVOCATION_ID")]

def same(data):
    return data

def output():
    print("out-line", flush=True)
    print("err-line", file=sys.stderr, flush=True)
`

const pythonModuleName = "nymph_conformance"

// spec returns a base spec with fresh ids, scratch dir and a workdir that
// holds the Python module.
func (s *suite) spec(t *testing.T) runners.Spec {
	t.Helper()
	id := "conf-" + randomHex(8)
	workdir := t.TempDir()
	if s.caps.Python {
		if err := os.WriteFile(filepath.Join(workdir, pythonModuleName+".py"), []byte(pythonModule), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return runners.Spec{
		InvocationID:       id,
		ParentInvocationID: id + "-parent",
		RootInvocationID:   id + "-root",
		Image:              s.caps.Image,
		Workdir:            workdir,
		ScratchDir:         t.TempDir(),
		Env:                map[string]string{},
	}
}

// sleeping is a spec whose function sleeps for 30 s.
func (s *suite) sleeping(t *testing.T) runners.Spec {
	spec := s.spec(t)
	if s.caps.Python {
		s.python(&spec, "sleep", 30)
	} else {
		spec.Script = "sleep 30\n"
	}
	return spec
}

func (s *suite) python(spec *runners.Spec, qualname string, args any) {
	spec.Function = messages.FunctionRef{Module: pythonModuleName, Qualname: qualname}
	if args == nil {
		spec.Args = nil
		return
	}
	b, err := msgpack.Marshal(args)
	if err != nil {
		panic(err)
	}
	spec.Args = b
}

func (s *suite) run(t *testing.T, ctx context.Context, r runners.Runner, spec runners.Spec) runners.Outcome {
	t.Helper()
	out, err := Start(ctx, r, spec).Wait(t, s.caps.RunDeadline, "Run to return")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out
}

func wantState(t *testing.T, out runners.Outcome, state string) {
	t.Helper()
	if out.State != state {
		t.Fatalf("state = %q, want %q (error %s)", out.State, state, describe(out.Error))
	}
}

func describe(e *messages.AckError) string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{type %q, message %q}", e.Type, e.Message)
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		t.Fatalf("result is not msgpack: %v (%q)", err, truncate(b))
	}
	return v
}

func truncate(b []byte) []byte {
	if len(b) > 200 {
		return b[:200]
	}
	return b
}

// The script reads its args from stdin, checks the args file holds the
// same bytes, and returns them.
const echoScript = `cat > "$NYMPH_RESULT_PATH"
cmp -s "$NYMPH_ARGS_PATH" "$NYMPH_RESULT_PATH" || { echo "args file differs from stdin" >&2; exit 3; }
`

func (s *suite) success(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	switch {
	case !s.caps.Python:
		spec.Script = echoScript
		spec.Args = []byte("hello \x00\xff conformance")
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		if !bytes.Equal(out.Result, spec.Args) {
			t.Fatalf("result = %q, want %q", out.Result, spec.Args)
		}
		if out.Error != nil {
			t.Fatalf("error on success: %s", describe(out.Error))
		}
	default:
		s.python(&spec, "echo", map[string]any{"word": "hello", "n": 42})
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		got := decode(t, out.Result)
		want := map[string]any{"word": "hello", "n": int8(42)}
		if !reflect.DeepEqual(normalize(got), normalize(want)) {
			t.Fatalf("result = %#v, want %#v", got, want)
		}
		s.python(&spec, "add", []any{40, 2})
		out = s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		if got := normalize(decode(t, out.Result)); got != int64(42) {
			t.Fatalf("add(40, 2) = %#v, want 42", got)
		}
	}
}

// normalize turns every msgpack integer into int64 so results compare
// regardless of the encoder's chosen width.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = normalize(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = normalize(e)
		}
		return l
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(rv.Uint())
	}
	return v
}

func (s *suite) largeArgs(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	data := make([]byte, 10<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if !s.caps.Python {
		spec.Script = echoScript
		spec.Args = data
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		if !bytes.Equal(out.Result, data) {
			t.Fatalf("10 MiB round trip: got %d bytes, equal=%v", len(out.Result), false)
		}
		return
	}
	s.python(&spec, "same", data)
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateSucceeded)
	got, ok := decode(t, out.Result).([]byte)
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("10 MiB round trip failed: got %d bytes", len(got))
	}
}

func (s *suite) concurrent(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	n := s.caps.Concurrency
	specs := make([]runners.Spec, n)
	for i := range specs {
		specs[i] = s.spec(t)
		if !s.caps.Python {
			specs[i].Script = echoScript
			specs[i].Args = []byte("run-" + strconv.Itoa(i))
		} else {
			s.python(&specs[i], "add", []any{i, 1000})
		}
	}
	outs := make([]runners.Outcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], errs[i] = r.Run(context.Background(), specs[i])
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.caps.RunDeadline * 2):
		t.Fatalf("%d concurrent runs did not finish within %s", n, s.caps.RunDeadline*2)
	}
	for i := range outs {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		wantState(t, outs[i], messages.StateSucceeded)
		if !s.caps.Python {
			if string(outs[i].Result) != "run-"+strconv.Itoa(i) {
				t.Fatalf("run %d: result %q", i, outs[i].Result)
			}
		} else if got := normalize(decode(t, outs[i].Result)); got != int64(i+1000) {
			t.Fatalf("run %d: result %#v", i, got)
		}
	}
}

func (s *suite) cancelBeforeStart(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.sleeping(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out := s.run(t, ctx, r, spec)
	wantState(t, out, messages.StateKilled)
	if out.Error == nil || out.Error.Type != runners.ErrorTypeCancelled {
		t.Fatalf("error = %s, want type Cancelled", describe(out.Error))
	}
}

func (s *suite) emptyResult(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	if !s.caps.Python {
		spec.Script = "true\n"
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		if len(out.Result) != 0 {
			t.Fatalf("result = %q, want empty", out.Result)
		}
		return
	}
	s.python(&spec, "nothing", nil)
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateSucceeded)
	if v := decode(t, out.Result); v != nil {
		t.Fatalf("result = %#v, want nil", v)
	}
}

func (s *suite) structuredFailure(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	if !s.caps.Python {
		spec.Script = `printf '%s' '{"type":"ValueError","message":"boom","traceback":"line 1\nline 2"}' > "$NYMPH_ERROR_PATH"
exit 3
`
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateFailed)
		if out.Error == nil || out.Error.Type != "ValueError" || out.Error.Message != "boom" ||
			out.Error.Traceback == nil || *out.Error.Traceback != "line 1\nline 2" {
			t.Fatalf("error = %s, want ValueError boom with traceback", describe(out.Error))
		}
		if out.ExitCode != 3 {
			t.Fatalf("exit code = %d, want 3", out.ExitCode)
		}
		if len(out.Result) != 0 {
			t.Fatalf("result on failure = %q", out.Result)
		}
		return
	}
	s.python(&spec, "fail", "boom")
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateFailed)
	if out.Error == nil || out.Error.Type != "ValueError" || out.Error.Message != "boom" {
		t.Fatalf("error = %s, want ValueError boom", describe(out.Error))
	}
	if out.Error.Traceback == nil || !strings.Contains(*out.Error.Traceback, "ValueError") {
		t.Fatalf("traceback = %v, want one naming ValueError", out.Error.Traceback)
	}
}

func (s *suite) nonZeroExit(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	spec.Script = "echo first-line >&2\necho oops-last-line >&2\nexit 7\n"
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateFailed)
	if out.Error == nil || out.Error.Type != runners.ErrorTypeExit ||
		!strings.Contains(out.Error.Message, "exit status 7") || !strings.Contains(out.Error.Message, "oops-last-line") {
		t.Fatalf("error = %s, want NonZeroExit with exit status 7 and the stderr tail", describe(out.Error))
	}
	if out.ExitCode != 7 {
		t.Fatalf("exit code = %d, want 7", out.ExitCode)
	}
}

func (s *suite) timeout(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.sleeping(t)
	spec.Timeout = 500 * time.Millisecond
	start := time.Now()
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateKilled)
	if out.Error == nil || out.Error.Type != runners.ErrorTypeTimeout {
		t.Fatalf("error = %s, want type Timeout", describe(out.Error))
	}
	if el := time.Since(start); el > 25*time.Second {
		t.Fatalf("timeout run took %s", el)
	}
}

func (s *suite) cancelKillsTree(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	marker := "nymph-conf-marker-" + randomHex(8)
	if s.caps.Python {
		s.python(&spec, "spawn", marker)
	} else {
		spec.Script = fmt.Sprintf("sh -c 'sleep 1000; :' %s &\necho \"READY $!\"\nwait\n", marker)
	}
	output := newWatchedBuffer()
	spec.Output = output
	ready := output.waitFor("READY")

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	run := Start(ctx, r, spec)
	select {
	case <-ready:
	case <-run.Done():
		out, err := run.Result()
		t.Fatalf("run ended before it was ready: %+v %v (output %q)", out, err, output.String())
	case <-time.After(s.caps.RunDeadline):
		t.Fatalf("no READY within %s (output %q)", s.caps.RunDeadline, output.String())
	}
	// READY can be printed before the forked grandchild has exec'd.
	if !s.caps.Sandboxed {
		wait.For(t, s.caps.RunDeadline, "grandchild with marker "+marker+" visible before cancel", func() bool {
			live, _ := procgroup.WithCmdline(marker)
			return len(live) > 0
		})
	}
	if live, _ := procgroup.WithCmdline(spec.ScratchDir); len(live) == 0 {
		t.Fatalf("no process names the scratch dir %s before cancel", spec.ScratchDir)
	}
	pid := readyPID(output.String())
	cancel(errors.New("daemon shutdown grace expired"))
	out, err := run.Wait(t, s.caps.RunDeadline, "Run to return after cancel")
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	wantState(t, out, messages.StateKilled)
	if out.Error == nil || out.Error.Type != runners.ErrorTypeCancelled ||
		out.Error.Message != "daemon shutdown grace expired" {
		t.Fatalf("error = %s, want Cancelled with the cancel cause as message", describe(out.Error))
	}
	NoneNaming(t, marker, "after Run returned")
	NoneNaming(t, spec.ScratchDir, "after Run returned")
	if s.caps.HostPIDs {
		if pid <= 0 {
			t.Fatalf("no pid in READY line: %q", output.String())
		}
		if alive(pid) {
			t.Fatalf("grandchild pid %d still alive after Run returned", pid)
		}
	}
}

func readyPID(out string) int {
	_, rest, ok := strings.Cut(out, "READY ")
	if !ok {
		return 0
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return 0
	}
	pid, _ := strconv.Atoi(f[0])
	return pid
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}

func (s *suite) envAndWorkdir(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	const value = "a b=c 'quoted' $HOME"
	spec.Env["NYMPH_CONFORMANCE"] = value
	var lines []string
	if !s.caps.Python {
		spec.Script = `{
printf '%s\n' "$NYMPH_CONFORMANCE"
pwd -P
printf '%s\n' "$NYMPH_INVOCATION_ID" "$NYMPH_PARENT_INVOCATION_ID" "$NYMPH_ROOT_INVOCATION_ID"
} > "$NYMPH_RESULT_PATH"
`
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		lines = strings.Split(strings.TrimSuffix(string(out.Result), "\n"), "\n")
	} else {
		s.python(&spec, "env", "NYMPH_CONFORMANCE")
		out := s.run(t, context.Background(), r, spec)
		wantState(t, out, messages.StateSucceeded)
		l, ok := decode(t, out.Result).([]any)
		if !ok {
			t.Fatalf("result %q is not a list", out.Result)
		}
		for _, e := range l {
			str, _ := e.(string)
			lines = append(lines, str)
		}
	}
	wd, err := filepath.EvalSymlinks(spec.Workdir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{value, wd, spec.InvocationID, spec.ParentInvocationID, spec.RootInvocationID}
	if !reflect.DeepEqual(lines, want) {
		t.Fatalf("env/workdir = %q, want %q", lines, want)
	}
}

func (s *suite) outputStreamed(t *testing.T) {
	t.Parallel()
	r := s.factory(t)
	spec := s.spec(t)
	if !s.caps.Python {
		spec.Script = "echo out-line\necho err-line >&2\n"
	} else {
		s.python(&spec, "output", nil)
	}
	output, stdout, stderr := newWatchedBuffer(), newWatchedBuffer(), newWatchedBuffer()
	spec.Output, spec.Stdout, spec.Stderr = output, stdout, stderr
	out := s.run(t, context.Background(), r, spec)
	wantState(t, out, messages.StateSucceeded)
	got := output.String()
	if !strings.Contains(got, "out-line") || !strings.Contains(got, "err-line") {
		t.Fatalf("output = %q, want both out-line and err-line", got)
	}
	// Each stream also arrives alone, so it can be shipped under its name.
	if o, e := stdout.String(), stderr.String(); !strings.Contains(o, "out-line") || strings.Contains(o, "err-line") ||
		!strings.Contains(e, "err-line") || strings.Contains(e, "out-line") {
		t.Fatalf("stdout = %q, stderr = %q: want out-line on stdout only and err-line on stderr only", o, e)
	}
}

// watchedBuffer is a concurrency-safe Output that can signal when a
// substring appears.
type watchedBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	waiters map[string]chan struct{}
}

func newWatchedBuffer() *watchedBuffer {
	return &watchedBuffer{waiters: map[string]chan struct{}{}}
}

func (w *watchedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.check()
	return len(p), nil
}

func (w *watchedBuffer) check() {
	for s, ch := range w.waiters {
		if bytes.Contains(w.buf.Bytes(), []byte(s)) {
			close(ch)
			delete(w.waiters, s)
		}
	}
}

func (w *watchedBuffer) waitFor(s string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waiters[s] = ch
	w.check()
	return ch
}

func (w *watchedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
