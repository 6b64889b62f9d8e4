package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"nymph/test/wait"
)

var errRefused = errors.New("refused by the caller")

// Writes queued while one runs share the next transaction, each in its
// savepoint: what one caller's failure (its own error, a constraint, a
// context gone before its turn) undoes is its work only, and every caller
// hears its own outcome.
func TestGroupCommitSharesTransactionsAndIsolatesFailures(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 2)
	db.d.GroupCommit = true
	db.group = newGroupCommit(db)
	g := db.group

	// Hold the writer, so that what follows queues up behind it.
	hold, held := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- db.tx(ctx, func(q querier) error {
			close(held)
			<-hold
			_, err := q.Exec(ctx, `INSERT INTO t VALUES ('first', 0)`)
			return err
		})
	}()
	<-held

	const n = 40
	gone, cancelGone := context.WithCancel(ctx)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ctx
			if i == 7 {
				c = gone
			}
			errs[i] = db.tx(c, func(q querier) error {
				if _, err := q.Exec(c, `INSERT INTO t VALUES (?, ?)`, fmt.Sprintf("g%02d", i), i); err != nil {
					return err
				}
				switch {
				case i%5 == 0:
					return errRefused // after its insert: undone
				case i == 9:
					// A second insert of a key that exists: the
					// constraint fails it, its first insert is undone.
					_, err := q.Exec(c, `INSERT INTO t VALUES ('k1', 0)`)
					return err
				}
				return nil
			})
		}()
	}
	wait.For(t, 30*time.Second, "every writer queued", func() bool { return g.q.Len() == n })
	cancelGone()
	before := g.commits.Load()
	close(hold)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("the first writer: %v", err)
	}

	for i, err := range errs {
		var want string
		switch {
		case i%5 == 0:
			if !errors.Is(err, errRefused) {
				t.Errorf("writer %d: %v, want its own refusal", i, err)
			}
		case i == 9 || i == 7:
			if err == nil {
				t.Errorf("writer %d succeeded, want it to fail", i)
			}
		default:
			if err != nil {
				t.Errorf("writer %d: %v", i, err)
			}
			want = fmt.Sprintf("g%02d", i)
		}
		var count int
		if qerr := db.reader().QueryRow(ctx, `SELECT COUNT(*) FROM t WHERE k = ?`, fmt.Sprintf("g%02d", i)).Scan(&count); qerr != nil {
			t.Fatal(qerr)
		}
		if (want != "") != (count == 1) {
			t.Errorf("writer %d (err %v): its row is there %d times", i, err, count)
		}
	}
	if commits := g.commits.Load() - before; commits > 2 {
		t.Errorf("%d queued writers took %d transactions, want them shared (at most %d)", n, commits, (n+groupMax-1)/groupMax+1)
	}
}

// A writer alone in its transaction runs its statements detached from its
// context (no driver goroutine per statement), yet a caller that goes away
// midway still has its work stopped at the next statement and rolled back,
// and the writer stays usable.
func TestGroupCommitAloneCallerGoneMidwayRollsBack(t *testing.T) {
	ctx := context.Background()
	db, _ := openCounting(t, 2)
	db.d.GroupCommit = true
	db.group = newGroupCommit(db)

	gone, cancelGone := context.WithCancel(ctx)
	err := db.tx(gone, func(q querier) error {
		if _, err := q.Exec(gone, `INSERT INTO t VALUES ('midway', 1)`); err != nil {
			return err
		}
		cancelGone()
		_, err := q.Exec(gone, `INSERT INTO t VALUES ('after', 2)`)
		return err
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("the gone caller's write: %v, want context.Canceled", err)
	}
	if err := db.tx(ctx, func(q querier) error {
		_, err := q.Exec(ctx, `INSERT INTO t VALUES ('next', 3)`)
		return err
	}); err != nil {
		t.Fatalf("the next write: %v", err)
	}
	var keys string
	if err := db.reader().QueryRow(ctx, `SELECT COALESCE(group_concat(k, ' '), '') FROM
		(SELECT k FROM t WHERE k IN ('midway', 'after', 'next') ORDER BY k)`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != "next" {
		t.Fatalf("rows %q, want only the next write's", keys)
	}
}
