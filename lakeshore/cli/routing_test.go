package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/controlplane"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/fakeclock"
)

// TestRunHonoursQueueMembership: run --queue training reaches a daemon an
// operator added to training while it polls another queue, as exec --queue
// does.
func TestRunHonoursQueueMembership(t *testing.T) {
	cp := newRealCP(t)
	startSimDaemon(t, cp, "gpu", "echo")
	if r := cp.run(runOpts{}, "queue", "create", "training"); r.code != 0 {
		t.Fatalf("queue create: %+v", r)
	}
	if r := cp.run(runOpts{}, "daemon", "update", "sim", "--add-queue", "training"); r.code != 0 {
		t.Fatalf("add-queue: %+v", r)
	}
	r := cp.run(runOpts{}, "run", "--queue", "training", "--runner", "echo", "--args-json", `{"a": 1}`, "m:f")
	var got map[string]int
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || got["a"] != 1 || strings.Contains(r.stderr, "no daemon") {
		t.Fatalf("run on a member of training: %+v", r)
	}
	// Removing the daemon from the queue it polls takes it off that queue
	// for runs too: nothing is eligible, and run says so.
	if r := cp.run(runOpts{}, "daemon", "update", "sim", "--remove-queue", "gpu"); r.code != 0 {
		t.Fatalf("remove-queue: %+v", r)
	}
	r = cp.run(runOpts{}, "run", "--queue", "gpu", "--runner", "echo", "--wait", "0.2", "m:f")
	if r.code != cli.ExitExecWaitExpired || !strings.Contains(r.stderr, `no daemon in queue "gpu" with runner echo is active right now`) ||
		!strings.Contains(r.stderr, "is still queued") {
		t.Fatalf("run on a removed poll queue: %+v", r)
	}
}

// TestDaemonExecWarnsWhenItWillWait: an exec to a hibernating or stale
// daemon says so at once, in run's words, and a --wait that runs out names
// the exec's real state.
func TestDaemonExecWarnsWhenItWillWait(t *testing.T) {
	clock := fakeclock.New(time.Now().Add(-2 * time.Minute))
	cp := newRealCP(t, func(c *controlplane.Config) { c.Now = clock.Now })
	cp.hello("sleepy", "x86_64")
	cp.hello("quiet", "x86_64")
	clock.Advance(2 * time.Minute)
	// sleepy speaks again (its hibernate is queued as it is seen); quiet
	// does not, and reads stale.
	sleepy := cp.hello("sleepy", "x86_64")
	if r := cp.run(runOpts{}, "daemon", "hibernate", sleepy, "--id", "--until", "+1h"); r.code != 0 {
		t.Fatalf("hibernate: %+v", r)
	}

	r := cp.run(runOpts{}, "daemon", "exec", "--wait", "0.2", "sleepy", "true")
	if r.code != cli.ExitExecWaitExpired ||
		!strings.Contains(r.stderr, "lakeshore: sleepy ("+sleepy+") is hibernating until") ||
		!strings.Contains(r.stderr, "waits for it for up to --wait 0.2s (Ctrl-C cancels it)") ||
		!strings.Contains(r.stderr, "gave up after --wait 0.2s; exec ") ||
		!strings.Contains(r.stderr, "is still queued: no daemon has picked it up yet") || strings.Contains(r.stderr, "unknown") {
		t.Fatalf("exec to a hibernating daemon: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "exec", "--wait", "0.2", "--json", "quiet", "true")
	var ex operatorapi.Exec
	if r.code != cli.ExitExecWaitExpired || json.Unmarshal([]byte(r.stdout), &ex) != nil || ex.State != operatorapi.ExecQueued ||
		!strings.Contains(r.stderr, "is stale (last seen 2m ago)") || !strings.Contains(r.stderr, "is still queued") {
		t.Fatalf("exec to a stale daemon: %+v", r)
	}
}

// TestIDFlagMeansAnID: --id takes a worker id only; a label given to it is
// refused before anything is queued, with the way to name it by label.
func TestIDFlagMeansAnID(t *testing.T) {
	cp := newRealCP(t)
	id := cp.hello("local", "x86_64")
	for _, args := range [][]string{
		{"daemon", "show", "--id", "local"},
		{"daemon", "exec", "--id", "local", "true"},
		{"daemon", "reset", "--id", "local"},
		{"daemon", "kill", "--id", "local", "--yes"},
	} {
		r := cp.run(runOpts{}, args...)
		want := cli.ExitUsage
		if args[1] == "exec" {
			want = cli.ExitExecCLIFailed
		}
		if r.code != want || !strings.Contains(r.stderr, `"local" is not a worker id but the label of daemon `+id) ||
			!strings.Contains(r.stderr, "drop --id") || !strings.Contains(r.stderr, "--id "+id) {
			t.Fatalf("%v: %+v", args, r)
		}
	}
	r := cp.run(runOpts{}, "daemon", "show", "--id", "nope")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, `no daemon has the id "nope"`) {
		t.Fatalf("show --id nope: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "show", "--id", id)
	if r.code != 0 || !strings.Contains(r.stdout, "local") {
		t.Fatalf("show --id <id>: %+v", r)
	}
	// Nothing was queued by the refused verbs: the daemon is still there
	// and has no command waiting.
	r = cp.run(runOpts{}, "daemon", "show", "--json", "local")
	var w operatorapi.Worker
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &w) != nil || w.ID != id {
		t.Fatalf("after the refusals: %+v", r)
	}
	if cmds := cp.otaUpdates(id); len(cmds) != 0 {
		t.Fatalf("refused verbs queued %+v", cmds)
	}
}

// TestSharedLabelSaysUseAnID: when the full label is what several live
// daemons share, the message lists their ids and says to pass one with
// --id, not to type the full label.
func TestSharedLabelSaysUseAnID(t *testing.T) {
	cp := newRealCP(t)
	a := cp.hello("twin", "x86_64")
	b := helloOn(cp, "other-host", "twin")
	r := cp.run(runOpts{}, "daemon", "show", "twin")
	first := min(a, b)
	if r.code != cli.ExitError || !strings.Contains(r.stderr, a) || !strings.Contains(r.stderr, b) ||
		!strings.Contains(r.stderr, `they share the label "twin"`) || !strings.Contains(r.stderr, "--id "+first) ||
		strings.Contains(r.stderr, "full label") {
		t.Fatalf("shared label: %+v", r)
	}
	r = cp.run(runOpts{}, "daemon", "show", "tw")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "name one by its full label or its id") {
		t.Fatalf("ambiguous prefix: %+v", r)
	}
}

// helloOn registers a daemon with label on machine and returns its id.
func helloOn(cp *realCP, machine, label string) string {
	cp.t.Helper()
	v, proto := "0.1.0", messages.ProtocolVersion
	var resp messages.HelloResponse
	cp.daemonCall("/v1/daemon/hello", messages.HelloRequest{
		MachineID: machine, Label: label, Tags: []string{},
		Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions:     messages.Versions{Daemon: &v, Protocol: &proto},
	}, &resp)
	if resp.WorkerID == nil {
		cp.t.Fatalf("hello refused: %+v", resp)
	}
	return *resp.WorkerID
}

// TestBadFloatFlags: every float flag answers a bad value with a usage
// error naming the flag and a value that works, not strconv's words.
func TestBadFloatFlags(t *testing.T) {
	cp := newRealCP(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"daemon", "exec", "--wait", "abc", "d", "true"}, cli.ExitExecCLIFailed, `--wait "abc": want a number, e.g. --wait 600`},
		{[]string{"daemon", "exec", "--timeout", "10s", "d", "true"}, cli.ExitExecCLIFailed, `--timeout "10s": want a number, e.g. --timeout 30`},
		{[]string{"exec", "--wait", "NaN", "--queue", "q", "true"}, cli.ExitExecCLIFailed, `--wait "NaN": want a number`},
		{[]string{"run", "--wait", "inf", "m:f"}, cli.ExitUsage, `--wait "inf": want a number, e.g. --wait 30`},
		{[]string{"run", "--timeout", "1e999", "m:f"}, cli.ExitUsage, `--timeout "1e999": want a number`},
		{[]string{"daemon", "list", "--watch=soon"}, cli.ExitUsage, `--watch "soon": want a number, e.g. --watch 2`},
		{[]string{"daemon", "install", "host", "--wait-timeout", "x"}, cli.ExitUsage, `--wait-timeout "x": want a number, e.g. --wait-timeout 60`},
		{[]string{"daemon", "stop", "--timeout", "x"}, cli.ExitUsage, `--timeout "x": want a number, e.g. --timeout 35`},
		{[]string{"serve", "--daemon-key-rate", "fast"}, cli.ExitUsage, `--daemon-key-rate "fast": want a number`},
		// The siblings: whole numbers and durations.
		{[]string{"invocations", "list", "--limit", "ten"}, cli.ExitUsage, `--limit "ten": want a whole number, e.g. --limit 10`},
		{[]string{"serve", "--stale-after", "60"}, cli.ExitUsage, `--stale-after "60": want a duration (a number with a unit: ms, s, m, h), e.g. --stale-after 30s`},
	} {
		r := cp.run(runOpts{}, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "strconv") || strings.Contains(r.stderr, "parsing") {
			t.Errorf("%v: %+v", tc.args, r)
		}
	}
}
