package outbox

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
)

// TestAJobDoesNotWaitForTheSyncInProgress: while the background sync is
// in fdatasync, the next job's begin and the last one's end go on (they
// are on the jobs' paths); closing waits for the sync, then syncs what
// came meanwhile, and the log holds every record.
func TestAJobDoesNotWaitForTheSyncInProgress(t *testing.T) {
	dir := t.TempDir()
	j := newJournal(filepath.Join(dir, JournalFile), zerolog.Nop())
	inSync, release := make(chan struct{}), make(chan struct{})
	var syncs atomic.Int32
	j.fdatasync = func(f *os.File) error {
		if syncs.Add(1) == 1 {
			close(inSync)
			<-release
		}
		return f.Sync()
	}
	begin := func(id string) {
		t.Helper()
		if err := j.begin("exec:"+id, JournalEntry{Kind: JobExec, ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	begin("a")
	<-inSync // the background sync of a's begin holds the disk
	begin("b")
	j.end("exec:a")
	close(release)
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load(); n < 2 {
		t.Fatalf("%d syncs; b's begin, written during the first, was never synced", n)
	}
	open, err := ReadJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 || open[0].ID != "b" {
		t.Fatalf("open jobs %+v, want b alone", open)
	}
}
