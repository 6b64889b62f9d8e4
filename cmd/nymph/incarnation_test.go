package main_test

import (
	"net/http"
	"syscall"
	"testing"
	"time"

	"nymph/test/fakecp"
)

// Every hello of one nymph process names the same incarnation, a re-hello
// after a 401 included, and the next process names another: that is how
// the control plane tells a daemon that lost its jobs in a restart from one
// that only had to say hello again.
func TestHelloIncarnationIsOnePerProcess(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithToken("daemon-token"))
	cfg, _ := writeConfig(t, cp, "")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	cp.Fail(fakecp.RoutePoll, 1, http.StatusUnauthorized)
	cp.Wait(20*time.Second, "a second hello after the 401", func() bool { return len(cp.Hellos()) >= 2 })
	hs := cp.Hellos()
	first := hs[0].Incarnation
	if first == "" || hs[1].Incarnation != first {
		t.Fatalf("incarnations of one process: %q then %q", first, hs[1].Incarnation)
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "the next process's hello", func() bool { return len(cp.Hellos()) > len(hs) })
	if next := cp.Hellos()[len(hs)].Incarnation; next == "" || next == first {
		t.Fatalf("the next process says incarnation %q after %q", next, first)
	}
}
