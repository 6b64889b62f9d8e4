package sqlite_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"nymph/store"
	"nymph/store/sqlite"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func open(t *testing.T, path string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func hello(t *testing.T, db *sqlite.DB, id, machine, label string) store.Worker {
	t.Helper()
	w, _, err := db.Hello(context.Background(), store.Hello{
		NewID: id, Namespace: "default", MachineID: machine, Label: label,
		Tags: []string{"a=b"}, Capabilities: store.Capabilities{Runners: []string{"process"}},
		Versions: json.RawMessage(`{"daemon":"1.0","protocol":"1"}`), Now: t0,
	})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	return w
}

func enqueue(t *testing.T, db *sqlite.DB, worker, id, kind string) store.Command {
	t.Helper()
	c, err := db.Enqueue(context.Background(), store.NewCommand{ID: id, WorkerID: worker, Kind: kind, Body: []byte{0xc0}, Now: t0}, nil)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return c
}

func ids(cs []store.Command) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHelloIsIdempotentPerIdentity(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	a := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	b, created, err := db.Hello(ctx, store.Hello{NewID: "bbbbbbbbbbbbbbbbbbbbbbbb", Namespace: "default", MachineID: "m1", Label: "gpu", Now: t0.Add(time.Second)})
	if err != nil || created {
		t.Fatalf("second hello: created=%v err=%v", created, err)
	}
	if b.ID != a.ID {
		t.Fatalf("second hello gave %s, want %s", b.ID, a.ID)
	}
	c := hello(t, db, "cccccccccccccccccccccccc", "m1", "")
	if c.Label != c.ID {
		t.Fatalf("empty label should fall back to the id, got %q", c.Label)
	}
	list, err := db.ListWorkers(ctx, "default")
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %d workers, %v", len(list), err)
	}
	if _, err := db.Worker(ctx, "other", a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("worker in another namespace: %v", err)
	}
}

func TestCursorAckAndRedelivery(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "exec")
	enqueue(t, db, w.ID, "c2", "reset_backoff")

	got, err := db.Take(ctx, w.ID, 0, 100, false, t0)
	if err != nil || !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("first take: %v %v", ids(got), err)
	}
	// The response was lost: the daemon polls again with its old cursor 0.
	if _, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(0)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	got, _ = db.Take(ctx, w.ID, 0, 100, false, t0)
	if !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("redelivery: %v", ids(got))
	}
	// Acknowledge through seq 1 only.
	if _, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(1)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	got, _ = db.Take(ctx, w.ID, 1, 100, false, t0)
	if !equal(ids(got), []string{"c2"}) {
		t.Fatalf("after ack 1: %v", ids(got))
	}
	// A cursor beyond anything delivered is clamped: c3 is not lost.
	enqueue(t, db, w.ID, "c3", "reset_backoff")
	wk, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(99)), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if wk.AckedSeq != 2 {
		t.Fatalf("acked seq %d, want 2", wk.AckedSeq)
	}
	got, _ = db.Take(ctx, w.ID, wk.AckedSeq, 100, false, t0)
	if !equal(ids(got), []string{"c3"}) {
		t.Fatalf("after bogus cursor: %v", ids(got))
	}
}

func TestLegacyDeliveryAndHibernateEndsBatch(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "reset_backoff")
	enqueue(t, db, w.ID, "c2", "hibernate")
	enqueue(t, db, w.ID, "c3", "reset_backoff")
	got, _ := db.Take(ctx, w.ID, 0, 100, true, t0)
	if !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("batch should end at the hibernate: %v", ids(got))
	}
	got, _ = db.Take(ctx, w.ID, 0, 100, true, t0)
	if !equal(ids(got), []string{"c3"}) {
		t.Fatalf("legacy second take: %v", ids(got))
	}
	got, _ = db.Take(ctx, w.ID, 0, 100, true, t0)
	if len(got) != 0 {
		t.Fatalf("legacy delivery must not repeat: %v", ids(got))
	}
	all, _ := db.ListCommands(ctx, w.ID)
	for _, c := range all {
		if c.State() != store.CommandAcked {
			t.Fatalf("%s is %s", c.ID, c.State())
		}
	}
}

func TestSetupStateFollowsQueue(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "s1", "setup")
	if w, _ = db.Worker(ctx, "", w.ID); w.State != store.StateSettingUp || w.SetupPending != 1 {
		t.Fatalf("after setup: %s pending=%d", w.State, w.SetupPending)
	}
	_, _ = db.Take(ctx, w.ID, 0, 100, false, t0)
	w, _ = db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(0)), Now: t0})
	if w.State != store.StateSettingUp {
		t.Fatalf("delivered but unacknowledged setup: %s", w.State)
	}
	caps := store.Capabilities{Runners: []string{"process", "docker"}}
	w, _ = db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(1)), UpdatedCapabilities: &caps, Now: t0})
	if w.State != store.StateActive || w.SetupPending != 0 {
		t.Fatalf("after ack: %s pending=%d", w.State, w.SetupPending)
	}
	if !equal(w.Capabilities.Runners, []string{"process", "docker"}) {
		t.Fatalf("capabilities not merged: %v", w.Capabilities.Runners)
	}
}

func TestExecOutputAndResult(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	_, err := db.Enqueue(ctx, store.NewCommand{ID: "c1", WorkerID: w.ID, Kind: "exec", Body: []byte{0x80}, Now: t0},
		&store.NewExec{ID: "e1", Namespace: "default", Command: "echo", Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"hel", "", "lo ", "world"} {
		if _, err := db.AppendOutput(ctx, "e1", []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		off  int64
		max  int
		want string
	}{{0, 100, "hello world"}, {4, 100, "o world"}, {2, 3, "llo"}, {11, 10, ""}, {50, 10, ""}} {
		got, err := db.Output(ctx, "e1", tc.off, tc.max)
		if err != nil || string(got) != tc.want {
			t.Fatalf("output(%d,%d) = %q, %v; want %q", tc.off, tc.max, got, err, tc.want)
		}
	}
	counts, _ := db.OpenExecs(ctx, "default")
	if counts[w.ID] != 1 {
		t.Fatalf("open execs %v", counts)
	}
	if ok, err := db.FinishExec(ctx, "e1", []byte(`{"exit_code":0}`), t0); !ok || err != nil {
		t.Fatalf("finish: %v %v", ok, err)
	}
	if ok, err := db.FinishExec(ctx, "e1", []byte(`{"exit_code":9}`), t0); ok || err != nil {
		t.Fatalf("second finish: %v %v", ok, err)
	}
	e, _ := db.Exec(ctx, "e1")
	if string(e.Result) != `{"exit_code":0}` || e.State != store.ExecFinished || e.OutputLen != 11 {
		t.Fatalf("exec %+v", e)
	}
	if _, err := db.FinishExec(ctx, "nope", nil, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown exec: %v", err)
	}
}

func TestDurableAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	ctx := context.Background()
	db, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "reset_backoff")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = open(t, path)
	got, err := db.Take(ctx, w.ID, 0, 10, false, t0)
	if err != nil || !equal(ids(got), []string{"c1"}) {
		t.Fatalf("after reopen: %v %v", ids(got), err)
	}
}

func TestCleanupAndTokens(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	old := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "old")
	fresh := hello(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m2", "fresh")
	if _, err := db.RecordPoll(ctx, store.Poll{WorkerID: fresh.ID, Now: t0.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	gone, err := db.DeleteWorkersSeenBefore(ctx, "default", t0.Add(time.Hour))
	if err != nil || !equal(gone, []string{old.ID}) {
		t.Fatalf("cleanup: %v %v", gone, err)
	}
	if err := db.DeleteWorker(ctx, "default", old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}

	exp := t0.Add(time.Hour)
	if err := db.CreateToken(ctx, store.Token{ID: "t1", Kind: store.TokenEnroll, Namespace: "default", Hash: "abc", CreatedAt: t0, ExpiresAt: &exp}); err != nil {
		t.Fatal(err)
	}
	tok, err := db.TokenByHash(ctx, "abc")
	if err != nil || tok.ID != "t1" || tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(exp) {
		t.Fatalf("token %+v %v", tok, err)
	}
	if _, err := db.TokenByHash(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
}

func TestReportsAreIdempotent(t *testing.T) {
	db := open(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := context.Background()
	a := store.Ack{InvocationID: "i1", WorkerID: "w", State: "succeeded", ResultBlob: []byte("r"), ReceivedAt: t0}
	if ok, err := db.SaveAck(ctx, a); !ok || err != nil {
		t.Fatalf("ack: %v %v", ok, err)
	}
	if ok, err := db.SaveAck(ctx, a); ok || err != nil {
		t.Fatalf("repeat ack: %v %v", ok, err)
	}
	c := store.ResultChunk{InvocationID: "i1", Seq: 0, Data: []byte("x"), ReceivedAt: t0}
	if ok, err := db.SaveResultChunk(ctx, c); !ok || err != nil {
		t.Fatalf("chunk: %v %v", ok, err)
	}
	if ok, err := db.SaveResultChunk(ctx, c); ok || err != nil {
		t.Fatalf("repeat chunk: %v %v", ok, err)
	}
	if err := db.SaveEvent(ctx, store.Event{ID: "ev1", InvocationID: "i1", Kind: "log", TS: t0, ReceivedAt: t0}); err != nil {
		t.Fatal(err)
	}
}

func ptr[T any](v T) *T { return &v }
