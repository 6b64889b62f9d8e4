package sqlstore

import (
	"context"
	"fmt"
	"strings"
)

// Ready implements store.Store: one read of schema_migrations, against the
// versions the engine embeds (Dialect.Migrations). A version the database
// has and this binary does not know (a newer replica migrated it) is not
// a fault: migrations only add, and the older replicas keep serving
// through a rolling upgrade.
func (db *DB) Ready(ctx context.Context) error {
	rs, err := db.reader().Query(ctx, `SELECT version FROM schema_migrations`)
	if err != nil {
		return fmt.Errorf("store: not answering: %w", err)
	}
	defer rs.Close()
	applied := map[int]bool{}
	for rs.Next() {
		var v int
		if err := rs.Scan(&v); err != nil {
			return fmt.Errorf("store: read schema_migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("store: read schema_migrations: %w", err)
	}
	var missing []string
	for _, m := range db.d.Migrations {
		if !applied[m.Version] {
			missing = append(missing, m.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("store: schema behind this binary: %d migration(s) not applied: %s", len(missing), strings.Join(missing, ", "))
	}
	return nil
}
