package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// camelKey is the operator JSON's key convention.
var camelKey = regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)

// dataMaps are the objects whose keys are data, not field names (an
// environment's variable names).
var dataMaps = map[string]bool{"env": true}

// badKeys walks a JSON document and returns the object keys, by path, that
// are not camelCase.
func badKeys(path string, v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if !camelKey.MatchString(k) {
				out = append(out, path+"."+k)
			}
			if dataMaps[k] {
				continue
			}
			out = append(out, badKeys(path+"."+k, e)...)
		}
	case []any:
		for _, e := range v {
			out = append(out, badKeys(path+"[]", e)...)
		}
	}
	return out
}

// Every key of what the daemon verbs print with --json is camelCase,
// capabilities included (they were Runners, MaxInvocations, Workdir).
func TestDaemonJSONKeysAreCamelCase(t *testing.T) {
	cp := newRealCP(t)
	cp.hello("gpu-rig", "x86_64")
	for _, args := range [][]string{
		{"daemon", "list", "--json"},
		{"daemon", "show", "gpu-rig", "--json"},
		{"daemon", "hibernate", "gpu-rig", "--until", "+1h", "--json"},
		{"daemon", "wake", "gpu-rig", "--json"},
		{"daemon", "commands", "gpu-rig", "--json"},
		{"daemon", "reset", "gpu-rig", "--json"},
		{"daemon", "target-version", "--json"},
		{"token", "create", "--json"},
		{"token", "list", "--json"},
		{"queue", "list", "--json"},
		{"release", "list", "--json"},
	} {
		r := cp.run(runOpts{}, args...)
		var v any
		if err := json.Unmarshal([]byte(r.stdout), &v); r.code != 0 || err != nil {
			t.Fatalf("%v: %v %+v", args, err, r)
		}
		if bad := badKeys("", v); len(bad) > 0 {
			t.Errorf("%s: keys not camelCase: %v", strings.Join(args, " "), bad)
		}
	}
	r := cp.run(runOpts{}, "daemon", "show", "gpu-rig", "--json")
	if !strings.Contains(r.stdout, `"maxInvocations"`) {
		t.Fatalf("capabilities: %s", r.stdout)
	}
	// The CLI reads them back: runners show in the table.
	if r := cp.run(runOpts{}, "daemon", "show", "gpu-rig"); !strings.Contains(r.stdout, "runners=process") {
		t.Fatalf("daemon show: %+v", r)
	}
}

// The invocation verbs' --json is camelCase too (it was run_config,
// worker_id, created_at, ...), and so are the daemon's setup outcomes that
// `daemon show --json` lists (exit_code, output_tail were the daemon's).
func TestInvocationJSONKeysAreCamelCase(t *testing.T) {
	cp := newRealCP(t)
	sim := startSimDaemon(t, cp, "q", "echo", "python", "process")
	close(sim.talk)
	check := func(args []string, doc string) {
		t.Helper()
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatalf("%v: %v %q", args, err, doc)
		}
		if bad := badKeys("", v); len(bad) > 0 {
			t.Errorf("%s: keys not camelCase: %v", strings.Join(args, " "), bad)
		}
	}
	run := func(wantCode int, args ...string) string {
		t.Helper()
		r := cp.run(runOpts{}, args...)
		if r.code != wantCode {
			t.Fatalf("%v: %+v", args, r)
		}
		check(args, r.stdout)
		return r.stdout
	}
	ok := run(0, "run", "--queue", "q", "--runner", "echo", "--timeout", "30", "--env", "A=1", "--workdir", "/w",
		"--args-json", `[1]`, "--json", "m:f")
	for _, k := range []string{`"runConfig"`, `"timeoutS": 30`, `"workerId"`, `"workerLabel": "sim"`, `"createdAt"`, `"finishedAt"`, `"resultSize"`, `"argsSize"`} {
		if !strings.Contains(ok, k) {
			t.Errorf("run --json lacks %s:\n%s", k, ok)
		}
	}
	run(1, "run", "--queue", "q", "--runner", "python", "--json", "m:fail")
	run(0, "run", "--queue", "q", "--runner", "process", "--json", "m:talk")
	id := (<-sim.runs).InvocationID
	for len(sim.runs) > 0 {
		id = (<-sim.runs).InvocationID
	}
	run(0, "invocations", "list", "--json")
	run(0, "invocations", "show", id, "--json")
	logs := cp.run(runOpts{}, "invocations", "logs", "--json", id)
	lines := strings.Split(strings.TrimSpace(logs.stdout), "\n")
	if logs.code != 0 || len(lines) != 3 {
		t.Fatalf("logs --json: %+v", logs)
	}
	for _, l := range lines {
		check([]string{"invocations", "logs", "--json"}, l)
	}
	// Nobody polls "idle": the cancel cancels it at once.
	r := cp.run(runOpts{}, "run", "--no-wait", "--queue", "idle", "m:f")
	if r.code != 0 {
		t.Fatalf("run --no-wait: %+v", r)
	}
	if out := run(0, "invocations", "cancel", strings.TrimSpace(r.stdout), "--json"); !strings.Contains(out, `"cancelled": true`) {
		t.Fatalf("cancel --json: %s", out)
	}

	// A setup outcome, as the daemon reports it, shown by daemon show.
	script := filepath.Join(t.TempDir(), "setup.sh")
	os.WriteFile(script, []byte("true\n"), 0o600)
	var q operatorapi.Queued
	if r := cp.run(runOpts{}, "daemon", "setup", "sim", "--script", script, "--json"); r.code != 0 || json.Unmarshal([]byte(r.stdout), &q) != nil {
		t.Fatalf("setup: %+v", r)
	}
	ev, err := messages.NewEvent(q.CommandID, messages.EventSetupFinished, sim.id,
		&messages.SetupOutcome{Name: "setup", State: messages.StateFailed, ExitCode: 9, DurationMs: 5, OutputTail: "no\n"}, time.Now())
	if err == nil {
		err = sim.call(context.Background(), "/v1/daemon/event", ev, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	show := run(0, "daemon", "show", "sim", "--json")
	if !strings.Contains(show, `"exitCode": 9`) || !strings.Contains(show, `"outputTail": "no\n"`) {
		t.Fatalf("daemon show --json outcomes:\n%s", show)
	}
}
