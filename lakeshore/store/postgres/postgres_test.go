package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/postgres"
	"nymph/lakeshore/store/storetest"
	"nymph/test/realparts"
)

// server is one private PostgreSQL for the whole test function; every
// subtest gets a database of its own on it.
type server struct {
	pg *realparts.Postgres
	n  atomic.Int64
}

func startServer(t *testing.T) *server {
	t.Helper()
	return &server{pg: realparts.StartPostgres(t)}
}

// newDatabase creates an empty database and returns its DSN.
func (s *server) newDatabase(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("t%d", s.n.Add(1))
	conn, err := pgx.Connect(ctx, s.pg.DSN)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	u, err := url.Parse(s.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func open(t *testing.T, dsn string) *postgres.DB {
	t.Helper()
	db, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestPostgres(t *testing.T) {
	srv := startServer(t)

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, storetest.Backend{
			Replicas: true,
			NewDatabase: func(t *testing.T) func(*testing.T) store.Store {
				dsn := srv.newDatabase(t)
				return func(t *testing.T) store.Store {
					db, err := postgres.Open(context.Background(), dsn)
					if err != nil {
						t.Fatalf("open: %v", err)
					}
					return db
				}
			},
		})
	})

	t.Run("ReadyNamesAMissingMigration", func(t *testing.T) {
		ctx := context.Background()
		db := open(t, srv.newDatabase(t))
		if err := db.Ready(ctx); err != nil {
			t.Fatalf("freshly migrated: %v", err)
		}
		var v int
		if err := db.Pool().QueryRow(ctx, `DELETE FROM schema_migrations
			WHERE version = (SELECT MAX(version) FROM schema_migrations) RETURNING version`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		err := db.Ready(ctx)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%04d_", v)) || !strings.Contains(err.Error(), "not applied") {
			t.Fatalf("with migration %d unrecorded: %v", v, err)
		}
	})

	t.Run("ReplicasStartingTogetherMigrateOnce", func(t *testing.T) {
		dsn := srv.newDatabase(t)
		const replicas = 6
		dbs := make([]*postgres.DB, replicas)
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				dbs[i], errs[i] = postgres.Open(context.Background(), dsn)
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("replica %d: %v", i, err)
			}
			t.Cleanup(func() { dbs[i].Close() })
		}
		rows, err := dbs[0].Pool().Query(context.Background(), `SELECT version FROM schema_migrations ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		files, err := filepath.Glob("migrations/*.sql")
		if err != nil || len(files) == 0 {
			t.Fatalf("migrations: %v %v", files, err)
		}
		// The versions the files name, in order (numbers are assigned
		// ahead of merging, so a branch may have a gap).
		want := make([]int32, len(files))
		for i, f := range files {
			num, _, _ := strings.Cut(filepath.Base(f), "_")
			v, err := strconv.Atoi(num)
			if err != nil {
				t.Fatalf("migration %s: %v", f, err)
			}
			want[i] = int32(v)
		}
		if fmt.Sprint(versions) != fmt.Sprint(want) {
			t.Fatalf("applied versions %v, want %v (each once)", versions, want)
		}
	})

	t.Run("BadDSN", func(t *testing.T) {
		if _, err := postgres.Open(context.Background(), "postgres://%zz"); err == nil {
			t.Fatal("a malformed DSN opened")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		u, _ := url.Parse(srv.pg.DSN)
		u.Path = "/no_such_database"
		if _, err := postgres.Open(ctx, u.String()); err == nil {
			t.Fatal("a missing database opened")
		}
	})

	t.Run("CancelledContextChangesNothing", func(t *testing.T) {
		db := open(t, srv.newDatabase(t))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, _, err := db.Hello(ctx, store.Hello{NewID: "w", Namespace: "default", MachineID: "m", Now: time.Now()})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("hello with a cancelled context: %v", err)
		}
		if _, err := db.Worker(ctx, "", "w"); !errors.Is(err, context.Canceled) {
			t.Fatalf("read with a cancelled context: %v", err)
		}
		if ws, err := db.ListWorkers(context.Background(), "default"); err != nil || len(ws) != 0 {
			t.Fatalf("after a cancelled hello: %+v %v", ws, err)
		}
	})

	// A poll cancelled mid-statement (its daemon moved on) must not cost a
	// connection: reconnecting, with TLS to a remote database, is what a
	// busy control plane would otherwise do on every exec.
	t.Run("CancellationsKeepConnections", func(t *testing.T) {
		db := open(t, srv.newDatabase(t))
		w, _, err := db.Hello(context.Background(), store.Hello{NewID: "w", Namespace: "default", MachineID: "m", Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		before := db.Pool().Stat().NewConnsCount()
		for i := range 200 {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				// Land the cancellation anywhere in the poll's statements.
				for range i % 50 {
					runtime.Gosched()
				}
				cancel()
			}()
			_, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Now: time.Now()})
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("poll %d: %v", i, err)
			}
			cancel()
		}
		if n := db.Pool().Stat().NewConnsCount() - before; n > 0 {
			t.Fatalf("200 cancelled polls opened %d new connections", n)
		}
	})

	// pgx's own statement cache is in effect on both of the store's
	// paths: reads straight on the pool (through database/sql) and
	// transactions (on pgx itself). With one connection, what it has
	// prepared is that session's pg_prepared_statements; running the same
	// calls again prepares nothing new.
	t.Run("StatementsArePreparedOnce", func(t *testing.T) {
		ctx := context.Background()
		db := open(t, srv.newDatabase(t)+"&pool_max_conns=1")
		now := time.Now()
		if err := db.CreateToken(ctx, store.Token{ID: "t", Kind: store.TokenDaemon, Namespace: "default", Hash: "h", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		w, _, err := db.Hello(ctx, store.Hello{NewID: "w", Namespace: "default", MachineID: "m", Now: now})
		if err != nil {
			t.Fatal(err)
		}
		poll := func() {
			t.Helper()
			if _, err := db.TokenByHash(ctx, "h"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Now: now}); err != nil {
				t.Fatal(err)
			}
		}
		prepared := func() (all, tokens, workers int) {
			t.Helper()
			rs, err := db.Pool().Query(ctx, `SELECT statement FROM pg_prepared_statements`, pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatal(err)
			}
			defer rs.Close()
			for rs.Next() {
				var s string
				if err := rs.Scan(&s); err != nil {
					t.Fatal(err)
				}
				all++
				if strings.Contains(s, "FROM tokens WHERE hash = $1") {
					tokens++
				}
				if strings.HasPrefix(strings.TrimSpace(s), "UPDATE workers") {
					workers++
				}
			}
			if err := rs.Err(); err != nil {
				t.Fatal(err)
			}
			return all, tokens, workers
		}
		poll()
		all, tokens, workers := prepared()
		if tokens != 1 || workers == 0 {
			t.Fatalf("after a poll %d statements prepared, %d reading a token by hash, %d updating workers; want 1 and some",
				all, tokens, workers)
		}
		for range 5 {
			poll()
		}
		if again, _, _ := prepared(); again != all {
			t.Fatalf("5 more polls took %d prepared statements to %d", all, again)
		}
	})

	t.Run("NotifierCarriesKeysBetweenReplicas", func(t *testing.T) {
		dsn := srv.newDatabase(t)
		a, b := open(t, dsn), open(t, dsn)
		na, nb := a.Notifier(), b.Notifier()
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan string, 16)
		done := make(chan error, 1)
		go func() { done <- na.Listen(ctx, func(key string) { got <- key }) }()
		next := func() string {
			t.Helper()
			select {
			case k := <-got:
				return k
			case err := <-done:
				t.Fatalf("listen ended: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("no wake-up within 10 s")
			}
			return ""
		}
		if k := next(); k != "" {
			t.Fatalf("first delivery %q, want the empty key (listening now)", k)
		}
		// A's own key does not come back to it; B's does, in order.
		if err := na.Publish(ctx, "w:own"); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"w:worker-1", "e:exec 2"} {
			if err := nb.Publish(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		if k := next(); k != "w:worker-1" {
			t.Fatalf("got %q", k)
		}
		if k := next(); k != "e:exec 2" {
			t.Fatalf("got %q", k)
		}
		cancel()
		select {
		case err := <-done:
			if err != context.Canceled {
				t.Fatalf("listen returned %v after cancel", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("listen did not return after cancel")
		}
		if len(got) != 0 {
			t.Fatalf("unexpected wake-up %q", <-got)
		}
	})

	// A notification says when it was sent, in a payload a listener of
	// before reads as ever; a payload of before (no send time) still
	// delivers its key, with no time.
	t.Run("NotificationsCarryTheirSendTime", func(t *testing.T) {
		dsn := srv.newDatabase(t)
		a, b := open(t, dsn), open(t, dsn)
		na, nb := a.Notifier(), b.Notifier()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		type delivery struct {
			key  string
			sent time.Time
		}
		got := make(chan delivery, 16)
		go func() { _ = na.ListenSent(ctx, func(key string, sent time.Time) { got <- delivery{key, sent} }) }()
		next := func() delivery {
			t.Helper()
			select {
			case d := <-got:
				return d
			case <-time.After(10 * time.Second):
				t.Fatal("no wake-up within 10 s")
			}
			return delivery{}
		}
		if d := next(); d.key != "" || !d.sent.IsZero() {
			t.Fatalf("first delivery %+v, want the empty key and no time", d)
		}
		before := time.Now()
		if err := nb.Publish(ctx, "w:timed"); err != nil {
			t.Fatal(err)
		}
		d := next()
		if d.key != "w:timed" || d.sent.Before(before.Truncate(time.Microsecond)) || d.sent.After(time.Now()) {
			t.Fatalf("got %+v, want w:timed sent after %v", d, before)
		}
		// What a publisher of before sends: "ORIGIN KEY".
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `SELECT pg_notify('lakeshore_wake', 'an-old-replica w:untimed')`); err != nil {
			t.Fatal(err)
		}
		if d := next(); d.key != "w:untimed" || !d.sent.IsZero() {
			t.Fatalf("a payload of before delivered %+v", d)
		}
	})

	// Publishes that overlap go out together (one statement on the
	// Notifier's own connection): every key still arrives, and the
	// pool lends no connection to them.
	t.Run("ConcurrentPublishesAllArrive", func(t *testing.T) {
		dsn := srv.newDatabase(t)
		a, b := open(t, dsn), open(t, dsn)
		na, nb := a.Notifier(), b.Notifier()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const keys = 300
		got := make(chan string, keys+1)
		done := make(chan error, 1)
		go func() { done <- na.Listen(ctx, func(key string) { got <- key }) }()
		if k := <-got; k != "" {
			t.Fatalf("first delivery %q, want the empty key", k)
		}
		acquired := b.Pool().Stat().AcquireCount()
		var wg sync.WaitGroup
		errs := make(chan error, keys)
		for i := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := nb.Publish(ctx, fmt.Sprintf("e:%d", i)); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := b.Pool().Stat().AcquireCount() - acquired; n != 0 {
			t.Fatalf("publishing took %d pool connections, want none", n)
		}
		seen := map[string]bool{}
		for len(seen) < keys {
			select {
			case k := <-got:
				if seen[k] {
					t.Fatalf("key %q delivered twice", k)
				}
				seen[k] = true
			case err := <-done:
				t.Fatalf("listen ended: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatalf("%d of %d keys arrived", len(seen), keys)
			}
		}
		b.Close()
		if err := nb.Publish(context.Background(), "e:late"); err == nil {
			t.Fatal("a publish after the database was closed succeeded")
		}
	})

	// The statements a transaction leaves for its commit travel with the
	// COMMIT: when one fails, the whole transaction rolls back. An
	// enqueue whose command id is taken fails there, after its sequence
	// number was bumped, and leaves that number unused.
	t.Run("AFailureAtCommitRollsBackTheTransaction", func(t *testing.T) {
		db := open(t, srv.newDatabase(t))
		ctx := context.Background()
		if _, _, err := db.Hello(ctx, store.Hello{NewID: "w", Namespace: "default", MachineID: "m", Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
		enqueue := func(id string) (store.Command, error) {
			return db.Enqueue(ctx, store.NewCommand{ID: id, WorkerID: "w", Kind: store.KindExec, Body: []byte("{}"), Now: time.Now()}, nil)
		}
		if c, err := enqueue("c1"); err != nil || c.Seq != 1 {
			t.Fatalf("first enqueue: seq %d, %v", c.Seq, err)
		}
		if _, err := enqueue("c1"); err == nil || !strings.Contains(err.Error(), "insert command") {
			t.Fatalf("enqueue of a taken command id: %v, want the insert's failure", err)
		}
		if w, err := db.Worker(ctx, "", "w"); err != nil || w.LastSeq != 1 {
			t.Fatalf("after the failed enqueue: last seq %d (%v), want 1", w.LastSeq, err)
		}
		if c, err := enqueue("c2"); err != nil || c.Seq != 2 {
			t.Fatalf("next enqueue: seq %d, %v; want 2", c.Seq, err)
		}
		cmds, err := db.Take(ctx, "w", 0, 10, false, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) != 2 || cmds[0].ID != "c1" || cmds[1].ID != "c2" {
			t.Fatalf("took %+v, want c1 and c2", cmds)
		}
		if n := db.Pool().Stat().AcquiredConns(); n != 0 {
			t.Fatalf("%d connections still held", n)
		}
	})
}
