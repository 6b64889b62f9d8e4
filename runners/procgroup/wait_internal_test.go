package procgroup

import (
	"os/exec"
	"syscall"
	"testing"
)

// A leader's exit is waited for in the poller, not by a thread blocked in
// waitid (see waitExitNoReap), and the leader is left unreaped: its pid
// stays a zombie that the group can still be signalled by.
func TestExitIsWaitedForInThePollerAndLeftUnreaped(t *testing.T) {
	cmd := exec.Command("bash", "-c", "read line; true")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	polled := make(chan bool, 1)
	go func() { polled <- waitExitPolled(cmd.Process.Pid) }()
	// The child is blocked on its stdin until this close: the wait above
	// has to have been for the exit.
	stdin.Close()
	if !<-polled {
		t.Fatal("no pollable pidfd: this kernel is older than 5.10, or pidfd_open is refused")
	}
	if err := syscall.Kill(cmd.Process.Pid, 0); err != nil {
		t.Fatalf("the leader was reaped by the wait: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("leader: %v", err)
	}
}
