package actors_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"nymph/actors"
	"nymph/daemon/outbox"
	"nymph/messages"
	"nymph/test/wait"
)

// gatedJournal journals through the outbox, then holds each Begin until
// the test lets it go, so the test can look at the world between the
// journal write and the spawn.
type gatedJournal struct {
	inner   *outbox.Outbox
	begun   chan string
	release chan struct{}
}

func (g *gatedJournal) Begin(kind, id, commandID string) error {
	err := g.inner.Begin(kind, id, commandID)
	g.begun <- kind + ":" + id + ":" + commandID
	<-g.release
	return err
}

// Each exec and run is in the journal before anything of it is spawned,
// and leaves it once its outcome is handed to the outbox.
func TestJobsAreJournalledBeforeTheSpawn(t *testing.T) {
	g := &gatedJournal{begun: make(chan string, 4), release: make(chan struct{})}
	h := newHarness(t, setup{deps: func(d *actors.Deps) {
		g.inner = d.Results.(*outbox.Outbox)
		d.Journal = g
	}})
	// A test that fails while a Begin is held must not hold the shutdown.
	t.Cleanup(func() { close(g.release) })
	h.waitPolls(1)
	box := filepath.Join(h.workdir, "outbox")
	marker := filepath.Join(h.workdir, "spawned")
	// -1 while the log cannot be read: an append may be under way.
	entries := func() int {
		open, err := outbox.ReadJournal(box)
		if err != nil {
			return -1
		}
		return len(open)
	}
	awaitBegin := func(want string) {
		t.Helper()
		select {
		case got := <-g.begun:
			if got != want {
				t.Fatalf("journalled %s, want %s", got, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%s never journalled", want)
		}
	}

	cmdID := h.exec("j1", "touch "+marker+"; echo ok")
	awaitBegin("exec:j1:" + cmdID)
	if n := entries(); n != 1 {
		t.Fatalf("%d journal entries while the exec waits to spawn, want 1", n)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the exec ran before its journal entry was written (%v)", err)
	}
	g.release <- struct{}{}
	if r := h.cp.WaitResult("j1", 20*time.Second); r.ExitCode != 0 || r.Stdout != "ok\n" {
		t.Fatalf("j1: %+v", r)
	}
	wait.For(t, 10*time.Second, "the exec's journal entry to go", func() bool { return entries() == 0 })

	runMarker := filepath.Join(h.workdir, "run-spawned")
	runCmd := h.cp.QueueRun(messages.Run{InvocationID: "r1", Script: ptr("touch " + runMarker), RunConfig: messages.RunConfig{}})
	awaitBegin("run:r1:" + runCmd)
	if n := entries(); n != 1 {
		t.Fatalf("%d journal entries while the run waits to spawn, want 1", n)
	}
	if _, err := os.Stat(runMarker); !os.IsNotExist(err) {
		t.Fatalf("the run ran before its journal entry was written (%v)", err)
	}
	g.release <- struct{}{}
	h.cp.Wait(20*time.Second, "the run's ack", func() bool { return len(h.cp.Acks()) == 1 })
	if a := h.cp.Acks()[0]; a.InvocationID != "r1" || a.State != messages.StateSucceeded {
		t.Fatalf("ack %+v", a)
	}
	wait.For(t, 10*time.Second, "the run's journal entry to go", func() bool { return entries() == 0 })
}
