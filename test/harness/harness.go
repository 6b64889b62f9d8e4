// Package harness drives the real binaries in end-to-end tests: it builds
// lakeshore and nymph once per test binary, starts a control plane on its
// own port and data directory, starts daemons registered to it, and runs
// CLI verbs. Every process it starts is killed at test cleanup.
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/test/wait"
)

// Version is what the binaries built by Binaries report.
const Version = "0.0.0-e2e"

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Bins are the paths of the built binaries.
type Bins struct {
	Lakeshore string
	Nymph     string
}

// ModuleRoot returns the directory holding go.mod.
func ModuleRoot(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Binaries builds both programs once per test process.
func Binaries(t testing.TB) Bins {
	t.Helper()
	root := ModuleRoot(t)
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "nymph-e2e-bin-")
		if buildErr != nil {
			return
		}
		buildErr = BuildVersion(root, buildDir, Version)
	})
	if buildErr != nil {
		t.Fatalf("build binaries: %v", buildErr)
	}
	return Bins{Lakeshore: filepath.Join(buildDir, "lakeshore"), Nymph: filepath.Join(buildDir, "nymph")}
}

// BuildVersion builds the binaries into dir (lakeshore hands serve to
// lakeshore-server beside it), stamped with version.
func BuildVersion(root, dir, version string) error {
	ldflags := "-X nymph/buildinfo.Version=" + version
	cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", dir+"/", "./cmd/lakeshore", "./cmd/lakeshore-server", "./cmd/nymph")
	cmd.Dir = root
	// Static, as make build makes them.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, out)
	}
	return nil
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// ControlPlane is a running `lakeshore serve`.
type ControlPlane struct {
	t          testing.TB
	Bins       Bins
	Addr       string
	URL        string
	DataDir    string
	AdminToken string
	// DaemonToken is the shared bootstrap token daemons use.
	DaemonToken string
	Env         []string
	// CA issued the certificate of a control plane started with
	// CPOptions.TLS (nil for plain HTTP); HTTP trusts it.
	CA      *CA
	HTTP    *http.Client
	tlsArgs []string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
}

// CPOptions tune StartControlPlane.
type CPOptions struct {
	DataDir string   // reuse a data dir (restart tests)
	Addr    string   // reuse an address (restart tests)
	Env     []string // extra environment
	Args    []string // extra serve flags
	// TLS serves HTTPS with a certificate this CA issues; the CLI trusts
	// it through LAKESHORE_CA_FILE, and StartDaemon through [server] ca_file.
	TLS *CA
	// AdminToken and DaemonToken replace the fresh ones StartControlPlane
	// makes, so that replicas on one store share the tokens they must.
	AdminToken, DaemonToken string
}

// StartControlPlane starts `lakeshore serve` and waits until it answers.
func StartControlPlane(t testing.TB, opts CPOptions) *ControlPlane {
	t.Helper()
	bins := Binaries(t)
	cp := &ControlPlane{t: t, Bins: bins, AdminToken: "admin-" + randHex(t), DaemonToken: "daemon-" + randHex(t)}
	if opts.AdminToken != "" {
		cp.AdminToken = opts.AdminToken
	}
	if opts.DaemonToken != "" {
		cp.DaemonToken = opts.DaemonToken
	}
	cp.DataDir = opts.DataDir
	if cp.DataDir == "" {
		cp.DataDir = t.TempDir()
	}
	cp.Addr = opts.Addr
	if cp.Addr == "" {
		cp.Addr = FreeAddr(t)
	}
	cp.URL = "http://" + cp.Addr
	cp.HTTP = http.DefaultClient
	var caEnv []string
	if opts.TLS != nil {
		cert, key, _ := opts.TLS.Issue(t)
		cp.CA, cp.HTTP = opts.TLS, opts.TLS.Client()
		cp.URL = "https://" + cp.Addr
		cp.tlsArgs = []string{"--tls-cert", cert, "--tls-key", key}
		caEnv = []string{"LAKESHORE_CA_FILE=" + opts.TLS.CertFile}
	}
	home := t.TempDir()
	cp.Env = append(os.Environ(),
		"HOME="+home,
		"XDG_CONFIG_HOME="+filepath.Join(home, ".config"),
		"LAKESHORE_CREDENTIALS="+filepath.Join(home, "credentials.json"),
		"LAKESHORE_URL="+cp.URL,
		"LAKESHORE_ADMIN_TOKEN="+cp.AdminToken,
		"LAKESHORE_DAEMON_TOKEN="+cp.DaemonToken,
	)
	cp.Env = append(cp.Env, caEnv...)
	cp.Env = append(cp.Env, opts.Env...)
	cp.start(opts.Args)
	return cp
}

func (cp *ControlPlane) start(extra []string) {
	t := cp.t
	t.Helper()
	args := append([]string{"serve", "--addr", cp.Addr, "--data", cp.DataDir, "--public-url", cp.URL}, cp.tlsArgs...)
	args = append(args, extra...)
	cmd := exec.Command(cp.Bins.Lakeshore, args...)
	cmd.Env = cp.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cp.logPath = filepath.Join(t.TempDir(), "lakeshore.log")
	logf, err := os.Create(cp.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start lakeshore serve: %v", err)
	}
	cp.cmd = cmd
	done := make(chan struct{})
	cp.done = done
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() { cp.Kill() })
	wait.For(t, 30*time.Second, "control plane to answer", func() bool {
		select {
		case <-done:
			t.Fatalf("lakeshore serve exited early:\n%s", cp.Log())
		default:
		}
		var list operatorapi.WorkerList
		return cp.GetJSON("/v1/namespaces/default/workers", &list) == nil
	})
}

// PID of the running control plane.
func (cp *ControlPlane) PID() int { return cp.cmd.Process.Pid }

// Done is closed when the control plane has exited (and been reaped).
func (cp *ControlPlane) Done() <-chan struct{} { return cp.done }

// Log returns what the control plane printed so far.
func (cp *ControlPlane) Log() string {
	b, _ := os.ReadFile(cp.logPath)
	return string(b)
}

// Kill sends SIGKILL to the control plane and waits for it to exit.
func (cp *ControlPlane) Kill() {
	if cp.cmd == nil || cp.cmd.Process == nil {
		return
	}
	KillGroup(cp.cmd.Process.Pid, cp.done)
}

// Stop sends SIGTERM and waits for a clean exit.
func (cp *ControlPlane) Stop() {
	if cp.cmd == nil || cp.cmd.Process == nil {
		return
	}
	_ = cp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-cp.done:
	case <-time.After(20 * time.Second):
		cp.Kill()
	}
}

// Restart starts a new serve process on the same address and data dir.
func (cp *ControlPlane) Restart(extra ...string) {
	cp.t.Helper()
	cp.start(extra)
}

// GetJSON fetches an operator route with the admin token.
func (cp *ControlPlane) GetJSON(path string, out any) error {
	req, err := http.NewRequest(http.MethodGet, cp.URL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cp.AdminToken)
	resp, err := cp.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// PostJSON posts a JSON body to an operator route with the admin token.
func (cp *ControlPlane) PostJSON(path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, cp.URL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cp.AdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := cp.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST %s: %s: %s", path, resp.Status, msg)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// Workers lists the workers of the default namespace.
func (cp *ControlPlane) Workers(t testing.TB) []operatorapi.Worker {
	t.Helper()
	var list operatorapi.WorkerList
	if err := cp.GetJSON("/v1/namespaces/default/workers", &list); err != nil {
		t.Fatalf("list workers: %v", err)
	}
	return list.Workers
}

// Result of one CLI invocation.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// CLI runs the lakeshore binary against this control plane.
func (cp *ControlPlane) CLI(t testing.TB, args ...string) Result {
	t.Helper()
	return cp.CLIStdin(t, "", args...)
}

// CLIStdin is CLI with standard input.
func (cp *ControlPlane) CLIStdin(t testing.TB, stdin string, args ...string) Result {
	t.Helper()
	return cp.cli(t, "", stdin, args...)
}

// CLIIn is CLI run in the working directory dir.
func (cp *ControlPlane) CLIIn(t testing.TB, dir string, args ...string) Result {
	t.Helper()
	return cp.cli(t, dir, "", args...)
}

func (cp *ControlPlane) cli(t testing.TB, dir, stdin string, args ...string) Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cp.Bins.Lakeshore, args...)
	cmd.Dir = dir
	cmd.Env = cp.Env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run lakeshore %v: %v", args, err)
	}
	return Result{Stdout: out.String(), Stderr: errb.String(), Code: code}
}

// Daemon is a running nymph.
type Daemon struct {
	t          testing.TB
	Label      string
	ConfigPath string
	Workdir    string
	// Bin is the binary StartDaemon started.
	Bin      string
	cmd      *exec.Cmd
	logPath  string
	done     chan struct{}
	exitCode int
}

// DaemonOptions tune StartDaemon. Extra TOML is appended to the generated
// config and must bring its own tables (e.g. "[runners.docker]\ncli =
// \"podman\""): the generated sections cannot be opened again, so their keys
// have fields here (MaxInvocations, GraceS, ...).
type DaemonOptions struct {
	Label      string
	Queue      string
	Tags       []string
	Runners    []string
	KeepAliveS int
	GraceS     int
	WaitMaxS   float64
	// MaxInvocations is [runtime] max_invocations (0: unbounded).
	MaxInvocations int
	ExtraTOML      string
	Env            []string
	NoWait         bool // do not wait for the worker to register
	// Bin is the nymph binary to run (default the harness build); a test
	// of self-updates runs a private copy, since the daemon replaces it.
	Bin string
	// ServerURL is [server] url (default the control plane's), for a
	// proxy in front of it.
	ServerURL string
	// AutoUpdateIntervalS > 0 turns on [runtime] auto_update with this
	// auto_update_check_interval_s.
	AutoUpdateIntervalS int
	// Token is what [server] token_file holds (default the control plane's
	// DaemonToken).
	Token string
	// CAFile is [server] ca_file (default the control plane's CA, if any).
	CAFile string
	// SingleJob sets keep_alive_s = 0 (a KeepAliveS of 0 means -1, a
	// pool daemon): the daemon takes one job and exits.
	SingleJob bool
}

// StartDaemon writes a config and starts nymph against cp.
func (cp *ControlPlane) StartDaemon(t testing.TB, o DaemonOptions) *Daemon {
	t.Helper()
	dir := t.TempDir()
	if o.Label == "" {
		o.Label = "d-" + randHex(t)[:8]
	}
	if o.Runners == nil {
		o.Runners = []string{"process", "echo"}
	}
	if o.KeepAliveS == 0 && !o.SingleJob {
		o.KeepAliveS = -1
	}
	if o.GraceS == 0 {
		o.GraceS = 10
	}
	if o.WaitMaxS == 0 {
		o.WaitMaxS = 20
	}
	tokenFile := filepath.Join(dir, "token")
	if o.Token == "" {
		o.Token = cp.DaemonToken
	}
	if err := os.WriteFile(tokenFile, []byte(o.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	workdir := filepath.Join(dir, "work")
	if o.Bin == "" {
		o.Bin = cp.Bins.Nymph
	}
	if o.ServerURL == "" {
		o.ServerURL = cp.URL
	}
	if o.CAFile == "" && cp.CA != nil {
		o.CAFile = cp.CA.CertFile
	}
	caLine := ""
	if o.CAFile != "" {
		caLine = fmt.Sprintf("ca_file = %q\n", o.CAFile)
	}
	autoUpdate := ""
	if o.AutoUpdateIntervalS > 0 {
		autoUpdate = fmt.Sprintf("auto_update = true\nauto_update_check_interval_s = %d\n", o.AutoUpdateIntervalS)
	}
	cfg := fmt.Sprintf(`[server]
url = %q
token_file = %q
%s
[daemon]
machine_id = %q
label = %q
tags = %s
queue = %q

[poll]
wait_max_s = %v
retry_min_s = 0.2
retry_max_s = 2

[runtime]
runners = %s
default_runner = %q
workdir = %q
keep_alive_s = %d
shutdown_grace_s = %d
max_invocations = %d
%s
[log]
level = "debug"
format = "json"
`, o.ServerURL, tokenFile, caLine, "host-"+o.Label, o.Label, tomlList(o.Tags), o.Queue, o.WaitMaxS, tomlList(o.Runners), o.Runners[0], workdir, o.KeepAliveS, o.GraceS, o.MaxInvocations, autoUpdate)
	cfg += "\n" + o.ExtraTOML + "\n"
	cfgPath := filepath.Join(dir, "nymph.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{t: t, Label: o.Label, ConfigPath: cfgPath, Workdir: workdir, Bin: o.Bin, logPath: filepath.Join(dir, "nymph.log")}
	d.Start(o.Bin, o.Env)
	if !o.NoWait {
		cp.WaitForWorker(t, o.Label)
	}
	return d
}

// Start launches (or relaunches) the nymph process with this daemon's config.
func (d *Daemon) Start(bin string, env []string) {
	t := d.t
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := StartCmd(func() *exec.Cmd {
		cmd := exec.Command(bin, "run", "--config", d.ConfigPath)
		cmd.Env = append(os.Environ(), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Stdout, cmd.Stderr = logf, logf
		return cmd
	})
	if err != nil {
		t.Fatalf("start nymph: %v", err)
	}
	d.cmd = cmd
	done := make(chan struct{})
	d.done = done
	go func() {
		_ = cmd.Wait()
		d.exitCode = cmd.ProcessState.ExitCode()
		logf.Close()
		close(done)
	}()
	t.Cleanup(func() { d.Kill() })
}

// PID of the running nymph.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Log returns what nymph printed so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// Signal sends sig to nymph (not its group).
func (d *Daemon) Signal(sig syscall.Signal) { _ = d.cmd.Process.Signal(sig) }

// Done is closed when nymph has exited.
func (d *Daemon) Done() <-chan struct{} { return d.done }

// ExitCode is valid after Done.
func (d *Daemon) ExitCode() int { <-d.done; return d.exitCode }

// Kill SIGKILLs nymph's whole process group.
func (d *Daemon) Kill() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	KillGroup(d.cmd.Process.Pid, d.done)
}

// KillGroup SIGKILLs the process group led by pid and waits for exited,
// which is closed once the leader has been reaped. A leader already reaped
// is not signalled: pids wrap quickly on a busy machine (pid_max is 32768
// here), and the group id may by now belong to another test's process.
func KillGroup(pid int, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-exited
}

// WaitForWorker waits until a worker with this label is registered.
func (cp *ControlPlane) WaitForWorker(t testing.TB, label string) operatorapi.Worker {
	t.Helper()
	var found operatorapi.Worker
	wait.For(t, 30*time.Second, "worker "+label+" to register", func() bool {
		var list operatorapi.WorkerList
		if err := cp.GetJSON("/v1/namespaces/default/workers", &list); err != nil {
			return false
		}
		for _, w := range list.Workers {
			if w.Label == label {
				found = w
				return true
			}
		}
		return false
	})
	return found
}

func tomlList(xs []string) string {
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = fmt.Sprintf("%q", x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func randHex(t testing.TB) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}

// StartCmd starts the command mk makes, making it again while the kernel
// answers ETXTBSY: a binary this test process has just written can still be
// open for writing in a child that another test forked meanwhile, until that
// child execs (the fork copies every descriptor). The busy spell lasts as
// long as one fork and exec, so a few tries always get past it.
func StartCmd(mk func() *exec.Cmd) (*exec.Cmd, error) {
	var cmd *exec.Cmd
	var err error
	wait.Until(10*time.Second, func() bool {
		cmd = mk() // a Cmd cannot be started twice
		err = cmd.Start()
		return !errors.Is(err, syscall.ETXTBSY)
	})
	return cmd, err
}
