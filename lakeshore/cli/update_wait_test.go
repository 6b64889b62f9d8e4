package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/messages"
	"nymph/test/wait"
)

// otaCommands polls once for worker (legacy: what it gets is acknowledged)
// and returns the ids of its ota_update commands.
func (c *realCP) otaCommands(worker string) []string {
	c.t.Helper()
	var resp messages.PollResponse
	c.daemonCall("/v1/daemon/poll", messages.PollRequest{WorkerID: worker}, &resp)
	var ids []string
	for _, cmd := range resp.Commands {
		if cmd.Kind == messages.KindOtaUpdate {
			ids = append(ids, cmd.ID)
		}
	}
	return ids
}

// restartAs says hello again for label as nymph version: what a daemon
// does once it has exec()ed into the new binary.
func (c *realCP) restartAs(label, version string) {
	c.t.Helper()
	arch, proto := "x86_64", messages.ProtocolVersion
	var resp messages.HelloResponse
	c.daemonCall("/v1/daemon/hello", messages.HelloRequest{
		MachineID: "host-" + label, Label: label, Tags: []string{},
		Capabilities: messages.Capabilities{Runners: []string{"process"}},
		Versions:     messages.Versions{Daemon: &version, Protocol: &proto, Arch: &arch},
	}, &resp)
}

func TestUpdateSaysQueuedAndWaitsForTheNewVersion(t *testing.T) {
	cp := newRealCP(t)
	path := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(path, []byte("nymph 0.2.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := cp.run(runOpts{}, "release", "publish", path, "--version", "0.2.0", "--triple", x86Triple); r.code != 0 {
		t.Fatalf("publish: %+v", r)
	}
	a, b := cp.hello("fleet-a", "x86_64"), cp.hello("fleet-b", "x86_64")
	slow := cp.hello("slow", "x86_64")

	// Without --wait nothing is "done": the updates are queued.
	r := cp.run(runOpts{}, "daemon", "update", "--all", "--yes", "--version", "0.2.0")
	if r.code != 0 || !strings.Contains(r.stdout, "3 of 3 daemons queued, 0 failed") || !strings.Contains(r.stdout, "--wait") ||
		strings.Contains(r.stdout, "done") {
		t.Fatalf("update --all without --wait: %+v", r)
	}
	for _, w := range []string{a, b, slow} {
		cp.otaCommands(w)
	}

	// --wait: fleet-a restarts into 0.2.0, fleet-b refuses it.
	done := make(chan result, 1)
	go func() {
		done <- cp.run(runOpts{}, "daemon", "update", "--prefix", "fleet", "--yes", "--version", "0.2.0", "--wait", "--json")
	}()
	var cmdA, cmdB []string
	wait.For(t, 30*time.Second, "both updates to be queued", func() bool {
		cmdA, cmdB = append(cmdA, cp.otaCommands(a)...), append(cmdB, cp.otaCommands(b)...)
		return len(cmdA) > 0 && len(cmdB) > 0
	})
	cp.restartAs("fleet-a", "0.2.0")
	reason := "ota: sha256 mismatch"
	ev, err := messages.NewEvent(cmdB[0], messages.EventOtaFinished, b, &messages.OtaOutcome{Source: messages.OtaSourceCommand,
		Version: "0.2.0", Outcome: messages.OtaRefused, Code: messages.OtaCodeChecksumMismatch, Reason: &reason}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var ack map[string]any
	cp.daemonCall("/v1/daemon/event", ev, &ack)
	r = <-done
	var sum cli.UpdateSummary
	if err := json.Unmarshal([]byte(r.stdout), &sum); err != nil || r.code != cli.ExitError || sum.Updated == nil || *sum.Updated != 1 {
		t.Fatalf("update --wait: %v %+v", err, r)
	}
	for _, o := range sum.Results {
		switch o.WorkerID {
		case a:
			if o.ReportedVersion != "0.2.0" || o.WaitError != "" {
				t.Fatalf("fleet-a: %+v", o)
			}
		case b:
			if !strings.Contains(o.WaitError, "refused the update: "+reason) {
				t.Fatalf("fleet-b: %+v", o)
			}
		}
	}
	if !strings.Contains(r.stderr, "1 of 2 daemons not updated to nymph 0.2.0") {
		t.Fatalf("update --wait stderr: %q", r.stderr)
	}

	// A daemon that never takes its update: the wait runs out and says so.
	r = cp.run(runOpts{}, "daemon", "update", "slow", "--version", "0.2.0", "--wait", "--wait-for", "1s")
	if r.code != cli.ExitError || !strings.Contains(r.stdout, "slow: not updated: still reports 0.1.0 after 1s") ||
		!strings.Contains(r.stdout, "0 of 1 daemon updated") {
		t.Fatalf("update --wait that runs out: %+v", r)
	}
}

// What the control plane cannot fill in is named, with the way to give it.
func TestUpdateErrorsSayWhatIsMissing(t *testing.T) {
	cp := newRealCP(t)
	cp.hello("solo", "x86_64")
	r := cp.run(runOpts{}, "daemon", "update", "solo")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, `lakeshore: no version was given, and namespace "default" has no target version to fall back to: pass --version V`) {
		t.Fatalf("update without a version: %+v", r)
	}
	// Port 1 on loopback refuses: the sidecar cannot be read.
	r = cp.run(runOpts{}, "daemon", "update", "solo", "--version", "0.2.0", "--url", "http://127.0.0.1:1/nymph")
	if r.code != cli.ExitError || !strings.Contains(r.stderr, "lakeshore: no sha256 was given, and the checksum could not be read from the URL's sidecar") ||
		!strings.Contains(r.stderr, "pass --sha256") {
		t.Fatalf("update without a readable sidecar: %+v", r)
	}
}
