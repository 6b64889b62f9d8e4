package sqlite

import (
	"context"
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
	db, err := openWith(ctx, filepath.Join(t.TempDir(), "s.db"), Options{Log: zerolog.Nop()}, func(frames, moved int) {
		seen <- result{frames, moved}
	})
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
