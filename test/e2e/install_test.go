package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/lakeshore/cli"
	"nymph/lakeshore/opclient"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/remoteinstall"
	"nymph/test/harness"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// sshHost is a real OpenSSH server on loopback logged into as a dedicated
// local user, whose home directory is private to the test, so that
// `daemon install` works on a host exactly as an operator's would and
// leaves nothing in /root.
type sshHost struct {
	sshd       *realparts.SSHD
	Alias      string
	ConfigPath string
	User       string
	Home       string
	UID        int
}

func startSSHHost(t *testing.T) *sshHost {
	t.Helper()
	sshd := realparts.StartSSHD(t)
	tools := realparts.RequireTool(t, "useradd", "usermod", "userdel")
	base, err := os.MkdirTemp("", "nymph-install-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	// The user must be able to walk into its home.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	h := &sshHost{sshd: sshd, Alias: "install-box", User: "lsi" + hex.EncodeToString(b), Home: filepath.Join(base, "home")}
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := underPasswdLock(name, args...); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	run(tools[0], "-m", "-d", h.Home, "-s", "/bin/sh", h.User)
	t.Cleanup(func() {
		// The daemon is stopped by then, but its exit may leave a zombie
		// (or an sshd session) under the user until PID 1 reaps it, which
		// makes a plain userdel refuse; -f removes the account regardless,
		// and a short retry covers the passwd lock held by another test.
		if out, err := underPasswdLock(tools[2], "-f", h.User); err != nil {
			t.Errorf("userdel %s: %v: %s", h.User, err, out)
		}
	})
	// Without PAM, sshd refuses a user whose password is locked ("!").
	run(tools[1], "-p", "*", h.User)
	u, err := user.Lookup(h.User)
	if err != nil {
		t.Fatal(err)
	}
	h.UID, _ = strconv.Atoi(u.Uid)

	// realparts' sshd takes its client key for every local user.
	h.ConfigPath = filepath.Join(t.TempDir(), "ssh_config")
	cfg := strings.Join([]string{
		"Host " + h.Alias,
		"  HostName " + sshd.Host,
		"  Port " + strconv.Itoa(sshd.Port),
		"  User " + h.User,
		"  IdentityFile " + sshd.IdentityFile,
		"  IdentitiesOnly yes",
		"  UserKnownHostsFile " + sshd.KnownHostsFile,
		"  GlobalKnownHostsFile /dev/null",
		"  HostKeyAlias " + sshd.Alias,
		"  StrictHostKeyChecking yes",
		"  BatchMode yes",
		"  ConnectTimeout 10",
		"  LogLevel ERROR",
	}, "\n") + "\n"
	if err := os.WriteFile(h.ConfigPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := h.ssh(t, "id -un"); err != nil || strings.TrimSpace(out) != h.User {
		t.Fatalf("ssh %s id -un = %q, %v", h.Alias, out, err)
	}
	return h
}

// underPasswdLock runs a user tool (useradd, usermod, userdel), retrying
// for about two seconds: each refuses while another holds the passwd lock,
// and nothing tells when that lock is let go.
func underPasswdLock(name string, args ...string) (out []byte, err error) {
	wait.Until(2*time.Second, func() bool {
		out, err = exec.Command(name, args...).CombinedOutput()
		return err == nil
	})
	return out, err
}

// ssh runs a command on the host as its user.
func (h *sshHost) ssh(t *testing.T, command string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ssh", "-F", h.ConfigPath, h.Alias, command).CombinedOutput()
	return string(out), err
}

// install runs `lakeshore daemon install` against cp and registers a
// cleanup that stops the daemon it started and removes its launch dir.
func (h *sshHost) install(t *testing.T, cp *harness.ControlPlane, args ...string) (cli.InstallResult, harness.Result) {
	t.Helper()
	full := append([]string{"daemon", "install", h.Alias, "--ssh-config", h.ConfigPath, "--json"}, args...)
	t0 := time.Now()
	r := cp.CLI(t, full...)
	t.Logf("install took %s", time.Since(t0))
	var res cli.InstallResult
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("install printed no result (%v): code %d\nstdout: %s\nstderr: %s", err, r.Code, r.Stdout, r.Stderr)
	}
	t.Cleanup(func() { h.stop(t, res) })
	return res, r
}

// stop ends the daemon of one launch through ssh, as an operator would,
// makes sure its process is gone (it is on this machine), and removes the
// launch directory.
func (h *sshHost) stop(t *testing.T, res cli.InstallResult) {
	t.Helper()
	l := remoteinstall.Layout{Dir: res.LaunchDir}
	pidText, _ := os.ReadFile(l.PIDFile())
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if pid > 0 {
		if out, err := h.ssh(t, "kill $(cat "+remoteinstall.Quote(l.PIDFile())+")"); err != nil {
			t.Logf("ssh kill: %v: %s", err, out)
		}
		if !wait.Until(40*time.Second, func() bool { return !processAlive(pid) }) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("nymph %d ignored SIGTERM; killed", pid)
		}
	}
	if out, err := h.ssh(t, remoteinstall.RemoveScript(l)); err != nil {
		t.Errorf("remove %s: %v: %s", l.Dir, err, out)
	}
	if _, err := os.Stat(l.Dir); !os.IsNotExist(err) {
		t.Errorf("launch dir %s still there: %v", l.Dir, err)
	}
}

// processAlive reports whether pid runs (a zombie counts as gone).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func uidOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("process %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
			uid, _ := strconv.Atoi(f[1])
			return uid
		}
	}
	t.Fatalf("process %d: no Uid line", pid)
	return -1
}

func TestInstallOverSSH(t *testing.T) {
	t.Parallel()
	host := startSSHHost(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{})

	res, r := host.install(t, cp, "--binary", cp.Bins.Nymph, "--label", "e2e", "--tag", "role:ssh", "--runner", "process")
	expectCode(t, r, 0)
	if res.WorkerID == nil || res.Label != "e2e-"+res.LaunchID || res.PID <= 0 || res.NymphVersion == "" {
		t.Fatalf("result %+v", res)
	}
	wantDir := filepath.Join(host.Home, ".nymph", res.LaunchID)
	if res.LaunchDir != wantDir || res.ConfigPath != filepath.Join(wantDir, "nymph.toml") || res.LogPath != filepath.Join(wantDir, "nymph.log") {
		t.Fatalf("paths %+v, want them under %s", res, wantDir)
	}
	if !strings.Contains(res.NymphVersion, harness.Version) {
		t.Errorf("nymph version %q, want %s", res.NymphVersion, harness.Version)
	}
	for _, p := range []string{res.ConfigPath, filepath.Join(wantDir, "token")} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm() != 0o600 || int(st.Sys().(*syscall.Stat_t).Uid) != host.UID {
			t.Errorf("%s: %v %v; want mode 0600 owned by %s", p, st.Mode(), err, host.User)
		}
	}
	pid := res.PID
	if uid := uidOf(t, pid); uid != host.UID {
		t.Errorf("nymph runs as uid %d, want %d (%s)", uid, host.UID, host.User)
	}

	w := mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", res.Label, "--json"))
	if w.ID != *res.WorkerID || !contains(w.Tags, "role=ssh") || !contains(w.Runners, "process") {
		t.Fatalf("worker %+v", w)
	}
	r = cp.CLI(t, "daemon", "exec", res.Label, "echo", "hi")
	expectCode(t, r, 0)
	if r.Stdout != "hi\n" {
		t.Fatalf("exec stdout %q", r.Stdout)
	}
	r = cp.CLI(t, "daemon", "exec", res.Label, "id -un; pwd")
	expectCode(t, r, 0)
	if lines := strings.Fields(r.Stdout); len(lines) != 2 || lines[0] != host.User || !strings.HasPrefix(lines[1], wantDir) {
		t.Fatalf("exec id/pwd: %q", r.Stdout)
	}

	// The same host again, the binary downloaded from the control plane's
	// own releases with curl, checked against the published sha256.
	c, err := opclient.New(cp.URL, cp.AdminToken, opclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bin, err := os.Open(cp.Bins.Nymph)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := bin.Stat()
	_, err = c.PublishRelease(ctx, bin, st.Size(), harness.Version, "")
	bin.Close()
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	if _, err := c.SetTargetVersion(ctx, harness.Version); err != nil {
		t.Fatalf("set target version: %v", err)
	}
	res2, r := host.install(t, cp, "--label", "dl", "--keep-alive-s", "0")
	expectCode(t, r, 0)
	if res2.WorkerID == nil || res2.LaunchID == res.LaunchID || !strings.Contains(res2.NymphVersion, harness.Version) {
		t.Fatalf("download install %+v", res2)
	}
	r = cp.CLI(t, "daemon", "exec", res2.Label, "echo", "from the download")
	expectCode(t, r, 0)
	if r.Stdout != "from the download\n" {
		t.Fatalf("exec stdout %q", r.Stdout)
	}

	// The stop command the install printed works as printed: it carries
	// the -F the install was given (this host is known only through it).
	if !strings.HasPrefix(res.StopCommand, "ssh -F "+remoteinstall.Quote(host.ConfigPath)+" "+host.Alias+" ") {
		t.Fatalf("stop command %q lacks the install's ssh options", res.StopCommand)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "sh", "-c", res.StopCommand).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", res.StopCommand, err, out)
	}
	wait.For(t, 40*time.Second, "the daemon stopped by the printed stop command to exit", func() bool { return !processAlive(pid) })
}

func TestInstallOverSSHReportsFailures(t *testing.T) {
	t.Parallel()
	host := startSSHHost(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{})

	// An alias ssh cannot reach: ssh's own words.
	r := cp.CLI(t, "daemon", "install", "no-such-alias.invalid", "--ssh-config", host.ConfigPath, "--binary", cp.Bins.Nymph)
	if r.Code != 1 || !strings.Contains(r.Stderr, "ssh no-such-alias.invalid failed") || !strings.Contains(r.Stderr, "no-such-alias.invalid") {
		t.Fatalf("unreachable alias: %d %q", r.Code, r.Stderr)
	}

	// A daemon that cannot reach its control plane never registers: the
	// install gives up after --wait-timeout and shows the log.
	res, r := host.install(t, cp, "--binary", cp.Bins.Nymph, "--server-url", "http://127.0.0.1:1", "--wait-timeout", "3")
	if r.Code != 1 || !strings.Contains(r.Stderr, "did not register as "+res.Label) ||
		!strings.Contains(r.Stderr, "it is still running") || !strings.Contains(r.Stderr, "--- last lines of "+res.LogPath) {
		t.Fatalf("timeout: %d\n%s", r.Code, r.Stderr)
	}
	if res.WorkerID != nil {
		t.Fatalf("a worker id after a timeout: %+v", res)
	}
}

// Under --slurm the daemon is a batch job of a real (single-node) SLURM
// cluster, submitted on the host through ssh.
func TestInstallOverSSHUnderSlurm(t *testing.T) {
	t.Parallel()
	host := startSSHHost(t)
	slurm := realparts.StartSlurm(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{})

	args := []string{"--binary", cp.Bins.Nymph, "--label", "hpc", "--slurm", "--slurm-partition", slurm.Partition}
	for _, kv := range slurm.Env() {
		args = append(args, "--remote-env", kv)
	}
	var jobID string
	t.Cleanup(func() {
		// Runs after the daemon's own stop: ends the job if that did not.
		if jobID != "" {
			_ = slurm.Command(context.Background(), "scancel", jobID).Run()
		}
	})
	res, r := host.install(t, cp, args...)
	jobID = res.JobID
	expectCode(t, r, 0)
	if res.JobID == "" || res.PID != 0 || res.WorkerID == nil {
		t.Fatalf("result %+v", res)
	}
	out, err := slurm.Command(context.Background(), "squeue", "-h", "-j", res.JobID, "-o", "%j %u %T").CombinedOutput()
	if err != nil {
		t.Fatalf("squeue: %v: %s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), remoteinstall.JobName(res.LaunchID)+" "+host.User+" RUNNING"; got != want {
		t.Fatalf("squeue: %q, want %q", got, want)
	}
	r = cp.CLI(t, "daemon", "exec", res.Label, `echo "job $SLURM_JOB_ID"`)
	expectCode(t, r, 0)
	if r.Stdout != "job "+res.JobID+"\n" {
		t.Fatalf("exec in the job: %q", r.Stdout)
	}

	// The printed stop command cancels the job as printed: the install's
	// -F, and the --remote-env scancel needs as sbatch did.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "sh", "-c", res.StopCommand).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", res.StopCommand, err, out)
	}
	wait.For(t, 60*time.Second, "job "+res.JobID+" to leave the queue after the printed stop command", func() bool {
		out, _ := slurm.Command(ctx, "squeue", "-h", "-j", res.JobID, "-o", "%T").CombinedOutput()
		s := string(out)
		return !strings.Contains(s, "RUNNING") && !strings.Contains(s, "PENDING")
	})
}
