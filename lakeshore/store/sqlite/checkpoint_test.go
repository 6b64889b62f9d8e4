package sqlite

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/store"
)

// TestCommitsLeaveTheLogToTheCheckpointer: the writer never checkpoints
// in a commit (wal_autocheckpoint 0), and a commit has the checkpointer
// move the whole log into the database file soon after.
func TestCommitsLeaveTheLogToTheCheckpointer(t *testing.T) {
	ctx := context.Background()
	type result struct{ frames, moved int }
	seen := make(chan result, 64)
	db, err := openWith(ctx, filepath.Join(t.TempDir(), "s.db"), Options{Log: zerolog.Nop()}, checkpointTuning{commits: checkpointCommits, restart: restartFrames, observe: func(frames, moved int) {
		seen <- result{frames, moved}
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	var auto int
	if err := db.w.QueryRowContext(ctx, `PRAGMA wal_autocheckpoint`).Scan(&auto); err != nil || auto != 0 {
		t.Fatalf("writer's wal_autocheckpoint = %d (%v), want 0", auto, err)
	}
	if _, _, err := db.Hello(ctx, store.Hello{NewID: "w1", Namespace: "default", MachineID: "m", Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// Each checkpoint after the hello's commit moves all the log holds
	// (nothing reads meanwhile); one of them has the hello's frames.
	for {
		r := <-seen
		if r.moved != r.frames {
			t.Fatalf("a passive checkpoint with no reader moved %d of %d frames", r.moved, r.frames)
		}
		if r.frames > 0 {
			break
		}
	}
	// Stopped, it takes a kick without blocking, and the store closes
	// after it.
	if err := db.ckpt.stop(); err != nil {
		t.Fatal(err)
	}
	db.ckpt.kick()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTheLogStartsOverUnderSustainedWrites: with a commit always in
// progress, no passive checkpoint beside the writer ever moves all the
// log, and the writer only starts it over after one that did; the log
// grew without end until the checkpointer finished each long one on the
// writer's connection. Here it must start over again and again while the
// writes never pause.
func TestTheLogStartsOverUnderSustainedWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	const commits = 20
	db, err := openWith(ctx, path, Options{Log: zerolog.Nop()}, checkpointTuning{commits: commits, restart: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	// Each restart of the log bumps the checkpoint sequence number in its
	// header (bytes 12 to 15 of the -wal file).
	restarts := func() uint32 {
		f, err := os.Open(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var h [16]byte
		if _, err := io.ReadFull(f, h[:]); err != nil {
			t.Fatal(err)
		}
		return binary.BigEndian.Uint32(h[12:])
	}
	now := time.Now()
	write := func(i int) {
		if _, _, err := db.Hello(ctx, store.Hello{NewID: fmt.Sprintf("w%d", i), Namespace: "default", MachineID: fmt.Sprintf("m%d", i), Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	first := restarts()
	// Back to back until the log has started over three times; without
	// the writer's checkpoint it did not once in a run this long.
	const most = 200 * commits
	i := 1
	for ; restarts()-first < 3; i++ {
		if i > most {
			t.Fatalf("the log started over %d times in %d back-to-back commits, want it to keep starting over", restarts()-first, most)
		}
		write(i)
	}
	t.Logf("started over 3 times in %d commits", i)
}
