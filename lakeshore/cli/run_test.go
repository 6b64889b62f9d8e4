package cli_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/wait"
)

// simDaemon polls a real control plane over msgpack as nymph does and
// answers each run at once: echo for most functions, a failure for
// qualname "fail", killed for "kill", the script text for a script, and
// nothing at all for "hang" (until it is cancelled).
type simDaemon struct {
	url, id, cursor string
	runs            chan *messages.Run
	// talk holds a "talk" run between its first line of output and the
	// rest, until the test closes it.
	talk chan struct{}
	mu   sync.Mutex
	errs []error
}

func (s *simDaemon) call(ctx context.Context, path string, body, out any) error {
	b, err := messages.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", messages.ContentType)
	req.Header.Set("Authorization", "Bearer "+realDaemon)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s %q", path, resp.Status, raw)
	}
	if out == nil {
		return nil
	}
	return messages.Unmarshal(raw, out)
}

func startSimDaemon(t *testing.T, cp *realCP, queue string, runners ...string) *simDaemon {
	t.Helper()
	s := &simDaemon{url: cp.url, runs: make(chan *messages.Run, 100), talk: make(chan struct{})}
	v, proto := "0.1.0", messages.ProtocolVersion
	var hr messages.HelloResponse
	if err := s.call(context.Background(), "/v1/daemon/hello", messages.HelloRequest{
		MachineID: "sim", Label: "sim", Tags: []string{},
		Capabilities: messages.Capabilities{Runners: runners},
		Versions:     messages.Versions{Daemon: &v, Protocol: &proto},
	}, &hr); err != nil || hr.WorkerID == nil {
		t.Fatalf("hello: %v %+v", err, hr)
	}
	s.id, s.cursor = *hr.WorkerID, *hr.Cursor
	// A first, non-blocking poll records the poll queue before any test
	// submits to it.
	var resp messages.PollResponse
	if err := s.call(context.Background(), "/v1/daemon/poll", messages.PollRequest{WorkerID: s.id, Queue: queue, Cursor: &s.cursor,
		Invocations: []messages.InvocationStatus{}}, &resp); err != nil {
		t.Fatalf("first poll: %v", err)
	}
	s.cursor = *resp.Cursor
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			var resp messages.PollResponse
			cur := s.cursor
			err := s.call(ctx, "/v1/daemon/poll", messages.PollRequest{WorkerID: s.id, Queue: queue, TimeoutS: 5, Cursor: &cur,
				Invocations: []messages.InvocationStatus{}}, &resp)
			if err != nil {
				if ctx.Err() == nil {
					s.fail(err)
				}
				return
			}
			s.cursor = *resp.Cursor
			for _, c := range resp.Commands {
				if run, ok := messages.DecodeCommand(c).(*messages.Run); ok {
					s.runs <- run
					if err := s.answer(ctx, run); err != nil {
						s.fail(err)
					}
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, err := range s.errs {
			t.Errorf("simulated daemon: %v", err)
		}
	})
	return s
}

func (s *simDaemon) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, err)
}

func (s *simDaemon) answer(ctx context.Context, run *messages.Run) error {
	args := []byte(run.ArgsBlob)
	if ref := run.PayloadRef; ref != nil {
		var ps messages.PresignResponse
		key := ref.Key
		if err := s.call(ctx, "/v1/namespaces/default/payloads/presign", &messages.PresignRequest{Op: messages.PresignGet, Key: &key}, &ps); err != nil {
			return err
		}
		resp, err := http.Get(ps.URL)
		if err != nil {
			return err
		}
		args, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		sum := sha256.Sum256(args)
		if ref.SHA256 == nil || hex.EncodeToString(sum[:]) != *ref.SHA256 || uint64(len(args)) != ref.Size {
			return errors.New("payload does not match its ref")
		}
	}
	ack := &messages.Ack{InvocationID: run.InvocationID, WorkerID: s.id, State: messages.StateSucceeded, ResultBlob: args}
	switch {
	case run.Script != nil:
		ack.ResultBlob = messages.Bytes(*run.Script)
	case run.Function.Qualname == "fail":
		tb := "Traceback (most recent call last):\n  File \"m.py\", line 1\nValueError: bad value"
		ack = &messages.Ack{InvocationID: run.InvocationID, WorkerID: s.id, State: messages.StateFailed,
			Error: &messages.AckError{Type: "ValueError", Message: "bad value", Traceback: &tb}}
	case run.Function.Qualname == "kill":
		ack = &messages.Ack{InvocationID: run.InvocationID, WorkerID: s.id, State: messages.StateKilled,
			Error: &messages.AckError{Type: "Timeout", Message: "timed out after 1s"}}
	case run.Function.Qualname == "hang":
		return nil
	case run.Function.Qualname == "talk":
		// Output as nymph streams it: a first line, then (once the test
		// lets it go) a warning and a last line, then the result.
		if err := s.output(ctx, run.InvocationID, 1, messages.StreamStdout, "first line\n"); err != nil {
			return err
		}
		select {
		case <-s.talk:
		case <-ctx.Done():
			return nil
		}
		if err := s.output(ctx, run.InvocationID, 2, messages.StreamStderr, "a warning\n"); err != nil {
			return err
		}
		if err := s.output(ctx, run.InvocationID, 3, messages.StreamStdout, "last line\n"); err != nil {
			return err
		}
		ack.ResultBlob = messages.Bytes("42")
	case run.Function.Qualname == "chatty":
		// More output than `invocations show` prints.
		for seq := uint64(1); seq <= 3; seq++ {
			if err := s.output(ctx, run.InvocationID, seq, messages.StreamStdout, strings.Repeat(fmt.Sprintf("chunk %d ", seq), 4<<10)+"\n"); err != nil {
				return err
			}
		}
	}
	return s.call(ctx, "/v1/daemon/ack", ack, nil)
}

// output posts one piece of a run's output, as nymph does.
func (s *simDaemon) output(ctx context.Context, inv string, seq uint64, stream, text string) error {
	ev, err := messages.NewEvent(inv, messages.EventInvocationLog, s.id,
		&messages.LogData{Stream: stream, Seq: seq, Data: messages.Bytes(text)}, time.Now())
	if err != nil {
		return err
	}
	return s.call(ctx, "/v1/daemon/event", ev, nil)
}

func TestRunPrintsResultsAndExitCodes(t *testing.T) {
	cp := newRealCP(t)
	startSimDaemon(t, cp, "work*", "echo", "python")

	r := cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "echo", "--args-json", `{"a": [1, 2.5, "x", true, null], "big": 18446744073709551615}`, "m:f")
	var got map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil {
		t.Fatalf("echo run: %+v", r)
	}
	if fmt.Sprint(got["a"]) != "[1 2.5 x true <nil>]" || fmt.Sprint(got["big"]) != "1.8446744073709552e+19" {
		t.Fatalf("decoded result %v", got)
	}

	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	os.WriteFile(raw, []byte("hello raw\n"), 0o600)
	if r := cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "echo", "--args-file", raw, "m:f"); r.code != 0 || r.stdout != "hello raw\n" {
		t.Fatalf("raw args: %+v", r)
	}
	if r := cp.run(runOpts{stdin: "from stdin"}, "run", "--queue", "work-2", "--args-file", "-", "m:f"); r.code != 0 || r.stdout != "from stdin" {
		t.Fatalf("stdin args: %+v", r)
	}

	// Large args go through the payload store, and come back intact.
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10)
	bigFile := filepath.Join(dir, "big")
	os.WriteFile(bigFile, big, 0o600)
	if r := cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "echo", "--args-file", bigFile, "m:f"); r.code != 0 || r.stdout != string(big) {
		t.Fatalf("1 MiB args: code %d, %d bytes out, stderr %q", r.code, len(r.stdout), r.stderr)
	}

	script := filepath.Join(dir, "job.sh")
	os.WriteFile(script, []byte("echo hi\n"), 0o600)
	if r := cp.run(runOpts{}, "run", "--queue", "work-1", "--script", script); r.code != 0 || r.stdout != "echo hi\n" {
		t.Fatalf("script: %+v", r)
	}

	r = cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "python", "m:fail")
	if r.code != 1 || !strings.Contains(r.stderr, "failed on sim") || !strings.Contains(r.stderr, "ValueError: bad value") ||
		!strings.Contains(r.stderr, "Traceback (most recent call last)") || r.stdout != "" {
		t.Fatalf("failed run: %+v", r)
	}
	r = cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "python", "m:kill")
	if r.code != 2 || !strings.Contains(r.stderr, "was killed") || !strings.Contains(r.stderr, "Timeout: timed out after 1s") {
		t.Fatalf("killed run: %+v", r)
	}

	r = cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "echo", "--args-json", `[1]`, "--json", "m:f")
	var env operatorapi.Invocation
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &env) != nil || env.State != "succeeded" || !bytes.Equal(env.Result, []byte{0x91, 0x01}) ||
		env.WorkerLabel != "sim" || env.Function.Module != "m" {
		t.Fatalf("--json: %+v", r)
	}
	r = cp.run(runOpts{}, "run", "--queue", "work-1", "--runner", "python", "--json", "m:fail")
	if r.code != 1 || json.Unmarshal([]byte(r.stdout), &env) != nil || env.Error == nil || env.Error.Type != "ValueError" {
		t.Fatalf("--json failure: %+v", r)
	}

	// --no-wait, then show and list.
	r = cp.run(runOpts{}, "run", "--no-wait", "--queue", "work-1", "--runner", "echo", "--args-json", `"s"`, "m:f")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || len(id) != 26 {
		t.Fatalf("--no-wait: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "show", "--wait", id)
	if r.code != 0 || !strings.Contains(r.stdout, "succeeded") || !strings.Contains(r.stdout, `"s"`) || !strings.Contains(r.stdout, "daemon:") {
		t.Fatalf("show --wait: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "list", "--json", "--state", "failed")
	var list operatorapi.InvocationList
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Invocations) != 2 {
		t.Fatalf("list --state failed: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "list")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ID") || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "ValueError: bad value") {
		t.Fatalf("list: %+v", r)
	}
}

func TestRunRefusalsWaitsAndCancels(t *testing.T) {
	cp := newRealCP(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--queue", "q", "--runner", "kubernetes", "m:f"}, 1, `unknown runner kind "kubernetes"`},
		{[]string{"run", "--queue", "q", "--runner", "docker", "sh"}, 1, "runConfig.image is required for the docker runner"},
		{[]string{"run", "--queue", "q", "justamodule"}, 1, `is not "module:qualname"`},
		{[]string{"run", "--queue", "q"}, 2, "missing the function"},
		{[]string{"run", "--queue", "q", "--args-json", "{bad", "m:f"}, 2, "--args-json: not valid JSON"},
		{[]string{"run", "--queue", "q", "--args-json", "1", "--args-file", "x", "m:f"}, 2, "not both"},
		{[]string{"run", "--queue", "q", "--script", "/no/such/file"}, 1, "no such file"},
		{[]string{"invocations", "list", "--state", "bogus"}, 2, "--state"},
		{[]string{"invocations", "show", "nope"}, 1, `no invocation "nope"`},
	} {
		r := cp.run(runOpts{}, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("%v: %+v", tc.args, r)
		}
	}

	// Nobody polls "idle": a bounded wait gives up with 253 and says so.
	r := cp.run(runOpts{}, "run", "--queue", "idle", "--wait", "0.3", "m:f")
	if r.code != cli.ExitExecWaitExpired || !strings.Contains(r.stderr, `no daemon in queue "idle"`) || !strings.Contains(r.stderr, "is still queued: no daemon has picked it up yet") {
		t.Fatalf("bounded wait: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "list", "--json", "--queue", "idle")
	var list operatorapi.InvocationList
	if json.Unmarshal([]byte(r.stdout), &list) != nil || len(list.Invocations) != 1 {
		t.Fatalf("list: %+v", r)
	}
	id := list.Invocations[0].ID
	if r := cp.run(runOpts{}, "invocations", "cancel", id); r.code != 0 || !strings.Contains(r.stdout, "cancelled invocation "+id) {
		t.Fatalf("cancel: %+v", r)
	}
	if r := cp.run(runOpts{}, "invocations", "show", id, "--json"); r.code != 0 || !strings.Contains(r.stdout, `"state": "cancelled"`) {
		t.Fatalf("show cancelled: %+v", r)
	}
	if r := cp.run(runOpts{}, "invocations", "cancel", id); r.code != 1 || !strings.Contains(r.stderr, "already cancelled") {
		t.Fatalf("cancel again: %+v", r)
	}

	// Ctrl-C while a daemon runs it: lakeshore asks the daemon to stop it.
	d := startSimDaemon(t, cp, "hangs", "python")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- cp.run(runOpts{ctx: ctx}, "run", "--queue", "hangs", "m:hang") }()
	var run *messages.Run
	select {
	case run = <-d.runs:
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon never got the run")
	}
	cancel()
	r = <-done
	if r.code != cli.ExitInterrupted || !strings.Contains(r.stderr, "invocation "+run.InvocationID+" is being cancelled") {
		t.Fatalf("interrupted: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "show", "--json", run.InvocationID)
	if r.code != 0 || !strings.Contains(r.stdout, `"state": "running"`) {
		t.Fatalf("after the interrupt: %+v", r)
	}
}

func TestJSONToMsgpackAndBack(t *testing.T) {
	for _, doc := range []string{`[1, -2, 3.5, "x", {"k": [true, null]}]`, `{"n": 9007199254740993}`, `"just a string"`, `0`} {
		b, err := cli.JSONToMsgpack([]byte(doc))
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		js, ok := cli.MsgpackToJSON(b)
		if !ok {
			t.Fatalf("%s: does not decode back", doc)
		}
		var a, c any
		json.Unmarshal([]byte(doc), &a)
		json.Unmarshal(js, &c)
		if fmt.Sprint(a) != fmt.Sprint(c) {
			t.Fatalf("%s came back as %s", doc, js)
		}
	}
	if b, _ := cli.JSONToMsgpack([]byte(`{"n": 9007199254740993}`)); !bytes.Contains(b, []byte{0xcf, 0, 0x20, 0, 0, 0, 0, 0, 1}) && !bytes.Contains(b, []byte{0xd3, 0, 0x20, 0, 0, 0, 0, 0, 1}) {
		t.Fatalf("a large integer lost precision: %x", b)
	}
	for _, bad := range []string{"", "{", "1 2", `{"a":1}x`} {
		if _, err := cli.JSONToMsgpack([]byte(bad)); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	for _, raw := range [][]byte{[]byte("hello\n"), {0xc1}, {0x92, 0x01}} {
		if _, ok := cli.MsgpackToJSON(raw); ok {
			t.Fatalf("%x read as one msgpack value", raw)
		}
	}
	if js, ok := cli.MsgpackToJSON([]byte{0x81, 0x01, 0xa1, 'x'}); !ok || !strings.Contains(string(js), `"1": "x"`) {
		t.Fatalf("integer map key: %s %v", js, ok)
	}
}

// The output of a run is printed while it runs (stdout to stdout, stderr to
// stderr, before the result), and afterwards by `invocations show` and
// `invocations logs`.
func TestRunPrintsOutputLiveAndAfter(t *testing.T) {
	cp := newRealCP(t)
	sim := startSimDaemon(t, cp, "talk", "process")
	// The run says no more until `run` has printed its first line: what
	// `run` prints, it prints live.
	var once sync.Once
	var seen bytes.Buffer
	sink := writerFunc(func(p []byte) {
		seen.Write(p)
		if strings.Contains(seen.String(), "first line") {
			once.Do(func() { close(sim.talk) })
		}
	})
	r := cp.run(runOpts{stdout: sink}, "run", "--queue", "talk", "--runner", "process", "m:talk")
	if r.code != 0 || r.stdout != "first line\nlast line\n42" || !strings.Contains(r.stderr, "a warning\n") {
		t.Fatalf("run: %+v", r)
	}
	id := (<-sim.runs).InvocationID

	r = cp.run(runOpts{}, "invocations", "show", id)
	if r.code != 0 || !strings.Contains(r.stdout, "output:\n  first line\n  a warning\n  last line\n") || strings.Contains(r.stdout, "capped") {
		t.Fatalf("show: %+v", r)
	}
	r = cp.run(runOpts{}, "invocations", "logs", id)
	if r.code != 0 || r.stdout != "first line\nlast line\n" || r.stderr != "a warning\n" {
		t.Fatalf("logs: %+v", r)
	}
	// Following a run that is over prints it all and returns.
	if f := cp.run(runOpts{}, "invocations", "logs", "--follow", id); f.code != 0 || f.stdout != r.stdout || f.stderr != r.stderr {
		t.Fatalf("logs --follow of a finished run: %+v", f)
	}
	r = cp.run(runOpts{}, "invocations", "logs", "--json", id)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 {
		t.Fatalf("logs --json: %+v", r)
	}
	var second struct {
		Seq    int64  `json:"seq"`
		Stream string `json:"stream"`
		Text   string `json:"text"`
		TS     string `json:"ts"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil || second.Seq != 2 || second.Stream != "stderr" ||
		second.Text != "a warning\n" || second.TS == "" {
		t.Fatalf("logs --json line 2: %q %v", lines[1], err)
	}
	if r := cp.run(runOpts{}, "invocations", "logs", "nosuch"); r.code == 0 || !strings.Contains(r.stderr, `no invocation "nosuch"`) {
		t.Fatalf("logs of an unknown invocation: %+v", r)
	}

	// A run that says more than `show` prints: the start, and a note.
	if r := cp.run(runOpts{}, "run", "--queue", "talk", "--runner", "process", "--no-wait", "m:chatty"); r.code != 0 {
		t.Fatalf("chatty run: %+v", r)
	}
	id = (<-sim.runs).InvocationID
	if r := cp.run(runOpts{}, "invocations", "show", "--wait", id); r.code != 0 || !strings.Contains(r.stdout, "chunk 1") ||
		strings.Contains(r.stdout, "chunk 3") || !strings.Contains(r.stdout, "… output capped at 64 KiB; see `lakeshore invocations logs "+id+"`") {
		t.Fatalf("show of a long output: code %d, %d bytes, stderr %q, tail %q", r.code, len(r.stdout), r.stderr, r.stdout[max(0, len(r.stdout)-200):])
	}
	if r := cp.run(runOpts{}, "invocations", "logs", id); r.code != 0 || !strings.Contains(r.stdout, "chunk 3") || len(r.stdout) < 3*8*(4<<10) {
		t.Fatalf("logs of a long output: code %d, %d bytes", r.code, len(r.stdout))
	}
}

// What daemons report about setups and updates: `daemon list` says when the
// newest setup failed, `daemon show` lists the recent outcomes.
func TestDaemonListAndShowOutcomes(t *testing.T) {
	cp := newRealCP(t)
	sim := startSimDaemon(t, cp, "q", "process")
	script := filepath.Join(t.TempDir(), "setup.sh")
	os.WriteFile(script, []byte("apt-get install -y nosuch\n"), 0o600)
	r := cp.run(runOpts{}, "daemon", "setup", "sim", "--script", script, "--json")
	var q operatorapi.Queued
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil {
		t.Fatalf("setup: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "list"); r.code != 0 || strings.Contains(r.stdout, "setup failed") {
		t.Fatalf("list before the outcome: %+v", r)
	}
	post := func(id, kind string, data any) {
		t.Helper()
		ev, err := messages.NewEvent(id, kind, sim.id, data, time.Now())
		if err == nil {
			err = sim.call(context.Background(), "/v1/daemon/event", ev, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	post(q.CommandID, messages.EventSetupFinished, &messages.SetupOutcome{Name: "setup", State: messages.StateFailed, ExitCode: 9,
		DurationMs: 1500, OutputTail: "Reading package lists...\nE: Unable to locate package nosuch\n"})
	reason := "ota: sha256 mismatch: downloaded 10 bytes hash to ab, the command says 00"
	post(messages.AutoUpdateEventID("2.0.0", time.Now()), messages.EventOtaFinished, &messages.OtaOutcome{Source: messages.OtaSourceAuto,
		Version: "2.0.0", Outcome: messages.OtaRefused, Code: messages.OtaCodeChecksumMismatch, Reason: &reason})

	// The simulated daemon acknowledges the setup with the cursor of its
	// next poll, and only then is the worker active again.
	wait.For(t, 30*time.Second, "the setup to be acknowledged", func() bool {
		var w operatorapi.Worker
		r := cp.run(runOpts{}, "daemon", "show", "sim", "--json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &w) == nil && w.State == operatorapi.StateActive
	})
	r = cp.run(runOpts{}, "daemon", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "active, setup failed (exit 9)") {
		t.Fatalf("list: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "show", "sim")
	for _, want := range []string{"recent outcomes:", "auto-update-2.0.0-", "refused 2.0.0 (auto-update): checksum mismatch (" + reason + ")",
		q.CommandID, "setup failed with exit 9 after 1.5s", "-- output tail of setup " + q.CommandID + " --",
		"  | E: Unable to locate package nosuch", "active, setup failed (exit 9)"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("show lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Index(r.stdout, "refused 2.0.0") > strings.Index(r.stdout, "failed with exit 9") {
		t.Fatalf("outcomes not newest first:\n%s", r.stdout)
	}
	var w operatorapi.Worker
	r = cp.run(runOpts{}, "daemon", "show", "sim", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &w) != nil || len(w.Outcomes) != 2 || w.Outcomes[1].Setup == nil ||
		w.Outcomes[1].Setup.ExitCode != 9 || w.LastSetup == nil || w.Outcomes[0].Ota == nil || w.Outcomes[0].Ota.Code != "checksum_mismatch" {
		t.Fatalf("show --json: %+v", r)
	}
	// A setup that then succeeds clears the flag.
	r = cp.run(runOpts{}, "daemon", "setup", "sim", "--script", script, "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil {
		t.Fatalf("second setup: %+v", r)
	}
	post(q.CommandID, messages.EventSetupFinished, &messages.SetupOutcome{Name: "setup", State: messages.StateSucceeded, DurationMs: 20})
	if r := cp.run(runOpts{}, "daemon", "list"); r.code != 0 || strings.Contains(r.stdout, "setup failed") {
		t.Fatalf("list after a good setup: %+v", r)
	}
}
