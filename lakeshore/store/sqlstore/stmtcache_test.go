package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"modernc.org/sqlite"
)

// parses counts what the driver parses: statements prepared, and
// statements run without one (which the driver parses each time).
type parses struct{ prepared, unprepared atomic.Int64 }

// sqliteConn is what every connection of the SQLite driver implements;
// countingConn forwards all of it.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

type countingConn struct {
	sqliteConn
	n *parses
}

func (c countingConn) Unwrap() driver.Conn { return c.sqliteConn }

func (c countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.n.prepared.Add(1)
	return c.sqliteConn.PrepareContext(ctx, query)
}

func (c countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.n.unprepared.Add(1)
	return c.sqliteConn.ExecContext(ctx, query, args)
}

func (c countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.n.unprepared.Add(1)
	return c.sqliteConn.QueryContext(ctx, query, args)
}

type countingConnector struct {
	driver.Connector
	n *parses
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return countingConn{cn.(sqliteConn), c.n}, nil
}

// openCounting is a DB on a real SQLite file laid out as the engine
// package lays it out (one writer, a pool of readers), with statements
// prepared and every parse counted; t(k PRIMARY KEY, v) holds k1..k5.
func openCounting(t *testing.T, readers int) (*DB, *parses) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.db")
	n := &parses{}
	open := func(conns int) *sql.DB {
		c, err := sqlite.NewConnector(path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		p := sql.OpenDB(countingConnector{c, n})
		p.SetMaxOpenConns(conns)
		p.SetMaxIdleConns(conns)
		return p
	}
	w := open(1)
	if _, err := w.Exec(`CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
		INSERT INTO t VALUES ('k1', 1), ('k2', 2), ('k3', 3), ('k4', 4), ('k5', 5)`); err != nil {
		t.Fatal(err)
	}
	n.unprepared.Store(0)
	db := New(w, open(readers), Dialect{PrepareStatements: true})
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return db, n
}

// round is a write transaction and a read, as a store call makes them.
func round(ctx context.Context, db *DB, k string) error {
	err := db.tx(ctx, func(q querier) error {
		var v int
		if err := q.QueryRow(ctx, `SELECT v FROM t WHERE k = ?`, k).Scan(&v); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `UPDATE t SET v = ? WHERE k = ?`, v+1, k)
		return err
	})
	if err != nil {
		return err
	}
	var v int
	return db.reader().QueryRow(ctx, `SELECT v FROM t WHERE k = ?`, k).Scan(&v)
}

// Once each query has run, nothing is parsed again: not on the pools, not
// inside transactions on the writer's one connection.
func TestStatementsArePreparedOncePerConnection(t *testing.T) {
	ctx := context.Background()
	db, n := openCounting(t, 2)
	for range 3 {
		if err := round(ctx, db, "k1"); err != nil {
			t.Fatal(err)
		}
	}
	// The transaction's two queries ran unprepared once, and were
	// prepared after it; the read was prepared as it first ran.
	if p, u := n.prepared.Load(), n.unprepared.Load(); p != 3 || u != 2 {
		t.Fatalf("first rounds: %d prepared, %d unprepared; want 3 and 2", p, u)
	}
	n.prepared.Store(0)
	n.unprepared.Store(0)
	for range 50 {
		if err := round(ctx, db, "k2"); err != nil {
			t.Fatal(err)
		}
	}
	if p, u := n.prepared.Load(), n.unprepared.Load(); p != 0 || u != 0 {
		t.Fatalf("50 more rounds parsed %d prepared and %d unprepared statements, want none", p, u)
	}
	var v int
	if err := db.reader().QueryRow(ctx, `SELECT v FROM t WHERE k = ?`, "k2").Scan(&v); err != nil || v != 52 {
		t.Fatalf("k2 after 50 increments: %d %v", v, err)
	}
}

// A prepared statement cannot run again while its rows are read: within
// one transaction the same query run meanwhile runs unprepared, and both
// results come out whole.
func TestSameQueryWhileItsRowsAreOpen(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 2)
	const all = `SELECT k FROM t WHERE v > ? ORDER BY k`
	var outer, inner []string
	read := func() error {
		outer, inner = nil, nil
		return db.tx(ctx, func(q querier) error {
			rs, err := q.Query(ctx, all, 0)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var k string
				if err := rs.Scan(&k); err != nil {
					return err
				}
				outer = append(outer, k)
				got, err := q.Query(ctx, all, 0)
				if err != nil {
					return err
				}
				ks, err := collectStrings(got)
				if err != nil {
					return err
				}
				inner = append(inner, ks...)
			}
			return rs.Err()
		})
	}
	// The first run prepares the query after the transaction; the second
	// reads it prepared.
	for range 2 {
		if err := read(); err != nil {
			t.Fatal(err)
		}
		if len(outer) != 5 || outer[0] != "k1" || outer[4] != "k5" || len(inner) != 25 {
			t.Fatalf("outer %v, inner %d rows; want k1..k5 and 25", outer, len(inner))
		}
	}
	if db.ws.lookup(all) == nil {
		t.Fatal("the query was never prepared")
	}
}

// Past maxCachedStatements new queries run unprepared and correctly; the
// cache does not grow.
func TestStatementCacheIsBounded(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 2)
	for i := range maxCachedStatements + 20 {
		var v int
		if err := db.reader().QueryRow(ctx, fmt.Sprintf(`SELECT ? + %d`, i), 1).Scan(&v); err != nil || v != i+1 {
			t.Fatalf("query %d: %d %v", i, v, err)
		}
	}
	if db.rs.n != maxCachedStatements {
		t.Fatalf("%d statements cached, want the bound %d", db.rs.n, maxCachedStatements)
	}
	if db.rs.lookup(fmt.Sprintf(`SELECT ? + %d`, maxCachedStatements+1)) != nil {
		t.Fatal("a query past the bound was cached")
	}
}

// Goroutines sharing the cached statements (on the writer in transactions,
// on the readers straight) each see their own results; run with -race.
func TestCachedStatementsUnderConcurrentCallers(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 4)
	const callers, rounds = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprint("k", g%5+1)
			for range rounds {
				if err := round(ctx, db, k); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rs, err := db.reader().Query(ctx, `SELECT SUM(v) FROM t`)
	if err != nil {
		t.Fatal(err)
	}
	sums, err := collectStrings(rs)
	if err != nil || len(sums) != 1 || sums[0] != fmt.Sprint(15+callers*rounds) {
		t.Fatalf("sum after %d increments: %v %v", callers*rounds, sums, err)
	}
}

// Close closes every statement and then the pools; a query afterwards
// fails instead of preparing anew.
func TestCloseClosesTheStatements(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 2)
	if err := round(ctx, db, "k1"); err != nil {
		t.Fatal(err)
	}
	if db.ws.n == 0 || db.rs.n == 0 {
		t.Fatalf("nothing cached: writer %d, readers %d", db.ws.n, db.rs.n)
	}
	if err := db.ws.close(); err != nil {
		t.Fatal(err)
	}
	if err := db.rs.close(); err != nil {
		t.Fatal(err)
	}
	if db.ws.n != 0 || db.rs.n != 0 || db.ws.lookup(`UPDATE t SET v = ? WHERE k = ?`) != nil {
		t.Fatal("statements left after close")
	}
	// The cache closed, queries still run, unprepared.
	if err := round(ctx, db, "k1"); err != nil {
		t.Fatalf("after the caches closed: %v", err)
	}
	if db.ws.n != 0 || db.rs.n != 0 {
		t.Fatal("a closed cache prepared again")
	}
}
