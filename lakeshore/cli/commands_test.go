package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

func TestListTableAndJSON(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{}, "daemon", "list")
	if r.code != 0 {
		t.Fatalf("list: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "LAST SEEN") {
		t.Fatalf("table:\n%s", r.stdout)
	}
	if !strings.Contains(lines[1], "cpu") || !strings.Contains(lines[1], "stale") || !strings.Contains(lines[1], "5h ago") {
		t.Fatalf("first row (sorted by label) = %q", lines[1])
	}
	if !strings.Contains(lines[4], "gpu-rig-1") || !strings.Contains(lines[4], "process,docker") {
		t.Fatalf("gpu-rig-1 row = %q", lines[4])
	}

	r = f.run(t, runOpts{}, "daemon", "list", "--json")
	var list operatorapi.WorkerList
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || r.code != 0 {
		t.Fatalf("list --json: %v\n%+v", err, r)
	}
	var labels []string
	for _, w := range list.Workers {
		labels = append(labels, w.Label)
	}
	if strings.Join(labels, ",") != "cpu,fleet-00,fleet-01,gpu-rig-1,gpu-rig-2" {
		t.Fatalf("json order = %v", labels)
	}
	// Deterministic: the same call prints the same bytes.
	if again := f.run(t, runOpts{}, "daemon", "list", "--json"); again.stdout != r.stdout {
		t.Fatal("list --json is not deterministic")
	}
}

func TestWatchStopsOnCancel(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(chan struct{}, 100)
	// Cancel once two refreshes have been printed.
	w := writerFunc(func(p []byte) {
		for range strings.Count(string(p), "\n") {
			lines <- struct{}{}
		}
	})
	done := make(chan result, 1)
	go func() { done <- f.run(t, runOpts{ctx: ctx, stdout: w}, "daemon", "list", "--json", "--watch", "0.1") }()
	for range 2 {
		select {
		case <-lines:
		case <-time.After(10 * time.Second):
			t.Fatal("no refresh printed")
		}
	}
	cancel()
	r := <-done
	if r.code != 0 {
		t.Fatalf("watch ended with %+v", r)
	}
	docs := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(docs) < 2 {
		t.Fatalf("want one JSON line per refresh, got %q", r.stdout)
	}
	for _, d := range docs {
		var list operatorapi.WorkerList
		if err := json.Unmarshal([]byte(d), &list); err != nil || len(list.Workers) != 5 {
			t.Fatalf("refresh line %q: %v", d, err)
		}
	}
}

type writerFunc func([]byte)

func (w writerFunc) Write(p []byte) (int, error) { w(p); return len(p), nil }

func TestShowResolvesAndExplainsAmbiguity(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{}, "daemon", "show", "gpu-rig-2")
	if r.code != 0 || !strings.Contains(r.stdout, "aaaa000000000000000000a2") || !strings.Contains(r.stdout, "versions:") {
		t.Fatalf("show: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "show", "--json", "cp")
	var w operatorapi.Worker
	if err := json.Unmarshal([]byte(r.stdout), &w); err != nil || w.ID != "bbbb000000000000000000b1" {
		t.Fatalf("show --json by prefix: %v %+v", err, r)
	}
	r = f.run(t, runOpts{}, "daemon", "show", "gpu")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "ambiguous") ||
		!strings.Contains(r.stderr, "gpu-rig-1") || !strings.Contains(r.stderr, "gpu-rig-2") {
		t.Fatalf("ambiguous show: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "show", "--id", "nope")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, `no daemon has the id "nope"`) {
		t.Fatalf("show --id nope: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "show")
	if r.code != cli.ExitUsage {
		t.Fatalf("show without argument: %+v", r)
	}
}

func TestExecStreamsAndPassesExitCode(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{out: "tick 1\n"}, {out: "tick 2\n"}, {out: "done\n", finish: true, code: 3}}
	r := f.run(t, runOpts{}, "daemon", "exec", "--env", "A=1", "--env", "B=2", "--timeout", "7.5", "--workdir", "/tmp",
		"gpu-rig-1", "echo", "--json", "-x", "--env", "C=3")
	if r.code != 3 {
		t.Fatalf("exit code = %d, want 3 (%+v)", r.code, r)
	}
	if r.stdout != "tick 1\ntick 2\ndone\n" {
		t.Fatalf("stdout = %q", r.stdout)
	}
	req := f.execReqs[0]
	if req.Command != "echo --json -x --env C=3" || !req.Stream || req.TimeoutS != 7.5 || req.Workdir != "/tmp" ||
		len(req.Env) != 2 || req.Env["A"] != "1" || req.Env["B"] != "2" {
		t.Fatalf("exec request = %+v", req)
	}
	// A label one worker has goes straight to the control plane.
	if f.execPaths[0] != "/v1/namespaces/default/workers/gpu-rig-1/exec" || f.execs["exec-1"].worker != "aaaa000000000000000000a1" {
		t.Fatalf("exec path = %s, worker %s", f.execPaths[0], f.execs["exec-1"].worker)
	}
}

func TestExecRetriesWhileTheControlPlaneRestarts(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.failGetExecs = 3
	f.steps = []step{{out: "a\n"}, {out: "b\n", finish: true, code: 0}}
	r := f.run(t, runOpts{}, "daemon", "exec", "cpu", "true")
	if r.code != 0 || r.stdout != "a\nb\n" || f.getExecs < 5 {
		t.Fatalf("result = %+v after %d reads", r, f.getExecs)
	}
}

func TestExecProgressOnATerminal(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{}, {}, {out: "out\n"}, {finish: true}}
	r := f.run(t, runOpts{stderrTTY: true}, "daemon", "exec", "cpu", "true")
	if r.code != 0 || r.stdout != "out\n" {
		t.Fatalf("result = %+v", r)
	}
	if !strings.Contains(r.stderr, "waiting for cpu") || !strings.HasSuffix(r.stderr, "\r\x1b[K") {
		t.Fatalf("progress on stderr = %q", r.stderr)
	}
	// Not a terminal: no progress at all.
	f.steps = []step{{}, {finish: true}}
	if r := f.run(t, runOpts{}, "daemon", "exec", "cpu", "true"); r.stderr != "" {
		t.Fatalf("stderr without a terminal = %q", r.stderr)
	}
}

func TestExecDashDashAndNonStreamingDaemon(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{finish: true, code: 0, result: messages.ExecResult{Stdout: "out\n", Stderr: "err\n"}}}
	r := f.run(t, runOpts{}, "daemon", "exec", "gpu-rig-2", "--", "for i in 1 2; do echo $i; done")
	if r.code != 0 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("result = %+v", r)
	}
	if got := f.execReqs[0].Command; got != "for i in 1 2; do echo $i; done" {
		t.Fatalf("command = %q", got)
	}
}

func TestExecSentinels(t *testing.T) {
	errMsg := "spawn failed: no such file"
	cases := []struct {
		code int32
		res  messages.ExecResult
		want int
		msg  string
	}{
		{code: messages.ExitTimeout, want: cli.ExitExecTimeout, msg: "timed out"},
		{code: messages.ExitFailed, res: messages.ExecResult{Error: &errMsg}, want: cli.ExitExecFailed, msg: errMsg},
		{code: 255, want: 255},
	}
	for _, c := range cases {
		f := newFakeCP(t, fleet()...)
		f.steps = []step{{finish: true, code: c.code, result: c.res}}
		r := f.run(t, runOpts{}, "daemon", "exec", "gpu-rig-1", "true")
		if r.code != c.want || !strings.Contains(r.stderr, c.msg) {
			t.Errorf("exit_code %d: got %+v, want exit %d and %q", c.code, r, c.want, c.msg)
		}
	}
}

func TestExecJSONEnvelope(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{}, {finish: true, code: 7, result: messages.ExecResult{Stdout: "hello\n", DurationMs: 12}}}
	r := f.run(t, runOpts{}, "daemon", "exec", "--json", "gpu-rig-1", "echo", "hello")
	if r.code != 7 {
		t.Fatalf("code = %d (%+v)", r.code, r)
	}
	var ex operatorapi.Exec
	if err := json.Unmarshal([]byte(r.stdout), &ex); err != nil {
		t.Fatalf("envelope %q: %v", r.stdout, err)
	}
	if ex.ExecID != "exec-1" || ex.State != operatorapi.ExecFinished || ex.Result == nil || ex.Result.Stdout != "hello\n" || ex.Result.ExitCode != 7 {
		t.Fatalf("envelope = %+v", ex)
	}
	if f.execReqs[0].Stream {
		t.Fatal("--json asked for streaming")
	}
	if r.stderr != "" {
		t.Fatalf("stderr = %q", r.stderr)
	}
}

func TestExecWaitBudget(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	start := time.Now()
	r := f.run(t, runOpts{}, "daemon", "exec", "--wait", "0.3", "gpu-rig-1", "sleep", "100")
	if r.code != cli.ExitExecWaitExpired || !strings.Contains(r.stderr, "exec-1") || !strings.Contains(r.stderr, "gave up after --wait 0.3s") {
		t.Fatalf("result = %+v", r)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestExecInterruptCancelsRemote(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{out: "started\n"}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	w := writerFunc(func([]byte) { once.Do(cancel) })
	r := f.run(t, runOpts{ctx: ctx, stdout: w}, "daemon", "exec", "gpu-rig-1", "sleep", "100")
	if r.code != cli.ExitInterrupted || r.stdout != "started\n" {
		t.Fatalf("result = %+v", r)
	}
	if len(f.cancels) != 1 || f.cancels[0].ExecID != "exec-1" {
		t.Fatalf("cancels = %+v", f.cancels)
	}
}

func TestExecErrorsExit125(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	for _, args := range [][]string{
		{"daemon", "exec", "gpu"},                  // no command
		{"daemon", "exec", "nope", "true"},         // unknown daemon
		{"daemon", "exec", "gpu", "true"},          // ambiguous
		{"daemon", "exec", "--bogus", "cpu", "ls"}, // unknown flag
		{"daemon", "exec", "--env", "X", "cpu", "ls"},
		{"daemon", "exec"},
		{"exec", "true"}, // no --queue and no terminal
	} {
		r := f.run(t, runOpts{}, args...)
		if r.code != cli.ExitExecCLIFailed || !strings.HasPrefix(r.stderr, "lakeshore: ") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if len(f.execReqs) != 0 {
		t.Fatalf("execs were submitted: %+v", f.execReqs)
	}
	r := f.run(t, runOpts{}, "exec", "true")
	if !strings.Contains(r.stderr, "pass --queue") {
		t.Fatalf("picker error = %q", r.stderr)
	}
}

func TestQueueExec(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{out: "x\n", finish: true}}
	r := f.run(t, runOpts{}, "exec", "--queue", "gpu", "uname", "-a")
	if r.code != 0 || r.stdout != "x\n" {
		t.Fatalf("queue exec: %+v", r)
	}
	if req := f.execReqs[0]; req.Queue != "gpu" || req.Command != "uname -a" || f.execPaths[0] != "/v1/namespaces/default/exec" {
		t.Fatalf("queue exec request = %+v at %s", req, f.execPaths[0])
	}

}

func TestExecStdin(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{finish: true}}
	r := f.run(t, runOpts{stdin: "piped bytes"}, "daemon", "exec", "--stdin", "-", "cpu", "wc", "-c")
	if r.code != 0 || string(f.execReqs[0].Stdin) != "piped bytes" {
		t.Fatalf("stdin: %+v %q", r, f.execReqs[0].Stdin)
	}
	r = f.run(t, runOpts{}, "daemon", "exec", "--stdin", "/no/such/file", "cpu", "wc")
	if r.code != cli.ExitExecCLIFailed || !strings.Contains(r.stderr, "--stdin") {
		t.Fatalf("missing stdin file: %+v", r)
	}
}

func TestKill(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{}, "daemon", "kill", "cpu", "--no-terminate")
	if r.code != 0 || len(f.killed) != 1 || f.killQuery[0] != "terminate=false" || !strings.Contains(r.stdout, "killed cpu") {
		t.Fatalf("kill: %+v %v %v", r, f.killed, f.killQuery)
	}
	r = f.run(t, runOpts{}, "daemon", "kill", "cpu", "--prefix", "x")
	if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "mutually exclusive") {
		t.Fatalf("positional and --prefix: %+v", r)
	}
	// Not a terminal, no --yes: nothing happens, exit 0.
	r = f.run(t, runOpts{}, "daemon", "kill", "--prefix", "fleet")
	if r.code != 0 || len(f.killed) != 1 || !strings.Contains(r.stderr, "cancelled") {
		t.Fatalf("prefix without --yes: %+v", r)
	}
	// A terminal, answered no.
	r = f.run(t, runOpts{stdinTTY: true, stdin: "n\n"}, "daemon", "kill", "--prefix", "fleet")
	if r.code != 0 || len(f.killed) != 1 {
		t.Fatalf("prefix answered no: %+v", r)
	}
	// A terminal, answered yes.
	r = f.run(t, runOpts{stdinTTY: true, stdin: "y\n"}, "daemon", "kill", "--prefix", "fleet", "--json")
	var sum cli.KillSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil || r.code != 0 || sum.Count != 2 {
		t.Fatalf("prefix yes --json: %v %+v", err, r)
	}
	if f.killed[1] != "cccc000000000000000000c1" || f.killed[2] != "cccc000000000000000000c2" || f.killQuery[1] != "" {
		t.Fatalf("killed = %v %q", f.killed, f.killQuery)
	}
	r = f.run(t, runOpts{}, "daemon", "kill", "--prefix", "gpu", "--yes")
	if r.code != 0 || len(f.killed) != 5 {
		t.Fatalf("prefix --yes: %+v %v", r, f.killed)
	}
	r = f.run(t, runOpts{}, "daemon", "kill", "--prefix", "zzz", "--yes")
	if r.code != 0 || !strings.Contains(r.stderr, "nothing to kill") {
		t.Fatalf("prefix with no match: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "kill", "--id", "nope")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "HTTP 404") {
		t.Fatalf("kill unknown id: %+v", r)
	}
}

func TestCleanup(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "24", "--dry-run", "--json")
	var resp operatorapi.CleanupResponse
	if err := json.Unmarshal([]byte(r.stdout), &resp); err != nil || r.code != 0 || resp.Count != 2 || !resp.DryRun {
		t.Fatalf("dry run: %v %+v", err, r)
	}
	if f.cleanups[0].OlderThanHours != 24 || !f.cleanups[0].DryRun {
		t.Fatalf("request = %+v", f.cleanups[0])
	}
	// Without --yes on a non-terminal: cancelled, exit 0, nothing deleted.
	r = f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "2h")
	if r.code != 0 || !strings.Contains(r.stderr, "cancelled") || len(f.workers) != 5 {
		t.Fatalf("cleanup without --yes: %+v", r)
	}
	for _, c := range f.cleanups {
		if !c.DryRun {
			t.Fatal("a deleting cleanup was sent without --yes")
		}
	}
	r = f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "1d", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 2 daemons") || len(f.workers) != 3 {
		t.Fatalf("cleanup --yes: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "30m", "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 1 daemon") || len(f.workers) != 2 {
		t.Fatalf("cleanup 30m: %+v", r)
	}
	last := f.cleanups[len(f.cleanups)-1]
	if last.OlderThanHours != 0.5 || last.DryRun {
		t.Fatalf("30m request = %+v", last)
	}
	r = f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "200h", "--yes")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "olderThanHours") || !strings.Contains(r.stderr, "HTTP 400") {
		t.Fatalf("cleanup 200h: %+v", r)
	}
	r = f.run(t, runOpts{}, "daemon", "cleanup", "--older-than", "soon")
	if r.code != cli.ExitUsage {
		t.Fatalf("bad --older-than: %+v", r)
	}
}

func TestHibernate(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	before := time.Now()
	r := f.run(t, runOpts{}, "daemon", "hibernate", "gpu-rig-1", "--until", "+1h")
	if r.code != 0 || !strings.Contains(r.stdout, "hibernates until") {
		t.Fatalf("hibernate: %+v", r)
	}
	got := time.Unix(f.hibernate[0].UntilEpochS, 0)
	if d := got.Sub(before.Add(time.Hour)); d < 0 || d > 5*time.Second {
		t.Fatalf("until = %v, want about now+1h", got)
	}
	f.hibernateErr = &operatorapi.Error{Error: "untilEpochS is in the past", Field: "untilEpochS"}
	r = f.run(t, runOpts{}, "daemon", "hibernate", "gpu-rig-1", "--until", "2020-01-01T00:00:00Z")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "lakeshore: untilEpochS is in the past") || !strings.Contains(r.stderr, "HTTP 400") {
		t.Fatalf("past deadline: %+v", r)
	}
	if f.hibernate[1].UntilEpochS != time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).Unix() {
		t.Fatalf("sent %+v", f.hibernate[1])
	}
	for _, bad := range [][]string{{"--until", "tomorrow"}, {}} {
		r = f.run(t, runOpts{}, append([]string{"daemon", "hibernate", "gpu-rig-1"}, bad...)...)
		if r.code != cli.ExitUsage {
			t.Errorf("hibernate %v: %+v", bad, r)
		}
	}
}

func TestSetupResetCancelToken(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{stdin: "apt-get install -y jq\n"}, "daemon", "setup", "cpu", "--script", "-", "--sudo", "--refresh-capabilities", "--name", "jq", "--json")
	var q operatorapi.Queued
	if err := json.Unmarshal([]byte(r.stdout), &q); err != nil || r.code != 0 || q.Kind != "setup" {
		t.Fatalf("setup: %v %+v", err, r)
	}
	if s := f.setups[0]; s.Script != "apt-get install -y jq\n" || !s.Sudo || !s.RefreshCapabilities || s.Name != "jq" {
		t.Fatalf("setup request = %+v", s)
	}
	if r := f.run(t, runOpts{}, "daemon", "setup", "cpu"); r.code != cli.ExitUsage {
		t.Fatalf("setup without --script: %+v", r)
	}

	r = f.run(t, runOpts{}, "daemon", "commands", "cpu")
	if r.code != 0 || !strings.Contains(r.stdout, "c1") || !strings.Contains(r.stdout, "queued") {
		t.Fatalf("commands: %+v", r)
	}

	r = f.run(t, runOpts{}, "daemon", "reset", "gpu-rig-2")
	if r.code != 0 || f.resets[0] != "aaaa000000000000000000a2" || !strings.Contains(r.stdout, "reset_backoff") {
		t.Fatalf("reset: %+v", r)
	}

	r = f.run(t, runOpts{}, "daemon", "cancel", "cpu", "--invocation", "inv-1")
	if r.code != 0 || f.cancels[0].InvocationID != "inv-1" || f.cancels[0].ExecID != "" {
		t.Fatalf("cancel: %+v %+v", r, f.cancels)
	}
	for _, bad := range [][]string{{}, {"--exec", "e", "--invocation", "i"}} {
		if r := f.run(t, runOpts{}, append([]string{"daemon", "cancel", "cpu"}, bad...)...); r.code != cli.ExitUsage {
			t.Errorf("cancel %v: %+v", bad, r)
		}
	}

	r = f.run(t, runOpts{}, "token", "create", "--enroll", "--ttl", "1h")
	if r.code != 0 || r.stdout != "dlt_minted\n" || f.tokens[0].Kind != operatorapi.TokenEnroll || f.tokens[0].TTLS != 3600 {
		t.Fatalf("token: %+v %+v", r, f.tokens)
	}
	r = f.run(t, runOpts{}, "token", "create")
	if r.code != 0 || f.tokens[1].Kind != operatorapi.TokenDaemon || f.tokens[1].TTLS != 0 {
		t.Fatalf("daemon token: %+v %+v", r, f.tokens)
	}
}

func TestErrorsAndUsage(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	r := f.run(t, runOpts{env: map[string]string{cli.EnvAdminToken: "wrong"}}, "daemon", "list")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "HTTP 401") || !strings.Contains(r.stderr, "LAKESHORE_ADMIN_TOKEN") {
		t.Fatalf("wrong token: %+v", r)
	}
	r = f.run(t, runOpts{env: map[string]string{cli.EnvURL: "http://127.0.0.1:1"}}, "daemon", "list")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "cannot reach the control plane") {
		t.Fatalf("no server: %+v", r)
	}
	for _, args := range [][]string{{"bogus"}, {"daemon", "bogus"}, {"daemon", "list", "--bogus"}, {"daemon", "list", "extra"}, {"daemon", "kill"}} {
		r := f.run(t, runOpts{}, args...)
		if r.code != cli.ExitUsage || !strings.HasPrefix(r.stderr, "lakeshore: ") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	r = runCLI(t, runOpts{}, map[string]string{"HOME": t.TempDir()}, "daemon", "list")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "no control plane configured") {
		t.Fatalf("unconfigured: %+v", r)
	}
	r = f.run(t, runOpts{}, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Exit codes") {
		t.Fatalf("help: %+v", r)
	}
}

func TestNamespaceFlag(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{finish: true}}
	r := f.run(t, runOpts{}, "-n", "lab", "daemon", "exec", "--id", "aaaa000000000000000000a1", "true")
	if r.code != 0 {
		t.Fatalf("result = %+v", r)
	}
	// --id reads the worker by id first: it must be one.
	if len(f.paths) < 2 || f.paths[0] != "GET /v1/namespaces/lab/workers/aaaa000000000000000000a1" ||
		f.paths[1] != "POST /v1/namespaces/lab/workers/aaaa000000000000000000a1/exec" {
		t.Fatalf("paths = %v", f.paths)
	}
	f.steps = []step{{finish: true}}
	r = f.run(t, runOpts{env: map[string]string{cli.EnvNamespace: "env-ns"}}, "daemon", "list")
	if r.code != 0 || f.paths[len(f.paths)-1] != "GET /v1/namespaces/env-ns/workers" {
		t.Fatalf("env namespace: %+v %v", r, f.paths)
	}
}

func TestLocalStatusWhenNothingRuns(t *testing.T) {
	r := runCLI(t, runOpts{}, map[string]string{}, "daemon", "status", "--json")
	var rep cli.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != cli.ExitNotRunning || rep.Running || rep.Processes == nil {
		t.Fatalf("status: %v %+v", err, r)
	}
	r = runCLI(t, runOpts{}, map[string]string{}, "daemon", "stop")
	if r.code != 0 || !strings.Contains(r.stderr, "nothing to stop") {
		t.Fatalf("stop: %+v", r)
	}
	r = runCLI(t, runOpts{}, map[string]string{}, "daemon", "stop", "abc")
	if r.code != cli.ExitUsage {
		t.Fatalf("stop abc: %+v", r)
	}
}

func TestCompletionScripts(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	for _, sh := range []string{"bash", "zsh", "fish"} {
		r := f.run(t, runOpts{}, "completion", sh)
		if r.code != 0 || !strings.Contains(r.stdout, "lakeshore") {
			t.Errorf("completion %s: code %d, %d bytes", sh, r.code, len(r.stdout))
		}
	}
	r := f.run(t, runOpts{}, "__complete", "daemon", "show", "gpu")
	if r.code != 0 || !strings.Contains(r.stdout, "gpu-rig-1\t") || !strings.Contains(r.stdout, "gpu-rig-2\t") || strings.Contains(r.stdout, "cpu\t") {
		t.Fatalf("dynamic completion: %+v", r)
	}
	r = f.run(t, runOpts{}, "__complete", "daemon", "exec", "")
	if !strings.Contains(r.stdout, "fleet-01\t") {
		t.Fatalf("exec completion: %+v", r)
	}
	r = f.run(t, runOpts{}, "__complete", "exec", "--queue", "")
	if !strings.Contains(r.stdout, "gpu\n") {
		t.Fatalf("queue completion: %+v", r)
	}
}

// A label prefix is not something the control plane resolves: the CLI
// falls back to the list, and the exec goes to the one daemon it names.
func TestExecByLabelPrefix(t *testing.T) {
	f := newFakeCP(t, fleet()...)
	f.steps = []step{{out: "ok\n", finish: true}}
	r := f.run(t, runOpts{}, "daemon", "exec", "cp", "true")
	if r.code != 0 || r.stdout != "ok\n" {
		t.Fatalf("result = %+v", r)
	}
	if len(f.execPaths) != 1 || f.execPaths[0] != "/v1/namespaces/default/workers/bbbb000000000000000000b1/exec" {
		t.Fatalf("exec paths = %v", f.execPaths)
	}
}
