package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
	"nymph/lakeshore/store/storetest"
)

// TestConformance runs the shared store suite on SQLite files. Replicas is
// false: one file is written through one process's single writer, so the
// concurrency cases race goroutines on one store.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Backend{
		NewDatabase: func(t *testing.T) func(*testing.T) store.Store {
			path := filepath.Join(t.TempDir(), "s.db")
			return func(t *testing.T) store.Store {
				db, err := sqlite.Open(context.Background(), path)
				if err != nil {
					t.Fatalf("open %s: %v", path, err)
				}
				return db
			}
		},
	})
}
