package localdaemon_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"nymph/lakeshore/localdaemon"
)

// fakeNymph starts a copy of bash named "nymph" running script, and waits
// until the script prints "ready" so signal dispositions are in place.
func fakeNymph(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	return fakeNymphConfig(t, script, "/etc/nymph/test.toml", "")
}

// fakeNymphConfig is fakeNymph with a chosen --config and working directory.
func fakeNymphConfig(t *testing.T, script, config, dir string) *exec.Cmd {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("bash not found")
		}
		t.Skip("bash not found")
	}
	bin := filepath.Join(t.TempDir(), "nymph")
	src, err := os.ReadFile(bash)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, src, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", script, "run", "--config", config)
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		stdin.Close()
		<-exited
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("fake nymph said %q, %v", line, err)
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return cmd
}

func find(t *testing.T, pid int) localdaemon.Process {
	t.Helper()
	ps, err := localdaemon.Scanner{}.Find(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ps, func(p localdaemon.Process) bool { return p.PID == pid })
	if i < 0 {
		t.Fatalf("pid %d not found among %+v", pid, ps)
	}
	return ps[i]
}

func TestFindDescribesTheProcess(t *testing.T) {
	cmd := fakeNymph(t, "echo ready; read x")
	p := find(t, cmd.Process.Pid)
	if filepath.Base(p.Exe) != "nymph" || p.ConfigPath != "/etc/nymph/test.toml" || p.PPID != os.Getpid() || p.UID != os.Getuid() {
		t.Fatalf("process = %+v", p)
	}
	if d := time.Since(p.StartedAt); d < -2*time.Second || d > time.Minute {
		t.Fatalf("startedAt %v is %v away from now", p.StartedAt, d)
	}
	if len(p.Args) != 6 || p.Args[3] != "run" {
		t.Fatalf("args = %q", p.Args)
	}
}

func TestRelativeConfigIsResolved(t *testing.T) {
	dir := t.TempDir()
	cmd := fakeNymphConfig(t, "echo ready; read x", "conf/nymph.toml", dir)
	if p := find(t, cmd.Process.Pid); p.ConfigPath != filepath.Join(dir, "conf/nymph.toml") {
		t.Fatalf("config = %q", p.ConfigPath)
	}
}

func TestFindIgnoresOtherNames(t *testing.T) {
	ps, err := localdaemon.Scanner{Name: "no-such-program-name"}.Find(context.Background())
	if err != nil || len(ps) != 0 {
		t.Fatalf("Find = %+v, %v", ps, err)
	}
}

func TestStopGraceful(t *testing.T) {
	cmd := fakeNymph(t, "echo ready; read x")
	s := localdaemon.Scanner{}
	p := find(t, cmd.Process.Pid)
	res, err := s.Stop(context.Background(), p, 10*time.Second, false)
	if err != nil || !res.Stopped || res.Signal != "SIGTERM" {
		t.Fatalf("Stop = %+v, %v", res, err)
	}
	if s.Alive(p) {
		t.Fatal("still alive after Stop")
	}
	// Stopping it again is a no-op.
	if res, err := s.Stop(context.Background(), p, time.Second, false); err != nil || !res.Stopped {
		t.Fatalf("second Stop = %+v, %v", res, err)
	}
}

func TestStopStubbornNeedsForce(t *testing.T) {
	cmd := fakeNymph(t, `trap "" TERM; echo ready; read x`)
	s := localdaemon.Scanner{}
	p := find(t, cmd.Process.Pid)

	res, err := s.Stop(context.Background(), p, 200*time.Millisecond, false)
	if !errors.Is(err, localdaemon.ErrStillRunning) || res.Stopped {
		t.Fatalf("Stop without force = %+v, %v", res, err)
	}
	if !s.Alive(p) {
		t.Fatal("died although it ignores SIGTERM")
	}

	res, err = s.Stop(context.Background(), p, 200*time.Millisecond, true)
	if err != nil || !res.Stopped || res.Signal != "SIGKILL" {
		t.Fatalf("Stop with force = %+v, %v", res, err)
	}
}

func TestStopHonoursContext(t *testing.T) {
	cmd := fakeNymph(t, `trap "" TERM; echo ready; read x`)
	p := find(t, cmd.Process.Pid)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (localdaemon.Scanner{}).Stop(ctx, p, time.Minute, true); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}
