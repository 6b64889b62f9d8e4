package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/workdirlock"
	"nymph/test/harness"
	"nymph/test/wait"
)

// makeRun is one `make run` (scripts/run-local.sh) on its own address,
// state directory, binary directory and HOME, so it shares nothing with a
// developer's own make run or with other tests.
type makeRun struct {
	root, runDir, binDir, addr string
	env                        []string
}

func newMakeRun(t *testing.T, addr string) *makeRun {
	t.Helper()
	m := &makeRun{root: harness.ModuleRoot(t), runDir: t.TempDir(), binDir: t.TempDir(), addr: addr}
	home := t.TempDir()
	// The build keeps the caller's Go caches: a fresh HOME would otherwise
	// mean a fresh module download and a cold build.
	goenv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	vals := strings.Split(strings.TrimSpace(string(goenv)), "\n")
	if len(vals) != 3 {
		t.Fatalf("go env printed %q", goenv)
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LAKESHORE_") || strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			continue
		}
		m.env = append(m.env, kv)
	}
	m.env = append(m.env, "HOME="+home, "GOCACHE="+vals[0], "GOMODCACHE="+vals[1], "GOPATH="+vals[2],
		"LAKESHORE_ADDR="+addr, "LAKESHORE_RUN_DIR="+m.runDir, "LAKESHORE_BIN_DIR="+m.binDir)
	return m
}

func (m *makeRun) command(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(m.root, "scripts", "run-local.sh"))
	cmd.Env = m.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// runToEnd runs a make run that is expected to refuse, and returns its output.
func (m *makeRun) runToEnd(t *testing.T) harness.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := m.command(ctx)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run-local.sh: %v", err)
	}
	return harness.Result{Stdout: out.String(), Stderr: errb.String(), Code: cmd.ProcessState.ExitCode()}
}

// bash runs script with bash -euxo pipefail from the module root, so a
// failing line stops it and the trace names it.
func (m *makeRun) bash(t *testing.T, script string) harness.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euxo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = m.root, m.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("bash: %v", err)
	}
	return harness.Result{Stdout: out.String(), Stderr: errb.String(), Code: cmd.ProcessState.ExitCode()}
}

// readmeTour is the README's tour, the bash block under "## A short tour".
func readmeTour(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n## A short tour\n")
	if !ok {
		t.Fatal("README.md has no \"## A short tour\" section")
	}
	_, block, ok := strings.Cut(after, "```bash\n")
	if !ok {
		t.Fatal("the tour has no bash block")
	}
	block, _, _ = strings.Cut(block, "```")
	return strings.Split(strings.TrimSuffix(block, "\n"), "\n")
}

// bannerCommands are the lines `make run` tells the operator to type.
func bannerCommands(t *testing.T, out string) []string {
	t.Helper()
	_, after, ok := strings.Cut(out, "In another terminal:\n")
	if !ok {
		t.Fatalf("no banner in:\n%s", out)
	}
	var lines []string
	for _, l := range strings.Split(after, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "The README's tour") {
			return lines
		}
		if l != "" {
			lines = append(lines, l)
		}
	}
	t.Fatalf("the banner does not end as expected:\n%s", out)
	return nil
}

// nymphsOn counts the live processes running nymph on config.
func nymphsOn(t *testing.T, config string) int {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 3 && filepath.Base(args[0]) == "nymph" && args[1] == "run" && strings.Contains(string(b), "\x00"+config+"\x00") {
			n++
		}
	}
	return n
}

func fileText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// make run as a new operator meets it: its banner and then the README's
// tour work line by line against it; a second make run while it is up says
// so, names the pid to stop, and touches nothing (no build, no log
// truncated, no second nymph); Ctrl-C stops both of its children.
func TestMakeRunTourAndASecondMakeRun(t *testing.T) {
	t.Parallel()
	m := newMakeRun(t, harness.FreeAddr(t))

	var out, errs lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd, err := harness.StartCmd(func() *exec.Cmd {
		c := m.command(ctx)
		c.Stdout, c.Stderr = &out, &errs
		return c
	})
	if err != nil {
		t.Fatalf("start make run: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { harness.KillGroup(cmd.Process.Pid, exited) })

	// The build is most of the wait, on a machine shared with other builds.
	wait.For(t, 8*time.Minute, "make run to print its banner", func() bool {
		select {
		case <-exited:
			t.Fatalf("make run exited early:\nstdout:\n%s\nstderr:\n%s", out.String(), errs.String())
		default:
		}
		return strings.Contains(out.String(), "Ctrl-C here stops both.")
	})
	banner := out.String()
	if strings.Contains(banner, " -- ") {
		t.Errorf("the banner uses \"--\", which daemon exec --help says is not needed:\n%s", banner)
	}

	// The banner's lines, then the tour's, each in turn. The tour's first
	// line puts ./bin on PATH; this make run built into its own directory.
	cmds := bannerCommands(t, banner)
	if cmds[0] != `export PATH="`+m.binDir+`:$PATH"` {
		t.Fatalf("the banner's first line is %q, want it to put %s on PATH", cmds[0], m.binDir)
	}
	r := m.bash(t, strings.Join(cmds, "\n"))
	if r.Code != 0 || !strings.Contains(r.Stdout, "tick 3\n") || !strings.Contains(r.Stdout, `"hello": "world"`) {
		t.Fatalf("the banner's commands: exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	tour := readmeTour(t, m.root)
	if tour[0] != `export PATH="$PWD/bin:$PATH"` {
		t.Fatalf("the tour starts with %q, not the PATH line this test replaces", tour[0])
	}
	tour[0] = `export PATH="` + m.binDir + `:$PATH"`
	r = m.bash(t, strings.Join(tour, "\n"))
	if r.Code != 0 {
		t.Fatalf("the README tour stopped at the last line traced: exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	for _, want := range []string{"tick 3\n", "queued setup on local", "epoch 2/2", "epoch 3/3", "trained\n", "hibernating"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("the tour's output lacks %q:\n%s", want, r.Stdout)
		}
	}

	// A second make run while this one is up.
	cpLog, nymphLog := filepath.Join(m.runDir, "lakeshore.log"), filepath.Join(m.runDir, "nymph.log")
	config := filepath.Join(m.runDir, "nymph.toml")
	logsBefore := fileText(t, cpLog) + "\x00" + fileText(t, nymphLog)
	binInfo, err := os.Stat(filepath.Join(m.binDir, "nymph"))
	if err != nil {
		t.Fatal(err)
	}
	if n := nymphsOn(t, config); n != 1 {
		t.Fatalf("%d nymphs run on %s before the second make run", n, config)
	}
	second := m.runToEnd(t)
	if second.Code == 0 ||
		!strings.Contains(second.Stderr, fmt.Sprintf("make run is already running (pid %d)", cmd.Process.Pid)) ||
		!strings.Contains(second.Stderr, fmt.Sprintf("kill %d", cmd.Process.Pid)) ||
		!strings.Contains(second.Stderr, "http://"+m.addr) ||
		strings.Contains(second.Stdout, "building") {
		t.Fatalf("second make run: exit %d\nstdout:\n%s\nstderr:\n%s", second.Code, second.Stdout, second.Stderr)
	}
	logsAfter := fileText(t, cpLog) + "\x00" + fileText(t, nymphLog)
	beforeCP, beforeNymph, _ := strings.Cut(logsBefore, "\x00")
	afterCP, afterNymph, _ := strings.Cut(logsAfter, "\x00")
	if !strings.HasPrefix(afterCP, beforeCP) || !strings.HasPrefix(afterNymph, beforeNymph) {
		t.Fatal("the second make run rewrote the first one's logs")
	}
	if now, err := os.Stat(filepath.Join(m.binDir, "nymph")); err != nil || !now.ModTime().Equal(binInfo.ModTime()) {
		t.Fatalf("the second make run rebuilt the binaries under the first (%v)", err)
	}
	if n := nymphsOn(t, config); n != 1 {
		t.Fatalf("%d nymphs run on %s after the second make run", n, config)
	}
	resp, err := http.Get("http://" + m.addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the first control plane no longer answers: %v", err)
	}
	resp.Body.Close()

	// Ctrl-C reaches the script (its children, started in the background,
	// ignore SIGINT); it stops both and exits.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("make run did not stop on Ctrl-C:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "==> stopped") {
		t.Errorf("make run did not say it stopped:\n%s", out.String())
	}
	if n := nymphsOn(t, config); n != 0 {
		t.Errorf("%d nymphs still run on %s after Ctrl-C", n, config)
	}
	if c, err := net.Dial("tcp", m.addr); err == nil {
		c.Close()
		t.Errorf("something still listens on %s after Ctrl-C", m.addr)
	}
}

// A make run whose address or workdir is taken says by whom and how to get
// past it, and exits 1 before it builds or writes anything.
func TestMakeRunRefusesWhatIsTaken(t *testing.T) {
	t.Parallel()
	ownStore := newMakeRun(t, "")
	if err := os.MkdirAll(filepath.Join(ownStore.runDir, "cp"), 0o700); err != nil {
		t.Fatal(err)
	}
	left := harness.StartControlPlane(t, harness.CPOptions{DataDir: filepath.Join(ownStore.runDir, "cp")})
	ownStore.setAddr(left.Addr)

	other := harness.StartControlPlane(t, harness.CPOptions{})
	foreign := newMakeRun(t, other.Addr)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // accepts and hangs up: not HTTP at all
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	notOurs := newMakeRun(t, ln.Addr().String())

	lockedWorkdir := newMakeRun(t, harness.FreeAddr(t))
	workdir := filepath.Join(lockedWorkdir.runDir, "nymph", "work")
	if err := os.MkdirAll(workdir, 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := workdirlock.Acquire(workdir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Release() })

	for _, c := range []struct {
		name string
		m    *makeRun
		want []string
	}{
		{"a control plane left on its own store", ownStore, []string{
			fmt.Sprintf("a control plane (pid %d) on this make run's store", left.PID()), "lakeshore daemon list", fmt.Sprintf("kill %d", left.PID())}},
		{"another lakeshore on its address", foreign, []string{
			fmt.Sprintf("another lakeshore control plane (pid %d, store in %s)", other.PID(), other.DataDir), "LAKESHORE_ADDR="}},
		{"something else on its address", notOurs, []string{
			fmt.Sprintf("something (pid %d, ", os.Getpid()), "is already listening on " + ln.Addr().String(), "not a lakeshore control plane", "LAKESHORE_ADDR="}},
		{"a nymph on its workdir", lockedWorkdir, []string{
			fmt.Sprintf("a nymph (pid %d) is already using %s", os.Getpid(), workdir), fmt.Sprintf("kill %d", os.Getpid())}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := c.m.runToEnd(t)
			if r.Code != 1 || strings.Contains(r.Stdout, "building") {
				t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(r.Stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.Stderr)
				}
			}
			for _, f := range []string{"lakeshore.log", "nymph.log", "nymph.toml", "run-local.pid"} {
				if _, err := os.Stat(filepath.Join(c.m.runDir, f)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s was written (%v)", f, err)
				}
			}
			if ents, _ := os.ReadDir(c.m.binDir); len(ents) != 0 {
				t.Errorf("binaries were built into %s", c.m.binDir)
			}
		})
	}
}

// setAddr points m at addr (known only once what holds it has started).
func (m *makeRun) setAddr(addr string) {
	m.addr = addr
	for i, kv := range m.env {
		if strings.HasPrefix(kv, "LAKESHORE_ADDR=") {
			m.env[i] = "LAKESHORE_ADDR=" + addr
		}
	}
}
