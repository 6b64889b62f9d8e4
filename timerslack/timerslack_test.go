package timerslack

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func threadSlack(t *testing.T, tid string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCoarsenSetsEveryThreadAndChildrenGetTheOriginal: every thread of
// the process takes the slack; a child started through Child has the one
// the process began with, and one started without it the coarse one.
func TestCoarsenSetsEveryThreadAndChildrenGetTheOriginal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack needs CAP_SYS_NICE (run as root)")
	}
	runtime.LockOSThread()
	was, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	// Coarser than what runs now (a run before this one, -count, left
	// its own); the original is the one the process began with.
	coarse := max(3*time.Millisecond, time.Duration(was)+time.Millisecond)
	first := original.Load() == 0
	n, err := Coarsen(coarse)
	if err != nil || n == 0 {
		t.Fatalf("Coarsen: %d threads, %v", n, err)
	}
	orig := original.Load()
	if first && orig != int64(was) || orig <= 0 || orig >= coarse.Nanoseconds() {
		t.Fatalf("the original slack kept is %d ns; the process began with %d", orig, was)
	}
	tids, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if got := threadSlack(t, tid.Name()); got != coarse.Nanoseconds() {
			t.Errorf("thread %s: slack %d ns, want %d", tid.Name(), got, coarse.Nanoseconds())
		}
	}
	childSlack := func(through bool) int64 {
		t.Helper()
		cmd := exec.Command("cat", "/proc/self/timerslack_ns")
		var out strings.Builder
		cmd.Stdout = &out
		start := cmd.Start
		if through {
			start = func() error { return Child(cmd.Start) }
		}
		if err := start(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := childSlack(true); got != orig {
		t.Errorf("a child through Child has a slack of %d ns, want the original %d", got, orig)
	}
	if got := childSlack(false); got != coarse.Nanoseconds() {
		t.Errorf("a child started plainly has a slack of %d ns, want the coarse %d (else Child proves nothing)", got, coarse.Nanoseconds())
	}
	// Coarsening to what is there already changes nothing.
	if n, err := Coarsen(coarse); n != 0 || err != nil {
		t.Fatalf("Coarsen again: %d threads, %v", n, err)
	}
}
