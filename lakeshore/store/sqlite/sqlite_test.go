package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
)

// TestFileIsWALAndReopens covers what the shared suite cannot: the file
// on disk is a WAL-mode SQLite database, and opening it again (migrations
// already applied) keeps what was written.
func TestFileIsWALAndReopens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if _, _, err := db.Hello(ctx, store.Hello{NewID: "w1", Namespace: "default", MachineID: "m", Now: time.Now()}); err != nil {
		t.Fatalf("hello: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	header := make([]byte, 20)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(header, 0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if string(header[:16]) != "SQLite format 3\x00" {
		t.Fatalf("not a SQLite file: %q", header[:16])
	}
	// Bytes 18 and 19 are the write and read versions: 2 means WAL.
	if header[18] != 2 || header[19] != 2 {
		t.Fatalf("file versions %d/%d, want 2/2 (WAL)", header[18], header[19])
	}

	db, err = sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if w, err := db.Worker(ctx, "default", "w1"); err != nil || w.MachineID != "m" {
		t.Fatalf("after reopen: %+v %v", w, err)
	}
}

func TestOpenInMissingDirectoryFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "no", "such", "dir", "s.db")
	if db, err := sqlite.Open(context.Background(), path); err == nil {
		db.Close()
		t.Fatal("opened a database in a missing directory")
	}
}

// Ready names a migration the file lacks: the schema is behind this
// binary (an older file restored, or a migration's row removed by hand).
func TestReadyNamesAMissingMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("freshly migrated: %v", err)
	}
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var v int
	if err := raw.QueryRowContext(ctx, `DELETE FROM schema_migrations
		WHERE version = (SELECT MAX(version) FROM schema_migrations) RETURNING version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	err = db.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%04d_", v)) || !strings.Contains(err.Error(), "not applied") {
		t.Fatalf("with migration %d unrecorded: %v", v, err)
	}
}
