package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
)

// benchWorker is one daemon's rows as a poll finds them: the worker, its
// daemon token and its signing key.
type benchWorker struct {
	id, tokenHash, keyID string
}

func newBenchWorker(b *testing.B, s store.Store, n int, now time.Time) benchWorker {
	b.Helper()
	ctx := context.Background()
	bw := benchWorker{id: fmt.Sprint("w", n), tokenHash: fmt.Sprint("hash-t", n), keyID: fmt.Sprint("k", n)}
	if err := s.CreateToken(ctx, store.Token{ID: fmt.Sprint("t", n), Kind: store.TokenDaemon, Namespace: "default",
		Hash: bw.tokenHash, CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	w, _, err := s.Hello(ctx, store.Hello{NewID: bw.id, Namespace: "default", MachineID: fmt.Sprint("m", n), Label: "l",
		Capabilities: store.Capabilities{Runners: []string{"process"}}, Now: now})
	if err != nil {
		b.Fatal(err)
	}
	bw.id = w.ID
	if err := s.AddKey(ctx, store.Key{ID: bw.keyID, WorkerID: w.ID, Namespace: "default", PublicKey: make([]byte, 32), CreatedAt: now}); err != nil {
		b.Fatal(err)
	}
	return bw
}

// emptyPoll is what the control plane asks of the store for a poll that
// finds no work: the bearer token, the signing key, the poll itself, the
// commands after its cursor (none) and the version to advertise.
func emptyPoll(ctx context.Context, s store.Store, w benchWorker, cursor int64, now time.Time) error {
	if _, err := s.TokenByHash(ctx, w.tokenHash); err != nil {
		return err
	}
	if _, err := s.Key(ctx, w.keyID); err != nil {
		return err
	}
	if _, err := s.RecordPoll(ctx, store.Poll{WorkerID: w.id, Cursor: &cursor, Now: now}); err != nil {
		return err
	}
	if got, err := s.Take(ctx, w.id, cursor, 64, false, now); err != nil || len(got) != 0 {
		return fmt.Errorf("take on an empty queue: %v %v", got, err)
	}
	if v, err := s.TargetVersion(ctx, "default"); err != nil || v == nil {
		return fmt.Errorf("target version: %v %v", v, err)
	}
	return nil
}

// execCycle is one exec through the store: queued with its exec row,
// taken by a poll, acknowledged by the next poll's cursor, finished by
// the result its daemon posts.
func execCycle(ctx context.Context, s store.Store, w benchWorker, id string, now time.Time) error {
	c, err := s.Enqueue(ctx, store.NewCommand{ID: id, WorkerID: w.id, Kind: "exec", Body: []byte{0x80}, Now: now},
		&store.NewExec{ID: "e" + id, Namespace: "default", Command: "true"})
	if err != nil {
		return err
	}
	if got, err := s.Take(ctx, w.id, c.Seq-1, 64, false, now); err != nil || len(got) != 1 {
		return fmt.Errorf("take: %v %v", got, err)
	}
	cur := c.Seq
	if _, err := s.RecordPoll(ctx, store.Poll{WorkerID: w.id, Cursor: &cur, Now: now}); err != nil {
		return err
	}
	_, err = s.FinishRunningExec(ctx, "e"+id, []byte("{}"), now)
	return err
}

// BenchmarkPollAndExec is what the store costs the control plane per empty
// poll and per exec on SQLite, serially and from several goroutines at
// once (each its own worker, as daemons are).
func BenchmarkPollAndExec(b *testing.B) {
	ctx := context.Background()
	open := func(b *testing.B) (*sqlite.DB, time.Time) {
		db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		now := time.Now()
		v := "1.2.3"
		if err := db.SetTargetVersion(ctx, "default", &v, now); err != nil {
			b.Fatal(err)
		}
		return db, now
	}
	b.Run("poll", func(b *testing.B) {
		db, now := open(b)
		w := newBenchWorker(b, db, 0, now)
		for b.Loop() {
			if err := emptyPoll(ctx, db, w, 0, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exec", func(b *testing.B) {
		db, now := open(b)
		w := newBenchWorker(b, db, 0, now)
		i := 0
		for b.Loop() {
			i++
			if err := execCycle(ctx, db, w, fmt.Sprint("c", i), now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("poll-parallel", func(b *testing.B) {
		db, now := open(b)
		var next atomic.Int64
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			w := newBenchWorker(b, db, int(next.Add(1)), now)
			for pb.Next() {
				if err := emptyPoll(ctx, db, w, 0, now); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("exec-parallel", func(b *testing.B) {
		db, now := open(b)
		var next atomic.Int64
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			n := int(next.Add(1))
			w := newBenchWorker(b, db, n, now)
			for i := 0; pb.Next(); i++ {
				if err := execCycle(ctx, db, w, fmt.Sprintf("c%d-%d", n, i), now); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
