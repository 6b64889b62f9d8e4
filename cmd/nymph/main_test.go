package main_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

const testVersion = "9.8.7-test"

// nymphBin builds the real binary once, stamped with testVersion.
func nymphBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nymph-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "nymph")
		out, err := exec.Command("go", "build", "-ldflags", "-X nymph/buildinfo.Version="+testVersion, "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

type daemon struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	code   int
	dir    string
	// exitedAt is when the process was seen to exit (set before done closes).
	exitedAt time.Time
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// writeConfig writes a config for cp; runtimeExtra is added to [runtime].
func writeConfig(t *testing.T, cp *fakecp.CP, runtimeExtra string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	return writeConfigIn(t, dir, cp.URL, `[daemon]
machine_id = "bin-host"
label = "binary test"
tags = ["zone=test"]
queue = "from-file"

[runtime]
runners = ["process", "echo"]
workdir = "work"
`+runtimeExtra), dir
}

// writeConfigIn writes the daemon's token and a nymph.toml into dir and
// returns the config's path: the tables of body between a [server] at url
// and the [poll] and [log] every test shares (quick retries, debug JSON
// logs the tests read).
func writeConfigIn(t *testing.T, dir, url, body string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("daemon-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`[server]
url = %q
token_file = "token"

%s

[poll]
wait_max_s = 1
retry_min_s = 0.05
retry_max_s = 0.2

[log]
level = "debug"
format = "json"
`, url, body)
	p := filepath.Join(dir, "nymph.toml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// start runs the test binary with env added to this process's environment.
func start(t *testing.T, env []string, args ...string) *daemon {
	t.Helper()
	return startBin(t, nymphBin(t), env, args...)
}

// startBin runs bin; the daemon is killed at cleanup and its output logged
// if the test failed.
func startBin(t *testing.T, bin string, env []string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	d := &daemon{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr, cmd.Stdout = d.stderr, d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = cmd.Wait()
		d.exitedAt = time.Now()
		d.code = cmd.ProcessState.ExitCode()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-d.done
		if t.Failed() {
			t.Logf("nymph output:\n%s", d.stderr.String())
		}
	})
	return d
}

func (d *daemon) wait(timeout time.Duration) int {
	d.t.Helper()
	select {
	case <-d.done:
		return d.code
	case <-time.After(timeout):
		d.t.Fatalf("nymph did not exit within %v", timeout)
		return -1
	}
}

func TestVersionIsStamped(t *testing.T) {
	out, err := exec.Command(nymphBin(t), "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "nymph "+testVersion+" (protocol 1)" {
		t.Fatalf("%q %v", out, err)
	}
}

func TestBadConfigExitsWithFileAndKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(p, []byte("[server]\nurl = \"http://h\"\n[runtime]\nkeep_alive_s = \"never\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, nil, "run", "--config", p)
	if code := d.wait(10 * time.Second); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(d.stderr.String(), "config "+p+": [runtime] keep_alive_s: must be an integer") {
		t.Fatalf("stderr %q", d.stderr.String())
	}
	d = start(t, nil, "run")
	if code := d.wait(10 * time.Second); code != 2 {
		t.Fatalf("missing --config: exit %d", code)
	}
}

// A metrics textfile node_exporter would not read is refused at load,
// before anything starts.
func TestMetricsTextfileWithoutPromSuffixRefused(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "nymph.toml")
	if err := os.WriteFile(p, []byte("[server]\nurl = \"http://h\"\n[metrics]\ntextfile = \"nymph.txt\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := start(t, nil, "run", "--config", p)
	if code := d.wait(10 * time.Second); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(d.stderr.String(), "config "+p+": [metrics] textfile: must end in \".prom\": node_exporter's textfile collector reads only *.prom files") {
		t.Fatalf("stderr %q", d.stderr.String())
	}
}

func TestHelloRejectExitsNonZero(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithHello(func(*messages.HelloRequest) messages.HelloResponse {
		return messages.HelloResponse{Reject: &messages.Reject{Code: "invalid_enroll_token", Message: "token unknown"}}
	}))
	cfg, _ := writeConfig(t, cp, "")
	d := start(t, nil, "run", "--config", cfg)
	if code := d.wait(20 * time.Second); code != 3 {
		t.Fatalf("exit %d", code)
	}
	out := d.stderr.String()
	if !strings.Contains(out, `"code":"invalid_enroll_token"`) || !strings.Contains(out, `"message":"token unknown"`) {
		t.Fatalf("reject not logged:\n%s", out)
	}
	if len(cp.Polls()) != 0 {
		t.Fatal("polled after a reject")
	}
}

func TestHelloWireAndQueueOverrides(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithToken("daemon-token"))
	cfg, _ := writeConfig(t, cp, "")
	d := start(t, []string{"DREAMLAKE_QUEUE=from-env"}, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	h := cp.Hellos()[0]
	if h.MachineID != "bin-host" || h.Versions.Daemon == nil || *h.Versions.Daemon != testVersion ||
		h.Versions.Protocol == nil || *h.Versions.Protocol != "1" || h.Tags[0] != "zone=test" || h.Capabilities.Workdir == "" {
		t.Fatalf("hello %+v", h)
	}
	hasArch := false
	for _, tag := range h.Tags {
		hasArch = hasArch || strings.HasPrefix(tag, "arch=")
	}
	if !hasArch {
		t.Fatalf("no detected tags: %v", h.Tags)
	}
	if q := cp.Polls()[0].Queue; q != "from-env" {
		t.Fatalf("queue %q, want the environment's", q)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	cp2 := fakecp.New(t)
	cfg2, _ := writeConfig(t, cp2, "")
	d2 := start(t, []string{"DREAMLAKE_QUEUE=from-env"}, "run", "--config", cfg2, "--queue", "from-flag")
	cp2.Wait(20*time.Second, "a poll", func() bool { return len(cp2.Polls()) > 0 })
	if q := cp2.Polls()[0].Queue; q != "from-flag" {
		t.Fatalf("queue %q, want the flag's", q)
	}
	// Idle footprint, for the record (the target is checked by make bench),
	// once the daemon has sat through one whole held poll.
	polls := len(cp2.Polls())
	cp2.Wait(20*time.Second, "the next poll", func() bool { return len(cp2.Polls()) > polls })
	if rss := vmRSS(d2.cmd.Process.Pid); rss != "" {
		t.Logf("idle nymph memory: %s", rss)
	}
	_ = d2.cmd.Process.Signal(syscall.SIGINT)
	if code := d2.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestSIGTERMHonoursGraceThenKillsAndReports(t *testing.T) {
	cp := fakecp.New(t)
	cfg, _ := writeConfig(t, cp, "shutdown_grace_s = 1.5")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	// Each job carries a mark of its own: one job may be several processes
	// (bash and its sleep), so counting processes would not count jobs.
	base := strconv.FormatInt(time.Now().UnixNano(), 36)
	env := func(job string) map[string]string { return map[string]string{"NYMPH_BIN_MARK": base + "-" + job} }
	cp.QueueExec(messages.Exec{ExecID: "short", Command: "sleep 0.5; echo done", Env: env("short")})
	cp.QueueExec(messages.Exec{ExecID: "long", Command: "sleep 60", Env: env("long")})
	cp.QueueRun(messages.Run{InvocationID: "run-long", Script: ptr("sleep 60"), RunConfig: messages.RunConfig{Env: env("run-long")}})
	running := func(job string) int {
		pids, _ := orphans.WithEnv("/proc", "NYMPH_BIN_MARK="+base+"-"+job)
		return len(pids)
	}
	wait.For(t, 20*time.Second, "3 jobs running", func() bool {
		return running("short") > 0 && running("long") > 0 && running("run-long") > 0
	})
	sent := time.Now()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	code := d.wait(30 * time.Second)
	took := time.Since(sent)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if took < 1500*time.Millisecond {
		t.Fatalf("exited after %v, before the 1.5 s grace", took)
	}
	if r, ok := cp.Result("short"); !ok || r.ExitCode != 0 || r.Stdout != "done\n" {
		t.Fatalf("short: %+v %v", r, ok)
	}
	r, ok := cp.Result("long")
	if !ok || r.ExitCode != messages.ExitFailed || r.Error == nil || *r.Error != messages.CancelledShutdownMessage {
		t.Fatalf("long: %+v", r)
	}
	acks := cp.Acks()
	if len(acks) != 1 || acks[0].State != "killed" || acks[0].Error == nil || acks[0].Error.Type != "Cancelled" ||
		acks[0].Error.Message != "daemon shutdown grace expired" || acks[0].WorkerID != "w-fake" {
		t.Fatalf("acks %+v", acks)
	}
	wait.For(t, 5*time.Second, "nothing left running", func() bool {
		return running("short")+running("long")+running("run-long") == 0
	})
}

func TestSecondSignalStopsAtOnce(t *testing.T) {
	cp := fakecp.New(t)
	cfg, _ := writeConfig(t, cp, "shutdown_grace_s = 120")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	mark := "NYMPH_BIN_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 36)
	k, v, _ := strings.Cut(mark, "=")
	cp.QueueExec(messages.Exec{ExecID: "long", Command: "sleep 60", Env: map[string]string{k: v}})
	wait.For(t, 20*time.Second, "running", func() bool {
		pids, err := orphans.WithEnv("/proc", mark)
		return err == nil && len(pids) >= 1
	})
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	wait.For(t, 10*time.Second, "shutdown logged", func() bool { return strings.Contains(d.stderr.String(), "shutting down") })
	sent := time.Now()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if took := time.Since(sent); took > 10*time.Second {
		t.Fatalf("second signal took %v", took)
	}
	if r, ok := cp.Result("long"); !ok || r.ExitCode != messages.ExitFailed {
		t.Fatalf("long: %+v %v", r, ok)
	}
	wait.For(t, 5*time.Second, "nothing left running", func() bool {
		pids, err := orphans.WithEnv("/proc", mark)
		return err == nil && len(pids) == 0
	})
}

func ptr[T any](v T) *T { return &v }

func vmRSS(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	var parts []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, key := range []string{"VmRSS:", "RssAnon:", "RssFile:"} {
			if v, ok := strings.CutPrefix(line, key); ok {
				parts = append(parts, key+" "+strings.TrimSpace(v))
			}
		}
	}
	return strings.Join(parts, ", ")
}
