package sqlstore

import (
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// CreateMigrationsTable records which migrations a database has applied;
// both engines accept it as written.
const CreateMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`

// Migration is one embedded schema change, applied once in version order.
type Migration struct {
	Name    string // its path in the embedded FS, for errors
	Version int
	SQL     string
}

// Migrations reads the migrations/*.sql files of fsys, each named
// <version>_<what>.sql, in version order.
func Migrations(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]Migration, 0, len(names))
	for _, name := range names {
		num, _, _ := strings.Cut(strings.TrimPrefix(name, "migrations/"), "_")
		version, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number: %w", name, err)
		}
		text, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Name: name, Version: version, SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
