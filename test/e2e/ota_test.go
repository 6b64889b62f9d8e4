package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/workdirlock"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/harness"
	"nymph/test/wait"
)

// v2Version is the version of the second nymph build; the first is
// harness.Version.
const v2Version = "0.0.0-e2e-v2"

var (
	v2Once sync.Once
	v2Dir  string
	v2Err  error
)

// v2Nymph builds nymph stamped v2Version once per test process and returns
// its path and bytes.
func v2Nymph(t *testing.T) (string, []byte) {
	t.Helper()
	root := harness.ModuleRoot(t)
	v2Once.Do(func() {
		v2Dir, v2Err = os.MkdirTemp("", "nymph-e2e-v2-")
		if v2Err == nil {
			v2Err = harness.BuildVersion(root, v2Dir, v2Version)
		}
	})
	if v2Err != nil {
		t.Fatalf("build nymph %s: %v", v2Version, v2Err)
	}
	p := filepath.Join(v2Dir, "nymph")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

// privateNymph copies the harness's nymph (harness.Version) to a directory
// of its own: the daemon replaces the file it runs from.
func privateNymph(t *testing.T, cp *harness.ControlPlane) (string, []byte) {
	t.Helper()
	b, err := os.ReadFile(cp.Bins.Nymph)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bin", "nymph")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func publish(t *testing.T, cp *harness.ControlPlane, path, version string) {
	t.Helper()
	expectCode(t, cp.CLI(t, "release", "publish", path, "--version", version), 0)
}

// daemonVersion is versions.daemon of the worker labelled label, as its
// last hello said.
func daemonVersion(t *testing.T, cp *harness.ControlPlane, label string) string {
	t.Helper()
	r := cp.CLI(t, "daemon", "show", label, "--json")
	if r.Code != 0 {
		return ""
	}
	var w operatorapi.Worker
	if json.Unmarshal([]byte(r.Stdout), &w) != nil {
		return ""
	}
	var v struct {
		Daemon *string `json:"daemon"`
	}
	if json.Unmarshal(w.Versions, &v) != nil || v.Daemon == nil {
		return ""
	}
	return *v.Daemon
}

func waitVersion(t *testing.T, cp *harness.ControlPlane, label, version string) {
	t.Helper()
	wait.For(t, 60*time.Second, label+" to say hello as "+version, func() bool {
		return daemonVersion(t, cp, label) == version
	})
}

// assertImage checks that pid is alive and runs the binary whose bytes
// are want, and that bin holds those bytes with nothing left beside it.
func assertImage(t *testing.T, d *harness.Daemon, pid int, bin string, want []byte) {
	t.Helper()
	select {
	case <-d.Done():
		t.Fatalf("nymph exited (code %d):\n%s", d.ExitCode(), d.Log())
	default:
	}
	if d.PID() != pid {
		t.Fatalf("pid %d, want the same process %d", d.PID(), pid)
	}
	img, err := os.ReadFile(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		t.Fatal(err)
	}
	if sha(img) != sha(want) {
		t.Fatalf("process %d runs an image with sha256 %s, want %s", pid, sha(img), sha(want))
	}
	assertFile(t, bin, want)
}

func assertFile(t *testing.T, bin string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s has sha256 %s, want %s", bin, sha(got), sha(want))
	}
	ents, err := os.ReadDir(filepath.Dir(bin))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("left beside the binary: %v", names)
	}
}

func countLog(d *harness.Daemon, msg string) int { return strings.Count(d.Log(), msg) }

const (
	msgFailed  = "update failed: the running binary is unchanged"
	msgRefused = "ota_update refused"
	msgDrain   = "draining in-flight execs and runs before exec"
)

// The headline: publish, `daemon update`, and the same process comes back
// as the new version while an exec started before the update still
// reports its result.
func TestOTAUpdateSameProcessDrainsExec(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	bin, _ := privateNymph(t, cp)
	v2Path, v2 := v2Nymph(t)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "ota-one", Bin: bin, GraceS: 60})
	pid := d.PID()
	if got := daemonVersion(t, cp, "ota-one"); got != harness.Version {
		t.Fatalf("before the update the daemon reports %q, want %q", got, harness.Version)
	}
	publish(t, cp, v2Path, v2Version)

	dir := t.TempDir()
	started, gate := filepath.Join(dir, "started"), filepath.Join(dir, "gate")
	long := startExec(t, cp, "ota-one", fmt.Sprintf(`touch %s; while [ ! -e %s ]; do sleep 0.02; done; echo survived`, started, gate))
	wait.For(t, 30*time.Second, "the long exec to start", func() bool { _, err := os.Stat(started); return err == nil })

	r := cp.CLI(t, "daemon", "update", "ota-one", "--version", v2Version, "--json")
	expectCode(t, r, 0)
	q := mustJSON[operatorapi.UpdateQueued](t, r)
	if q.SHA256 != sha(v2) || !strings.Contains(q.URL, "/v1/releases/"+v2Version+"/") {
		t.Fatalf("queued update %+v, want the published release (sha256 %s)", q, sha(v2))
	}
	wait.For(t, 60*time.Second, "the daemon to install and start draining", func() bool { return countLog(d, msgDrain) >= 1 })
	// Installed on disk, still the old image, the exec still running.
	var e operatorapi.Exec
	if err := cp.GetJSON("/v1/namespaces/default/execs/"+long.ExecID, &e); err != nil || e.State == operatorapi.ExecFinished {
		t.Fatalf("the long exec ended before its gate opened: %+v %v", e, err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "the long exec's result", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+long.ExecID, &e) == nil && e.State == operatorapi.ExecFinished
	})
	if e.Result == nil || e.Result.ExitCode != 0 || e.Result.Stdout != "survived\n" {
		t.Fatalf("the exec started before the update: %+v", e.Result)
	}

	waitVersion(t, cp, "ota-one", v2Version)
	assertImage(t, d, pid, bin, v2)
	// The new image holds the workdir lock the old one took, through the
	// exec: a second daemon is still refused, naming the same pid.
	if l, err := workdirlock.Acquire(d.Workdir); err == nil {
		l.Release()
		t.Fatal("after the update the workdir is not locked")
	} else if want := fmt.Sprintf("another nymph (pid %d)", pid); !strings.Contains(err.Error(), want) {
		t.Fatalf("workdir lock after the update: %v, want %q", err, want)
	}
	r = cp.CLI(t, "daemon", "exec", "ota-one", "echo", "from", "v2")
	expectCode(t, r, 0)
	if r.Stdout != "from v2\n" {
		t.Fatalf("exec on the new binary: %q", r.Stdout)
	}
	if !strings.Contains(d.Log(), `"version":"`+v2Version+`"`) || !strings.Contains(d.Log(), "drained: exec the new binary") {
		t.Fatalf("the log does not show the handoff:\n%s", d.Log())
	}
}

// A wrong checksum, a truncated download and an unwritable directory each
// leave the old binary byte-for-byte intact and the daemon polling.
func TestOTAFailuresKeepOldBinary(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	bin, v1 := privateNymph(t, cp)
	v2Path, v2 := v2Nymph(t)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "ota-fail", Bin: bin})
	pid := d.PID()
	publish(t, cp, v2Path, v2Version)

	stillPolling := func(step string) {
		t.Helper()
		r := cp.CLI(t, "daemon", "exec", "ota-fail", "echo", step)
		expectCode(t, r, 0)
		if r.Stdout != step+"\n" {
			t.Fatalf("exec after %s: %q", step, r.Stdout)
		}
		assertImage(t, d, pid, bin, v1)
		if v := daemonVersion(t, cp, "ota-fail"); v != harness.Version {
			t.Fatalf("after %s the daemon reports %q", step, v)
		}
	}
	failures := 0
	expectFailure := func(step, reason string) {
		t.Helper()
		failures++
		wait.For(t, 60*time.Second, step+" to fail", func() bool { return countLog(d, msgFailed) >= failures })
		if !strings.Contains(d.Log(), reason) {
			t.Fatalf("%s: the log does not say %q:\n%s", step, reason, d.Log())
		}
		stillPolling(step)
	}

	// Wrong checksum: the control plane's release, someone else's sha256.
	expectCode(t, cp.CLI(t, "daemon", "update", "ota-fail", "--version", v2Version, "--sha256", strings.Repeat("0", 64)), 0)
	expectFailure("wrong-checksum", "sha256 mismatch")

	// Truncated download: a server that promises the whole binary and
	// hangs up a third of the way.
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(v2)))
		_, _ = w.Write(v2[:len(v2)/3])
	}))
	t.Cleanup(cut.Close)
	expectCode(t, cp.CLI(t, "daemon", "update", "ota-fail", "--version", v2Version, "--url", cut.URL+"/nymph", "--sha256", sha(v2)), 0)
	expectFailure("truncated-download", "unexpected EOF")

	// A non-hex checksum never leaves the control plane.
	r := cp.CLI(t, "daemon", "update", "ota-fail", "--version", v2Version, "--sha256", strings.Repeat("z", 64))
	if r.Code == 0 || !strings.Contains(r.Stderr, "sha256") {
		t.Fatalf("a non-hex --sha256 was accepted: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}

	// Unwritable directory: the temporary file cannot be created.
	dir := filepath.Dir(bin)
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chattr +i %s: %v %s", dir, err, out)
		}
		t.Logf("chattr +i unavailable (%v %s); the unwritable-directory case is skipped", err, out)
	} else {
		t.Cleanup(func() { _ = exec.Command("chattr", "-i", dir).Run() })
		expectCode(t, cp.CLI(t, "daemon", "update", "ota-fail", "--version", v2Version), 0)
		expectFailure("unwritable-directory", "create temporary file")
		if err := exec.Command("chattr", "-i", dir).Run(); err != nil {
			t.Fatal(err)
		}
	}

	// After all that, a good update still goes through.
	expectCode(t, cp.CLI(t, "daemon", "update", "ota-fail", "--version", v2Version), 0)
	waitVersion(t, cp, "ota-fail", v2Version)
	assertImage(t, d, pid, bin, v2)
}

// A non-hex checksum that does reach a daemon (the control plane refuses
// to queue one, so a scripted one delivers it) is refused by the daemon
// before any download; the binary stays and the daemon keeps polling.
func TestOTANonHexChecksumRefusedByDaemon(t *testing.T) {
	t.Parallel()
	cp := fakecp.New(t, fakecp.WithMaxHold(300*time.Millisecond))
	bins := harness.Binaries(t)
	b, err := os.ReadFile(bins.Nymph)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "bin", "nymph")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		hits int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	cfg := filepath.Join(dir, "nymph.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`[server]
url = %q
[daemon]
machine_id = "nonhex"
label = "nonhex"
[poll]
wait_max_s = 0.3
retry_min_s = 0.1
retry_max_s = 1
[runtime]
workdir = %q
[log]
format = "json"
`, cp.URL, filepath.Join(dir, "work"))), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "nymph.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := harness.StartCmd(func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", cfg)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	})
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() { harness.KillGroup(cmd.Process.Pid, exited) })

	for _, bad := range []string{"abc", strings.Repeat("g", 64), strings.Repeat("a", 63), strings.Repeat("a", 65)} {
		cp.QueueKind(messages.KindOtaUpdate, &messages.OtaUpdate{Version: "9.9.9", URL: srv.URL + "/nymph", SHA256: bad})
	}
	cp.QueueExec(messages.Exec{ExecID: "after-nonhex", Command: "echo still polling", Env: map[string]string{}})
	res := cp.WaitResult("after-nonhex", 60*time.Second)
	if res.ExitCode != 0 || string(res.Stdout) != "still polling\n" {
		t.Fatalf("exec after the refused updates: %d %q", res.ExitCode, res.Stdout)
	}
	polls := len(cp.Polls())
	cp.Wait(30*time.Second, "more polls", func() bool { return len(cp.Polls()) >= polls+2 })
	logb, _ := os.ReadFile(logPath)
	if n := strings.Count(string(logb), msgRefused); n != 4 {
		t.Fatalf("%d refusals logged, want 4:\n%s", n, logb)
	}
	if !strings.Contains(string(logb), "is not exactly 64 ASCII hex characters") {
		t.Fatalf("the log does not say why:\n%s", logb)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatalf("%d downloads for refused updates", hits)
	}
	assertFile(t, bin, b)
}

// --prefix and --all fan out over several daemons; each comes back as the
// new version in the same process; a daemon already on it is left alone.
func TestOTAFanOut(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	v2Path, v2 := v2Nymph(t)
	publish(t, cp, v2Path, v2Version)
	type host struct {
		d   *harness.Daemon
		bin string
		pid int
		v1  []byte
	}
	hosts := map[string]*host{}
	for _, label := range []string{"fleet-a", "fleet-b", "solo"} {
		bin, v1 := privateNymph(t, cp)
		d := cp.StartDaemon(t, harness.DaemonOptions{Label: label, Bin: bin})
		hosts[label] = &host{d: d, bin: bin, pid: d.PID(), v1: v1}
	}

	r := cp.CLI(t, "daemon", "update", "--prefix", "fleet", "--version", v2Version, "--yes")
	expectCode(t, r, 0)
	for _, label := range []string{"fleet-a", "fleet-b"} {
		if !strings.Contains(r.Stdout, label) {
			t.Fatalf("--prefix progress does not name %s:\n%s", label, r.Stdout)
		}
		waitVersion(t, cp, label, v2Version)
		h := hosts[label]
		assertImage(t, h.d, h.pid, h.bin, v2)
	}
	if strings.Contains(r.Stdout, "solo") {
		t.Fatalf("--prefix fleet touched solo:\n%s", r.Stdout)
	}
	if v := daemonVersion(t, cp, "solo"); v != harness.Version {
		t.Fatalf("solo reports %q after --prefix fleet", v)
	}
	assertImage(t, hosts["solo"].d, hosts["solo"].pid, hosts["solo"].bin, hosts["solo"].v1)

	r = cp.CLI(t, "daemon", "update", "--all", "--version", v2Version, "--yes", "--json")
	expectCode(t, r, 0)
	waitVersion(t, cp, "solo", v2Version)
	for label, h := range hosts {
		assertImage(t, h.d, h.pid, h.bin, v2)
		if label != "solo" {
			wait.For(t, 60*time.Second, label+" to skip the update it already runs", func() bool {
				return countLog(h.d, "update skipped: this binary is already running") >= 1
			})
		}
		r := cp.CLI(t, "daemon", "exec", label, "echo", label)
		expectCode(t, r, 0)
	}
}

// Auto-update converges on the namespace's target, and a target that
// cannot be had is tried no more than once per interval, from the
// daemon's own control plane.
func TestOTAAutoUpdate(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	proxy := harness.StartProxy(t, cp.URL)
	bin, _ := privateNymph(t, cp)
	v2Path, v2 := v2Nymph(t)
	const interval = 2 * time.Second
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "auto", Bin: bin, ServerURL: proxy.URL,
		WaitMaxS: 0.5, AutoUpdateIntervalS: int(interval / time.Second)})
	pid := d.PID()
	publish(t, cp, v2Path, v2Version)

	since := time.Now()
	expectCode(t, cp.CLI(t, "daemon", "set-target-version", v2Version), 0)
	waitVersion(t, cp, "auto", v2Version)
	assertImage(t, d, pid, bin, v2)
	if got := proxy.Requests("/v1/releases/"+v2Version+"/", since); len(got) != 2 {
		t.Fatalf("auto-update fetched %v, want the sidecar and the binary once each from its own control plane", got)
	}

	// A target that is not published: 404 every time it is tried.
	const missing = "0.0.0-e2e-missing"
	r := cp.CLI(t, "daemon", "set-target-version", missing)
	expectCode(t, r, 0)
	since = time.Now()
	polls := len(proxy.Requests("/v1/daemon/poll", since))
	wait.For(t, 60*time.Second, "a few intervals of polls", func() bool {
		return len(proxy.Requests("/v1/daemon/poll", since)) >= polls+12
	})
	elapsed := time.Since(since)
	tries := proxy.Requests("/v1/releases/"+missing+"/", since)
	pollsSeen := len(proxy.Requests("/v1/daemon/poll", since))
	if max := int(elapsed/interval) + 1; len(tries) == 0 || len(tries) > max {
		t.Fatalf("%d download attempts in %v with a %v interval (and %d polls), want 1..%d", len(tries), elapsed, interval, pollsSeen, max)
	}
	// Seen at the proxy, a request may arrive a little later than the
	// daemon decided to send it; the interval is kept on the daemon's clock.
	const slack = 200 * time.Millisecond
	for i := 1; i < len(tries); i++ {
		if gap := tries[i].At.Sub(tries[i-1].At); gap < interval-slack {
			t.Fatalf("attempts %v apart, under the %v interval", gap, interval)
		}
	}
	t.Logf("%d attempts, %d polls in %v", len(tries), pollsSeen, elapsed)
	assertImage(t, d, pid, bin, v2)
	expectCode(t, cp.CLI(t, "daemon", "exec", "auto", "true"), 0)
}

// Over HTTPS with a private CA, auto-update reads the sidecar and
// downloads the binary trusting [server] ca_file, like every other request.
func TestOTAAutoUpdateOverHTTPS(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{TLS: harness.NewCA(t)})
	bin, _ := privateNymph(t, cp)
	v2Path, v2 := v2Nymph(t)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "auto-tls", Bin: bin, AutoUpdateIntervalS: 3600})
	pid := d.PID()
	publish(t, cp, v2Path, v2Version)
	expectCode(t, cp.CLI(t, "daemon", "set-target-version", v2Version), 0)
	waitVersion(t, cp, "auto-tls", v2Version)
	assertImage(t, d, pid, bin, v2)
	if !strings.Contains(d.Log(), `"url":"https://`) {
		t.Fatalf("the update did not come over HTTPS:\n%s", d.Log())
	}
}
