package main_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

// privateCopy copies bin into a directory of its own: an update replaces
// the file the daemon runs from.
func privateCopy(t *testing.T, bin string) string {
	t.Helper()
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "nymph")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// update serves /usr/bin/true as "the new binary": a real executable for
// this machine, whose exec is easy to recognise (the process exits 0
// without a word).
func update(t *testing.T) (messages.OtaUpdate, []byte) {
	t.Helper()
	b, err := os.ReadFile("/usr/bin/true")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("no /usr/bin/true: %v", err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(b) }))
	t.Cleanup(srv.Close)
	h := sha256.Sum256(b)
	return messages.OtaUpdate{Version: "2.0.0", URL: srv.URL + "/nymph", SHA256: hex.EncodeToString(h[:])}, b
}

// startDraining starts a private copy of the binary with a gated exec on
// it, sends it an update and waits for the drain the update waits on. It
// returns the installed path and the new binary's bytes.
func startDraining(t *testing.T) (cp *fakecp.CP, d *daemon, gate, bin string, newBin []byte) {
	t.Helper()
	bin = privateCopy(t, nymphBin(t))
	cp, d, gate = startWithLongExec(t, bin)
	cmd, newBin := update(t)
	cp.QueueKind(messages.KindOtaUpdate, &cmd)
	wait.For(t, 30*time.Second, "the drain", func() bool {
		return strings.Contains(d.stderr.String(), "draining in-flight execs and runs before exec")
	})
	return cp, d, gate, bin, newBin
}

// startWithLongExec starts bin and a gated exec on it.
func startWithLongExec(t *testing.T, bin string) (*fakecp.CP, *daemon, string) {
	t.Helper()
	cp := fakecp.New(t, fakecp.WithMaxHold(300*time.Millisecond))
	cfg, _ := writeConfig(t, cp, "shutdown_grace_s = 60")
	d := startBin(t, bin, nil, "run", "--config", cfg)
	dir := t.TempDir()
	started, gate := filepath.Join(dir, "started"), filepath.Join(dir, "gate")
	cp.QueueExec(messages.Exec{ExecID: "long", Env: map[string]string{},
		Command: "touch " + started + "; while [ ! -e " + gate + " ]; do sleep 0.02; done; echo drained"})
	wait.For(t, 20*time.Second, "the long exec to start", func() bool { _, err := os.Stat(started); return err == nil })
	return cp, d, gate
}

// The update installs, the running exec finishes and its result is posted,
// and only then the same process execs the new binary with its arguments.
func TestUpdateDrainsThenExecsSamePID(t *testing.T) {
	cp, d, gate, bin, newBin := startDraining(t)
	if got, _ := os.ReadFile(bin); !bytes.Equal(got, newBin) {
		t.Fatal("the new binary is not installed")
	}
	if _, ok := cp.Result("long"); ok {
		t.Fatal("the exec reported before its gate opened")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// /usr/bin/true, exec'd in place of nymph, exits 0.
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if r, ok := cp.Result("long"); !ok || r.ExitCode != 0 || r.Stdout != "drained\n" {
		t.Fatalf("the exec's result was not posted before the exec: %+v %v", r, ok)
	}
	out := d.stderr.String()
	if !strings.Contains(out, "drained: exec the new binary") || strings.Contains(out, "nymph stopped") {
		t.Fatalf("no handoff in the log:\n%s", out)
	}
}

// A signal during the drain wins: the process exits after the drain, and
// the installed binary runs at the next start.
func TestSignalDuringUpdateDrainStops(t *testing.T) {
	cp, d, gate, bin, newBin := startDraining(t)
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	wait.For(t, 10*time.Second, "the signal to be seen", func() bool {
		return strings.Contains(d.stderr.String(), `"signal":"terminated"`)
	})
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out := d.stderr.String()
	if !strings.Contains(out, "stopped by a signal while draining for an update") || strings.Contains(out, "drained: exec") {
		t.Fatalf("the signal did not win:\n%s", out)
	}
	if r, ok := cp.Result("long"); !ok || r.ExitCode != 0 {
		t.Fatalf("long: %+v %v", r, ok)
	}
	if got, _ := os.ReadFile(bin); !bytes.Equal(got, newBin) {
		t.Fatal("the new binary is not installed for the next start")
	}
}

// Built with -X nymph/daemon/selfupdate.selfExec=false, the daemon installs the update,
// says it applies at the next restart, and carries on polling.
func TestSelfExecOffAtLinkTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "nymph")
	build := exec.CommandContext(ctx, "go", "build", "-ldflags",
		"-X nymph/buildinfo.Version="+testVersion+" -X nymph/daemon/selfupdate.selfExec=false", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cp := fakecp.New(t, fakecp.WithMaxHold(300*time.Millisecond))
	cfg, _ := writeConfig(t, cp, "")
	d := startBin(t, bin, nil, "run", "--config", cfg)
	cmd, newBin := update(t)
	cp.QueueKind(messages.KindOtaUpdate, &cmd)
	wait.For(t, 30*time.Second, "the install", func() bool {
		return strings.Contains(d.stderr.String(), "self-exec is disabled, so it applies at the next restart")
	})
	if got, _ := os.ReadFile(bin); !bytes.Equal(got, newBin) {
		t.Fatal("the new binary is not installed")
	}
	cp.QueueExec(messages.Exec{ExecID: "after", Command: "echo still here", Env: map[string]string{}})
	if r := cp.WaitResult("after", 30*time.Second); r.ExitCode != 0 || r.Stdout != "still here\n" {
		t.Fatalf("exec after the install: %+v", r)
	}
	select {
	case <-d.done:
		t.Fatalf("nymph exited (%d)", d.code)
	default:
	}
}
