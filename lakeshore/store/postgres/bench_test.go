package postgres_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/postgres"
	"nymph/lakeshore/store/sqlite"
	"nymph/test/realparts"
)

// BenchmarkCommandRoundTrip is what one exec costs the store: enqueue it
// with its exec row, take it on a poll, acknowledge it by cursor, finish
// the exec — on PostgreSQL and, for comparison, on the embedded SQLite.
func BenchmarkCommandRoundTrip(b *testing.B) {
	ctx := context.Background()
	bench := func(b *testing.B, s store.Store) {
		now := time.Now()
		w, _, err := s.Hello(ctx, store.Hello{NewID: "w", Namespace: "default", MachineID: "m", Label: "l",
			Capabilities: store.Capabilities{Runners: []string{"process"}}, Now: now})
		if err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			i++
			id := fmt.Sprint("c", i)
			c, err := s.Enqueue(ctx, store.NewCommand{ID: id, WorkerID: w.ID, Kind: "exec", Body: []byte{0x80}, Now: now},
				&store.NewExec{ID: "e" + id, Namespace: "default", Command: "true"})
			if err != nil {
				b.Fatal(err)
			}
			if got, err := s.Take(ctx, w.ID, c.Seq-1, 64, false, now); err != nil || len(got) != 1 {
				b.Fatal(got, err)
			}
			cur := c.Seq
			if _, err := s.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: &cur, Now: now}); err != nil {
				b.Fatal(err)
			}
			if _, err := s.FinishExec(ctx, "e"+id, []byte("{}"), now); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("sqlite", func(b *testing.B) {
		db, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "s.db"))
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		bench(b, db)
	})
	b.Run("postgres", func(b *testing.B) {
		pg := realparts.StartPostgres(b)
		db, err := postgres.Open(ctx, pg.DSN)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		bench(b, db)
	})
}
