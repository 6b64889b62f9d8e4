package sqlstore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"nymph/lakeshore/store/sqlite"
	"nymph/lakeshore/store/sqlstore"
)

// The queries over open execs read the partial index of unfinished execs
// (migration 0015), not the table: the index holds only what is still
// queued or running, while the table keeps every exec ever run. Were a
// state passed as a parameter, the planner could not prove the rows fall
// within the index and would read another index or the table.
func TestOpenExecQueriesReadTheUnfinishedIndex(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	raw, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	for _, q := range []struct{ name, sql string }{
		{"OpenExecs", sqlstore.OpenExecsQuery},
		{"LostExecs", sqlstore.LostExecsQuery},
	} {
		// The plan does not depend on the values bound.
		args := make([]any, strings.Count(q.sql, "?"))
		for i := range args {
			args[i] = "x"
		}
		rows, err := raw.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q.sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", q.name, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if !strings.Contains(strings.Join(plan, "\n"), "execs_unfinished") {
			t.Errorf("%s does not read execs_unfinished; its plan:\n%s", q.name, strings.Join(plan, "\n"))
		}
	}
}
