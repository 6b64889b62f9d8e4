package execs_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors/execs"
	"nymph/daemon/orphans"
	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/runners/procgroup"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

func newShell(t *testing.T, cp *fakecp.CP) *execs.Shell {
	t.Helper()
	if cp == nil {
		cp = fakecp.New(t)
	}
	client, err := uplink.New(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	return &execs.Shell{
		Workdir:   t.TempDir(),
		KillGrace: 200 * time.Millisecond,
		Namespace: "default",
		BaseEnv:   []string{"PATH=" + os.Getenv("PATH"), "FOO=base", "KEEP=kept"},
		Server:    client,
		Log:       zerolog.New(zerolog.NewTestWriter(t)),
	}
}

func run(s *execs.Shell, e messages.Exec) *messages.ExecResult {
	if e.ExecID == "" {
		e.ExecID = "e1"
	}
	return s.Run(context.Background(), &e)
}

func errString(r *messages.ExecResult) string {
	if r.Error == nil {
		return "<nil>"
	}
	return *r.Error
}

func TestExitCodeOutputEnvStdinWorkdir(t *testing.T) {
	s := newShell(t, nil)
	sub := filepath.Join(s.Workdir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	wd := "sub"
	r := run(s, messages.Exec{
		Command: `echo "$FOO $KEEP $EXTRA"; cat; pwd; shopt -q login_shell && echo login || echo nologin; echo oops >&2; exit 3`,
		Env:     map[string]string{"FOO": "over", "EXTRA": "x"},
		Stdin:   "from-stdin\n",
		Workdir: &wd,
	})
	want := "over kept x\nfrom-stdin\n" + sub + "\nnologin\n"
	if r.ExitCode != 3 || r.Stdout != want || r.Stderr != "oops\n" || r.Error != nil {
		t.Fatalf("result %+v (error %s), want stdout %q", r, errString(r), want)
	}
	if r.ResultInline != nil || r.ResultRef != nil {
		t.Fatal("result_inline/result_ref must be nil")
	}
}

func TestDefaultWorkdirAndDuration(t *testing.T) {
	s := newShell(t, nil)
	r := run(s, messages.Exec{Command: "sleep 0.05; pwd"})
	if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != s.Workdir || r.DurationMs < 50 {
		t.Fatalf("%+v", r)
	}
}

func TestTimeoutIsMinusTwoAndKillsAfterGrace(t *testing.T) {
	s := newShell(t, nil)
	timeout := 0.2
	start := time.Now()
	// The shell ignores SIGTERM: only the SIGKILL after the grace ends it.
	r := run(s, messages.Exec{Command: `trap "" TERM; echo started; sleep 30 & wait; sleep 30`, TimeoutS: &timeout})
	took := time.Since(start)
	if r.ExitCode != messages.ExitTimeout || r.Stdout != "started\n" || !strings.Contains(errString(r), "timed out after 0.2s") {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
	if took < 350*time.Millisecond || took > 5*time.Second {
		t.Fatalf("took %v: want timeout (200ms) + kill grace (200ms)", took)
	}
}

func TestSpawnFailureIsMinusOne(t *testing.T) {
	s := newShell(t, nil)
	wd := "/nonexistent/dir"
	r := run(s, messages.Exec{Command: "true", Workdir: &wd})
	if r.ExitCode != messages.ExitFailed || errString(r) != "spawn failed: workdir /nonexistent/dir does not exist" {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
	// A relative workdir is under the daemon's; the error names the path
	// that was tried.
	wd = "not-made"
	r = run(s, messages.Exec{Command: "true", Workdir: &wd})
	want := "spawn failed: workdir " + filepath.Join(s.Workdir, "not-made") + " does not exist"
	if r.ExitCode != messages.ExitFailed || errString(r) != want {
		t.Fatalf("%+v error=%s, want %s", r, errString(r), want)
	}
}

// bash is looked up once; when the path found is gone at a start (bash
// moved), the exec looks again and runs.
func TestAMovedBashIsLookedUpAgain(t *testing.T) {
	s := newShell(t, nil)
	s.SetBashPath(filepath.Join(t.TempDir(), "bash-that-was-here"))
	r := run(s, messages.Exec{Command: "echo $0 ran"})
	if r.ExitCode != 0 || r.Stdout != "bash ran\n" {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
	r = run(s, messages.Exec{Command: "echo again"})
	if r.ExitCode != 0 || r.Stdout != "again\n" {
		t.Fatalf("second exec: %+v error=%s", r, errString(r))
	}
}

// A command that starts with "-" is a command, not an option of bash.
func TestCommandStartingWithDashIsACommand(t *testing.T) {
	s := newShell(t, nil)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "-greet"), []byte("#!/bin/sh\necho \"hi $1\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := run(s, messages.Exec{Command: "-greet there", Env: map[string]string{"PATH": bin + ":" + os.Getenv("PATH")}})
	if r.ExitCode != 0 || r.Stdout != "hi there\n" || r.Error != nil {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
	r = run(s, messages.Exec{Command: "--version"})
	if r.ExitCode != 127 || !strings.Contains(r.Stderr, "--version: command not found") {
		t.Fatalf("--version ran as an option of bash: %+v", r)
	}
}

func TestSignalledIsMinusOne(t *testing.T) {
	s := newShell(t, nil)
	r := run(s, messages.Exec{Command: "kill -9 $$"})
	if r.ExitCode != messages.ExitFailed || errString(r) != "killed by signal SIGKILL" {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
}

func TestAbortBeforeSpawnStartsNothing(t *testing.T) {
	s := newShell(t, nil)
	marker := filepath.Join(s.Workdir, "ran")
	ctx, abort := procgroup.WithKill(context.Background())
	abort(errors.New("cancelled"), false)
	r := s.Run(ctx, &messages.Exec{ExecID: "e", Command: "touch " + marker})
	if r.ExitCode != messages.ExitFailed || errString(r) != "cancelled" {
		t.Fatalf("%+v", r)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatal("command ran after abort")
	}
}

func TestAbortRunningKillsTheWholeGroup(t *testing.T) {
	s := newShell(t, nil)
	mark := "NYMPH_TEST_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, v, _ := strings.Cut(mark, "=")
	ctx, abort := procgroup.WithKill(context.Background())
	done := make(chan *messages.ExecResult)
	ready := filepath.Join(s.Workdir, "ready")
	go func() {
		done <- s.Run(ctx, &messages.Exec{ExecID: "e", Command: "sleep 30 & sleep 30 & touch " + ready + "; wait", Env: map[string]string{k: v}})
	}()
	wait.For(t, 10*time.Second, "the exec to be ready", func() bool { _, err := os.Stat(ready); return err == nil })
	if n := len(marked(t, mark)); n < 2 {
		t.Fatalf("expected the shell and its sleeps alive, found %d", n)
	}
	abort(errors.New("exec actor stopped"), true)
	r := <-done
	if r.ExitCode != messages.ExitFailed || errString(r) != "exec actor stopped" {
		t.Fatalf("%+v", r)
	}
	wait.For(t, 10*time.Second, "the group to be gone", func() bool { return len(marked(t, mark)) == 0 })
}

func TestBackgroundLeftoversAreKilledAtExit(t *testing.T) {
	s := newShell(t, nil)
	mark := "NYMPH_TEST_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, v, _ := strings.Cut(mark, "=")
	r := run(s, messages.Exec{Command: "sleep 30 >/dev/null 2>&1 & echo bye", Env: map[string]string{k: v}})
	if r.ExitCode != 0 || r.Stdout != "bye\n" {
		t.Fatalf("%+v", r)
	}
	wait.For(t, 10*time.Second, "the group to be gone", func() bool { return len(marked(t, mark)) == 0 })
}

func TestTruncationStrings(t *testing.T) {
	s := newShell(t, nil)
	big := messages.OutputCap + 1000
	cases := []struct {
		cmd       string
		err       string
		out, errN int
	}{
		{fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", big), messages.ErrStdoutTruncated, messages.OutputCap, 0},
		{fmt.Sprintf("head -c %d /dev/zero | tr '\\0' b >&2", big), messages.ErrStderrTruncated, 0, messages.OutputCap},
		{fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; head -c %d /dev/zero | tr '\\0' b >&2", big, big), messages.ErrBothTruncated, messages.OutputCap, messages.OutputCap},
	}
	for _, c := range cases {
		r := run(s, messages.Exec{Command: c.cmd})
		if r.ExitCode != 0 || errString(r) != c.err || len(r.Stdout) != c.out || len(r.Stderr) != c.errN {
			t.Errorf("%s: exit %d error %q stdout %d stderr %d", c.err, r.ExitCode, errString(r), len(r.Stdout), len(r.Stderr))
		}
	}
	// exactly at the cap is not truncated
	r := run(s, messages.Exec{Command: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a", messages.OutputCap)})
	if r.Error != nil || len(r.Stdout) != messages.OutputCap {
		t.Fatalf("at cap: %s %d", errString(r), len(r.Stdout))
	}
}

func TestStreamingSurvivesFailingChunkEndpoint(t *testing.T) {
	cp := fakecp.New(t)
	cp.Fail(fakecp.RouteChunk, 2, 503)
	s := newShell(t, cp)
	var want bytes.Buffer
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&want, "line%d\n", i)
	}
	r := run(s, messages.Exec{
		ExecID:  "stream-1",
		Command: `for i in $(seq 1 30); do echo line$i; sleep 0.005; done`,
		Log:     &messages.LogSink{StdoutURL: "/v1/daemon/exec/stream-1/chunk", FlushMs: 20, FlushBytes: 32},
	})
	if r.ExitCode != 0 || r.Stdout != "" || r.Stderr != "" || r.Error != nil {
		t.Fatalf("%+v error=%s", r, errString(r))
	}
	if got := cp.Chunks("stream-1"); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("chunks %q\nwant   %q", got, want.String())
	}
	failed, ok := 0, 0
	for _, req := range cp.Requests() {
		if req.Route == fakecp.RouteChunk {
			if req.Status == 503 {
				failed++
			} else {
				ok++
			}
			if req.Header.Get("Content-Type") != "application/octet-stream" {
				t.Fatalf("chunk content type %q", req.Header.Get("Content-Type"))
			}
		}
	}
	if failed != 2 || ok < 1 {
		t.Fatalf("chunk posts: %d failed, %d ok", failed, ok)
	}
}

func TestStreamingMergesStderrAndEndpointDown(t *testing.T) {
	cp := fakecp.New(t)
	cp.Fail(fakecp.RouteChunk, 1000, 500)
	s := newShell(t, cp)
	r := run(s, messages.Exec{
		ExecID:  "down",
		Command: "echo out; echo err >&2; exit 4",
		Log:     &messages.LogSink{StdoutURL: "/v1/daemon/exec/down/chunk", FlushMs: 10},
	})
	if r.ExitCode != 4 || r.Stdout != "" || r.Stderr != "" || r.Error != nil {
		t.Fatalf("a dead chunk endpoint must not fail the exec: %+v %s", r, errString(r))
	}
}

func TestPayloadInlineAndRef(t *testing.T) {
	cp := fakecp.New(t)
	s := newShell(t, cp)
	r := run(s, messages.Exec{Command: `cat "$NYMPH_PAYLOAD"`, PayloadInline: messages.Bytes("inline-bytes")})
	if r.ExitCode != 0 || r.Stdout != "inline-bytes" {
		t.Fatalf("inline: %+v %s", r, errString(r))
	}
	data := []byte("referenced payload")
	sum := sha256.Sum256(data)
	good := hex.EncodeToString(sum[:])
	cp.PutBlob("k1", data)
	r = run(s, messages.Exec{Command: `cat "$NYMPH_PAYLOAD"`, PayloadRef: &messages.PayloadRef{Key: "k1", Size: uint64(len(data)), SHA256: &good}})
	if r.ExitCode != 0 || r.Stdout != string(data) {
		t.Fatalf("ref: %+v %s", r, errString(r))
	}
	matches, _ := filepath.Glob(filepath.Join(s.Workdir, "execs", "*"))
	if len(matches) != 0 {
		t.Fatalf("payload scratch left behind: %v", matches)
	}
}

func TestPayloadSHA256MismatchSpawnsNothing(t *testing.T) {
	cp := fakecp.New(t)
	s := newShell(t, cp)
	cp.PutBlob("k2", []byte("tampered"))
	bad := strings.Repeat("0", 64)
	marker := filepath.Join(s.Workdir, "spawned")
	r := run(s, messages.Exec{Command: "touch " + marker, PayloadRef: &messages.PayloadRef{Key: "k2", SHA256: &bad}})
	if r.ExitCode != messages.ExitFailed || !strings.Contains(errString(r), "sha256 mismatch") {
		t.Fatalf("%+v %s", r, errString(r))
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatal("a child was spawned despite the mismatch")
	}
	r = run(s, messages.Exec{Command: "touch " + marker, PayloadRef: &messages.PayloadRef{Key: "missing"}})
	if r.ExitCode != messages.ExitFailed || !strings.Contains(errString(r), "payload presign") {
		t.Fatalf("missing blob: %+v %s", r, errString(r))
	}
}

func marked(t *testing.T, kv string) []int {
	t.Helper()
	pids, err := orphans.WithEnv("/proc", kv)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// An exec without stdin reads end of file at once, as with an empty pipe.
func TestNoStdinReadsEndOfFile(t *testing.T) {
	r := run(newShell(t, nil), messages.Exec{Command: "wc -c; read -r line || echo eof"})
	if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "0\neof" {
		t.Fatalf("result %+v (error %s)", r, errString(r))
	}
}

// One Shell runs many execs on what it keeps between them (the merged
// environment, the stdin of those without one): each exec's env stays its
// own, and every exec without stdin reads end of file, however many ran
// before it, with or without a stdin of their own.
func TestExecsShareNothingThatLeaks(t *testing.T) {
	s := newShell(t, nil)
	for i, e := range []messages.Exec{
		{Command: `echo "$FOO ${EXTRA-unset}"; wc -c`, Env: map[string]string{"FOO": "over", "EXTRA": "x"}},
		{Command: `echo "$FOO ${EXTRA-unset}"; wc -c`},
		{Command: `echo "$FOO ${EXTRA-unset}"; wc -c`, Stdin: "abc"},
		{Command: `echo "$FOO ${EXTRA-unset}"; wc -c`},
	} {
		// wc pads its count on some systems: compare words.
		want := []string{"over x 0", "base unset 0", "base unset 3", "base unset 0"}[i]
		e.ExecID = fmt.Sprintf("e%d", i)
		r := run(s, e)
		if got := strings.Join(strings.Fields(r.Stdout), " "); r.ExitCode != 0 || got != want {
			t.Fatalf("exec %d: result %+v (error %s), want stdout %q", i, r, errString(r), want)
		}
	}
}

// Each way an exec ends has its outcome for the metrics, the -1s told
// apart: a kill (a signal, an abort) is not a failure to run.
func TestOutcomes(t *testing.T) {
	s := newShell(t, nil)
	missing := "/nonexistent/dir"
	timeout := 0.2
	aborted, abort := procgroup.WithKill(context.Background())
	abort(errors.New("cancelled"), false)
	for _, c := range []struct {
		what string
		ctx  context.Context
		e    messages.Exec
		want string
	}{
		{"exit 0", context.Background(), messages.Exec{Command: "true"}, execs.OutcomeExitZero},
		{"exit 3", context.Background(), messages.Exec{Command: "exit 3"}, execs.OutcomeExitNonzero},
		{"timeout", context.Background(), messages.Exec{Command: "sleep 30", TimeoutS: &timeout}, execs.OutcomeTimeout},
		{"signal", context.Background(), messages.Exec{Command: "kill -9 $$"}, execs.OutcomeKilled},
		{"aborted", aborted, messages.Exec{Command: "true"}, execs.OutcomeKilled},
		{"spawn failure", context.Background(), messages.Exec{Command: "true", Workdir: &missing}, execs.OutcomeFailed},
	} {
		c.e.ExecID = "e-" + strings.ReplaceAll(c.what, " ", "-")
		_, got := s.RunOutcome(c.ctx, &c.e)
		if got != c.want {
			t.Errorf("%s: outcome %q, want %q", c.what, got, c.want)
		}
	}
	for _, o := range []string{execs.OutcomeExitZero, execs.OutcomeExitNonzero, execs.OutcomeTimeout, execs.OutcomeKilled, execs.OutcomeFailed, execs.OutcomeRefused} {
		if !slices.Contains(execs.Outcomes(), o) {
			t.Errorf("Outcomes lacks %s", o)
		}
	}
}
