package orphans_test

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"nymph/daemon/orphans"
)

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has not collected it yet.
	s := string(b)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == ')' {
			return i+2 < len(s) && s[i+2] != 'Z'
		}
	}
	return true
}

func TestMarkerIsStablePerWorkdir(t *testing.T) {
	a, b := orphans.Marker("/var/lib/nymph"), orphans.Marker("/var/lib/nymph/")
	if a != b || a == orphans.Marker("/var/lib/other") {
		t.Fatalf("markers %q %q", a, b)
	}
}

func TestReapKillsMarkedProcessesAndTheirGroups(t *testing.T) {
	marker := orphans.Marker(t.TempDir())
	start := func(env []string) *exec.Cmd {
		// A group leader with a grandchild, as a job leaves behind.
		cmd := exec.Command("bash", "-c", "sleep 300 & sleep 300; wait")
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
		return cmd
	}
	marked := start(append(os.Environ(), orphans.EnvVar+"="+marker))
	other := start(append(os.Environ(), orphans.EnvVar+"="+marker+"x"))
	unmarked := start(os.Environ())

	killed, err := orphans.Reap("/proc", marker)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(killed, marked.Process.Pid) {
		t.Fatalf("killed %v, want %d among them", killed, marked.Process.Pid)
	}
	for _, c := range []*exec.Cmd{other, unmarked} {
		if slices.Contains(killed, c.Process.Pid) {
			t.Fatalf("killed %d, which does not carry the marker", c.Process.Pid)
		}
	}
	// The leader and its grandchildren die; wait for the leader's exit.
	done := make(chan struct{})
	go func() { _ = marked.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("marked process survived Reap")
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range killed {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("pid %d survived Reap", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !alive(other.Process.Pid) || !alive(unmarked.Process.Pid) {
		t.Fatal("an unmarked process was killed")
	}
}
