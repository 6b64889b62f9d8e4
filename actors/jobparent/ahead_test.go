package jobparent_test

import (
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors/jobparent"
	"nymph/daemon/outbox"
	"nymph/daemon/uplink"
)

// countingJournal is the outbox's journal, counting the records written
// and holding each until the test lets it finish.
type countingJournal struct {
	box     *outbox.Outbox
	mu      sync.Mutex
	begins  int
	started chan struct{}
	release chan struct{}
}

func (c *countingJournal) Begin(kind, id, commandID string) error {
	c.mu.Lock()
	c.begins++
	c.mu.Unlock()
	c.started <- struct{}{}
	<-c.release
	return c.box.Begin(kind, id, commandID)
}

func (c *countingJournal) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.begins
}

func newCountingJournal(t *testing.T) (*countingJournal, string) {
	t.Helper()
	dir := t.TempDir()
	// Nothing is posted: the outbox only holds the journal here.
	client, err := uplink.New("http://127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	box, err := outbox.Open(dir, client, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	c := &countingJournal{box: box, started: make(chan struct{}, 4), release: make(chan struct{})}
	t.Cleanup(func() { close(c.release) })
	return c, dir
}

func receive(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("no %s", what)
	}
}

// A record Start began is the one Begin waits for: written once, on disk
// when Begin returns, and Begin does not return before it is.
func TestAheadBeginWaitsForTheRecordStartBegan(t *testing.T) {
	j, dir := newCountingJournal(t)
	var jobs sync.WaitGroup
	a := jobparent.NewAhead(j, &jobs)
	a.Start("exec", "e1", "c1")
	receive(t, j.started, "record started ahead")

	returned := make(chan error, 1)
	go func() { returned <- a.Begin("exec", "e1", "c1") }()
	select {
	case err := <-returned:
		t.Fatalf("Begin returned (%v) while the record was still being written", err)
	default:
	}
	j.release <- struct{}{}
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	open, err := outbox.ReadJournal(dir)
	if err != nil || len(open) != 1 || open[0].ID != "e1" || open[0].CommandID != "c1" {
		t.Fatalf("journal after Begin: %+v, %v", open, err)
	}
	if n := j.count(); n != 1 {
		t.Fatalf("%d records written, want 1", n)
	}
	jobs.Wait()
}

// A job nobody started ahead is journalled by Begin itself; one that was
// forgotten (it will not run) leaves nothing to wait for.
func TestAheadBeginJournalsAJobNotStartedAhead(t *testing.T) {
	j, dir := newCountingJournal(t)
	var jobs sync.WaitGroup
	a := jobparent.NewAhead(j, &jobs)
	a.Start("run", "r1", "c1")
	receive(t, j.started, "record started ahead")
	a.Forget("run", "r1")
	j.release <- struct{}{}

	returned := make(chan error, 1)
	go func() { returned <- a.Begin("exec", "e2", "c2") }()
	receive(t, j.started, "record written by Begin")
	j.release <- struct{}{}
	if err := <-returned; err != nil {
		t.Fatal(err)
	}
	jobs.Wait()
	open, err := outbox.ReadJournal(dir)
	if err != nil || len(open) != 2 {
		t.Fatalf("journal: %+v, %v", open, err)
	}
	if n := j.count(); n != 2 {
		t.Fatalf("%d records written, want 2", n)
	}
}
