package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

func testHelloIsIdempotentPerIdentity(t *testing.T, e *env) {
	db := e.store(t)
	a := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	b, created, err := db.Hello(bg, store.Hello{NewID: "bbbbbbbbbbbbbbbbbbbbbbbb", Namespace: "default", MachineID: "m1", Label: "gpu", Now: t0.Add(time.Second)})
	if err != nil || created {
		t.Fatalf("second hello: created=%v err=%v", created, err)
	}
	if b.ID != a.ID {
		t.Fatalf("second hello gave %s, want %s", b.ID, a.ID)
	}
	if !b.LastSeenAt.Equal(t0.Add(time.Second)) || !b.CreatedAt.Equal(t0) {
		t.Fatalf("second hello: created %v, last seen %v", b.CreatedAt, b.LastSeenAt)
	}
	if string(b.Versions) != "{}" || len(b.Tags) != 0 || b.Tags == nil {
		t.Fatalf("second hello should replace versions and tags: %s %v", b.Versions, b.Tags)
	}
	c := hello(t, db, "cccccccccccccccccccccccc", "m1", "")
	if c.Label != c.ID {
		t.Fatalf("empty label should fall back to the id, got %q", c.Label)
	}
	list, err := db.ListWorkers(bg, "default")
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %d workers, %v", len(list), err)
	}
	if _, err := db.Worker(bg, "other", a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("worker in another namespace: %v", err)
	}
	if w, err := db.Worker(bg, "", a.ID); err != nil || w.Namespace != "default" || w.State != operatorapi.StateActive {
		t.Fatalf("worker in any namespace: %+v %v", w, err)
	}
	if other, err := db.ListWorkers(bg, "other"); err != nil || other == nil || len(other) != 0 {
		t.Fatalf("empty namespace lists %v, %v; want an empty list", other, err)
	}
}

func testWorkersByLabel(t *testing.T, e *env) {
	db := e.store(t)
	b := hello(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m2", "gpu")
	a := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	hello(t, db, "cccccccccccccccccccccccc", "m3", "gpu-2")
	hello(t, db, "dddddddddddddddddddddddd", "m4", "cpu")
	got, err := db.WorkersByLabel(bg, "default", "gpu")
	if err != nil || len(got) != 2 || got[0].ID != a.ID || got[1].ID != b.ID {
		t.Fatalf("label gpu: %v %v; want %s then %s (a label is not a prefix)", workerIDs(got), err, a.ID, b.ID)
	}
	if got[0].Label != "gpu" || got[0].MachineID != "m1" {
		t.Fatalf("label gpu: the whole row, got %+v", got[0])
	}
	for _, c := range []struct{ ns, label string }{{"default", "gp"}, {"default", "GPU"}, {"other", "gpu"}, {"default", ""}} {
		got, err := db.WorkersByLabel(bg, c.ns, c.label)
		if err != nil || got == nil || len(got) != 0 {
			t.Fatalf("namespace %q label %q: %v %v; want an empty list", c.ns, c.label, workerIDs(got), err)
		}
	}
}

func workerIDs(ws []store.Worker) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.ID)
	}
	return out
}

func testCursorAckAndRedelivery(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	if c := enqueue(t, db, w.ID, "c1", "exec"); c.Seq != 1 {
		t.Fatalf("first command seq %d", c.Seq)
	}
	enqueue(t, db, w.ID, "c2", "reset_backoff")

	got, err := db.Take(bg, w.ID, 0, 100, false, t0)
	if err != nil || !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("first take: %v %v", ids(got), err)
	}
	if got[0].DeliveredAt == nil || got[0].AckedAt != nil || got[1].Seq != 2 {
		t.Fatalf("first take: %+v", got)
	}
	// The response was lost: the daemon polls again with its old cursor 0.
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(0)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	got, _ = db.Take(bg, w.ID, 0, 100, false, t0)
	if !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("redelivery: %v", ids(got))
	}
	// Acknowledge through seq 1 only.
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(1)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	got, _ = db.Take(bg, w.ID, 1, 100, false, t0)
	if !equal(ids(got), []string{"c2"}) {
		t.Fatalf("after ack 1: %v", ids(got))
	}
	// A cursor beyond anything delivered is clamped: c3 is not lost.
	enqueue(t, db, w.ID, "c3", "reset_backoff")
	wk, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(99)), Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if wk.AckedSeq != 2 || wk.DeliveredSeq != 2 || wk.LastSeq != 3 {
		t.Fatalf("seqs last=%d delivered=%d acked=%d, want 3 2 2", wk.LastSeq, wk.DeliveredSeq, wk.AckedSeq)
	}
	got, _ = db.Take(bg, w.ID, wk.AckedSeq, 100, false, t0)
	if !equal(ids(got), []string{"c3"}) {
		t.Fatalf("after bogus cursor: %v", ids(got))
	}
	all, err := db.ListCommands(bg, w.ID)
	if err != nil || len(all) != 3 || all[0].State() != store.CommandAcked || all[2].State() != store.CommandDelivered {
		t.Fatalf("commands %+v %v", all, err)
	}
	if _, err := db.Take(bg, "nobody", 0, 10, false, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("take for an unknown worker: %v", err)
	}
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: "nobody", Now: t0}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("poll of an unknown worker: %v", err)
	}
	if _, err := db.Enqueue(bg, store.NewCommand{ID: "cx", WorkerID: "nobody", Kind: "exec", Now: t0}, nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("enqueue for an unknown worker: %v", err)
	}
}

// AckThrough acknowledges as RecordPoll's cursor does, clamped to what was
// delivered and never backwards, and writes nothing else of the worker.
func testAckThroughAcknowledgesOnly(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "exec")
	enqueue(t, db, w.ID, "c2", "exec")
	if got, err := db.Take(bg, w.ID, 0, 100, false, t0); err != nil || !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("take: %v %v", ids(got), err)
	}
	enqueue(t, db, w.ID, "c3", "exec")
	later := t0.Add(time.Hour)
	if acked, err := db.AckThrough(bg, w.ID, 1, later); err != nil || acked != 1 {
		t.Fatalf("ack through 1: %d %v", acked, err)
	}
	if got, _ := db.Take(bg, w.ID, 1, 100, false, t0); !equal(ids(got), []string{"c2", "c3"}) {
		t.Fatalf("after ack 1: %v", ids(got))
	}
	// Beyond what was delivered (c3 is now): clamped, c3's delivery kept.
	enqueue(t, db, w.ID, "c4", "exec")
	if acked, err := db.AckThrough(bg, w.ID, 99, later); err != nil || acked != 3 {
		t.Fatalf("ack through 99: %d %v, want 3", acked, err)
	}
	if acked, err := db.AckThrough(bg, w.ID, 0, later); err != nil || acked != 3 {
		t.Fatalf("an older cursor: %d %v, want 3 still", acked, err)
	}
	all, err := db.ListCommands(bg, w.ID)
	if err != nil || len(all) != 4 {
		t.Fatalf("commands %+v %v", all, err)
	}
	for i, want := range []string{store.CommandAcked, store.CommandAcked, store.CommandAcked, store.CommandQueued} {
		if all[i].State() != want {
			t.Fatalf("command %s is %s, want %s", all[i].ID, all[i].State(), want)
		}
	}
	wk, err := db.Worker(bg, "", w.ID)
	if err != nil {
		t.Fatal(err)
	}
	if wk.AckedSeq != 3 || wk.DeliveredSeq != 3 || wk.LastSeq != 4 || !wk.LastSeenAt.Equal(w.LastSeenAt) {
		t.Fatalf("worker after acks: last=%d delivered=%d acked=%d seen %v (was %v)", wk.LastSeq, wk.DeliveredSeq, wk.AckedSeq, wk.LastSeenAt, w.LastSeenAt)
	}
	if _, err := db.AckThrough(bg, "nobody", 1, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("ack for an unknown worker: %v", err)
	}
}

// Enqueue returns the worker as it left it, and, given a namespace,
// finds no worker of another one and queues nothing for it.
func testEnqueueTellsOfItsWorker(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	c, err := db.Enqueue(bg, store.NewCommand{ID: "c1", WorkerID: w.ID, Namespace: "default", Kind: "exec", Now: t0},
		&store.NewExec{ID: "e1", Namespace: "default", Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	want := store.EnqueuedWorker{Namespace: "default", Label: "gpu", State: operatorapi.StateActive, LastSeenAt: w.LastSeenAt}
	if c.Worker.Namespace != want.Namespace || c.Worker.Label != want.Label || c.Worker.State != want.State ||
		!c.Worker.LastSeenAt.Equal(want.LastSeenAt) || c.Worker.HibernatingUntil != nil {
		t.Fatalf("enqueue told of %+v, want %+v", c.Worker, want)
	}
	until := t0.Add(time.Hour)
	h, err := db.Enqueue(bg, store.NewCommand{ID: "c2", WorkerID: w.ID, Kind: store.KindHibernate, HibernateUntil: &until, Now: t0}, nil)
	if err != nil || h.Worker.HibernatingUntil == nil || !h.Worker.HibernatingUntil.Equal(until) {
		t.Fatalf("a hibernate's enqueue told of %+v, %v; want its deadline", h.Worker, err)
	}
	for _, kind := range []string{"exec", store.KindHibernate} {
		_, err := db.Enqueue(bg, store.NewCommand{ID: "cx-" + kind, WorkerID: w.ID, Namespace: "other", Kind: kind, HibernateUntil: &t0, Now: t0},
			&store.NewExec{ID: "ex-" + kind, Namespace: "other", Command: "true"})
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s for a worker of another namespace: %v, want not found", kind, err)
		}
	}
	cmds, err := db.ListCommands(bg, w.ID)
	if err != nil || len(cmds) != 2 {
		t.Fatalf("commands after the refused enqueues: %+v %v, want c1 and c2 alone", cmds, err)
	}
	if _, err := db.Exec(bg, "ex-exec"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused exec was stored: %v", err)
	}
}

func testLegacyDeliveryAndHibernateEndsBatch(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "reset_backoff")
	until := t0.Add(time.Hour)
	if _, err := db.Enqueue(bg, store.NewCommand{ID: "c2", WorkerID: w.ID, Kind: store.KindHibernate, Body: []byte{0xc0}, Now: t0, HibernateUntil: &until}, nil); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, w.ID, "c3", "reset_backoff")
	if wk, _ := db.Worker(bg, "", w.ID); wk.HibernatingUntil == nil || !wk.HibernatingUntil.Equal(until) {
		t.Fatalf("hibernating until %v", wk.HibernatingUntil)
	}
	got, _ := db.Take(bg, w.ID, 0, 100, true, t0)
	if !equal(ids(got), []string{"c1", "c2"}) {
		t.Fatalf("batch should end at the hibernate: %v", ids(got))
	}
	got, _ = db.Take(bg, w.ID, 0, 100, true, t0)
	if !equal(ids(got), []string{"c3"}) {
		t.Fatalf("legacy second take: %v", ids(got))
	}
	got, _ = db.Take(bg, w.ID, 0, 100, true, t0)
	if len(got) != 0 {
		t.Fatalf("legacy delivery must not repeat: %v", ids(got))
	}
	all, _ := db.ListCommands(bg, w.ID)
	for _, c := range all {
		if c.State() != store.CommandAcked {
			t.Fatalf("%s is %s", c.ID, c.State())
		}
	}
	// A poll after the hibernation ends clears it; a hello clears it too.
	wk, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Now: until})
	if err != nil || wk.HibernatingUntil != nil || wk.AckedSeq != 3 {
		t.Fatalf("after the hibernation: %+v %v", wk, err)
	}
}

func testSetupStateFollowsQueue(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "s1", "setup")
	if w, _ = db.Worker(bg, "", w.ID); w.State != operatorapi.StateSettingUp || w.SetupPending != 1 {
		t.Fatalf("after setup: %s pending=%d", w.State, w.SetupPending)
	}
	// A re-hello while the setup is pending keeps the worker setting up.
	if again := hello(t, db, "x", "m1", "gpu"); again.State != operatorapi.StateSettingUp {
		t.Fatalf("re-hello during setup: %s", again.State)
	}
	_, _ = db.Take(bg, w.ID, 0, 100, false, t0)
	w, _ = db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(0)), Now: t0})
	if w.State != operatorapi.StateSettingUp {
		t.Fatalf("delivered but unacknowledged setup: %s", w.State)
	}
	caps := store.Capabilities{Runners: []string{"process", "docker"}}
	w, _ = db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(1)), UpdatedCapabilities: &caps, Now: t0})
	if w.State != operatorapi.StateActive || w.SetupPending != 0 {
		t.Fatalf("after ack: %s pending=%d", w.State, w.SetupPending)
	}
	if !equal(w.Capabilities.Runners, []string{"process", "docker"}) {
		t.Fatalf("capabilities not merged: %v", w.Capabilities.Runners)
	}
	// A poll without capabilities keeps them; it records what runs.
	w, _ = db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Queue: "q", Now: t0,
		Running: []store.InvocationStatus{{InvocationID: "i1", State: "running", StartedAt: t0, StdoutTail: "x"}}})
	if !equal(w.Capabilities.Runners, []string{"process", "docker"}) || w.PollQueue != "q" ||
		len(w.Running) != 1 || w.Running[0].InvocationID != "i1" || !w.Running[0].StartedAt.Equal(t0) {
		t.Fatalf("after a plain poll: %+v", w)
	}
}

func testExecOutputAndResult(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	_, err := db.Enqueue(bg, store.NewCommand{ID: "c1", WorkerID: w.ID, Kind: "exec", Body: []byte{0x80}, Now: t0},
		&store.NewExec{ID: "e1", Namespace: "default", Command: "echo", Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	if x, err := db.Exec(bg, "e1"); err != nil || x.State != operatorapi.ExecQueued || !x.Stream || x.CommandID != "c1" || x.WorkerID != w.ID {
		t.Fatalf("queued exec %+v %v", x, err)
	}
	if _, err := db.Take(bg, w.ID, 0, 10, false, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if x, _ := db.Exec(bg, "e1"); x.State != operatorapi.ExecRunning || x.StartedAt == nil || !x.StartedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("delivered exec %+v", x)
	}
	for _, s := range []string{"hel", "", "lo ", "world"} {
		if _, err := db.AppendOutput(bg, "e1", []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		off  int64
		max  int
		want string
	}{{0, 100, "hello world"}, {4, 100, "o world"}, {2, 3, "llo"}, {11, 10, ""}, {50, 10, ""}, {0, 0, ""}} {
		got, err := db.Output(bg, "e1", tc.off, tc.max)
		if err != nil || string(got) != tc.want {
			t.Fatalf("output(%d,%d) = %q, %v; want %q", tc.off, tc.max, got, err, tc.want)
		}
	}
	counts, _ := db.OpenExecs(bg, "default")
	if counts[w.ID] != 1 {
		t.Fatalf("open execs %v", counts)
	}
	if ok, err := db.FinishExec(bg, "e1", []byte(`{"exit_code":0}`), t0); !ok || err != nil {
		t.Fatalf("finish: %v %v", ok, err)
	}
	if ok, err := db.FinishExec(bg, "e1", []byte(`{"exit_code":9}`), t0); ok || err != nil {
		t.Fatalf("second finish: %v %v", ok, err)
	}
	x, _ := db.Exec(bg, "e1")
	if string(x.Result) != `{"exit_code":0}` || x.State != operatorapi.ExecFinished || x.OutputLen != 11 || x.FinishedAt == nil {
		t.Fatalf("exec %+v", x)
	}
	if counts, _ := db.OpenExecs(bg, "default"); len(counts) != 0 {
		t.Fatalf("open execs after finishing %v", counts)
	}
	if _, err := db.FinishExec(bg, "nope", nil, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown exec: %v", err)
	}
	if _, err := db.AppendOutput(bg, "nope", []byte("x")); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("output of an unknown exec: %v", err)
	}
	if _, err := db.Exec(bg, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("read an unknown exec: %v", err)
	}
}

func testDurableAcrossReopen(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueue(t, db, w.ID, "c1", "reset_backoff")
	db = e.reopen(t)
	got, err := db.Take(bg, w.ID, 0, 10, false, t0)
	if err != nil || !equal(ids(got), []string{"c1"}) {
		t.Fatalf("after reopen: %v %v", ids(got), err)
	}
	if c := enqueue(t, db, w.ID, "c2", "reset_backoff"); c.Seq != 2 {
		t.Fatalf("sequence after reopen: %d", c.Seq)
	}
}

func testCleanupAndTokens(t *testing.T, e *env) {
	db := e.store(t)
	old := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "old")
	enqueue(t, db, old.ID, "c1", "reset_backoff")
	fresh := hello(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m2", "fresh")
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: fresh.ID, Now: t0.Add(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	gone, err := db.DeleteWorkersSeenBefore(bg, "default", t0.Add(time.Hour))
	if err != nil || !equal(gone, []string{old.ID}) {
		t.Fatalf("cleanup: %v %v", gone, err)
	}
	if cmds, err := db.ListCommands(bg, old.ID); err != nil || len(cmds) != 0 {
		t.Fatalf("commands of a removed worker: %v %v", ids(cmds), err)
	}
	if gone, err := db.DeleteWorkersSeenBefore(bg, "default", t0.Add(time.Hour)); err != nil || len(gone) != 0 {
		t.Fatalf("second cleanup: %v %v", gone, err)
	}
	if err := db.DeleteWorker(bg, "default", old.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := db.DeleteWorker(bg, "other", fresh.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete in another namespace: %v", err)
	}
	if err := db.DeleteWorker(bg, "default", fresh.ID); err != nil {
		t.Fatal(err)
	}

	exp := t0.Add(time.Hour)
	if err := db.CreateToken(bg, store.Token{ID: "t1", Kind: store.TokenEnroll, Namespace: "default", Label: "l", Hash: "abc", CreatedAt: t0, ExpiresAt: &exp}); err != nil {
		t.Fatal(err)
	}
	tok, err := db.TokenByHash(bg, "abc")
	if err != nil || tok.ID != "t1" || tok.Label != "l" || tok.ExpiresAt == nil || !tok.ExpiresAt.Equal(exp) || tok.ConsumedAt != nil || tok.RevokedAt != nil {
		t.Fatalf("token %+v %v", tok, err)
	}
	if err := db.CreateToken(bg, store.Token{ID: "t2", Kind: store.TokenDaemon, Namespace: "default", Hash: "abc", CreatedAt: t0}); err == nil {
		t.Fatal("a second token with the same hash was stored")
	}
	if _, err := db.TokenByHash(bg, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown token: %v", err)
	}
}

func testReportsAreIdempotent(t *testing.T, e *env) {
	db := e.store(t)
	a := store.Ack{InvocationID: "i1", WorkerID: "w", State: "succeeded", ResultBlob: []byte("r"), Error: []byte(`{"type":"X"}`), ReceivedAt: t0}
	if ok, err := db.SaveAck(bg, a); !ok || err != nil {
		t.Fatalf("ack: %v %v", ok, err)
	}
	if ok, err := db.SaveAck(bg, a); ok || err != nil {
		t.Fatalf("repeat ack: %v %v", ok, err)
	}
	c := store.ResultChunk{InvocationID: "i1", Seq: 0, Data: []byte("x"), ReceivedAt: t0}
	if ok, err := db.SaveResultChunk(bg, c); !ok || err != nil {
		t.Fatalf("chunk: %v %v", ok, err)
	}
	if ok, err := db.SaveResultChunk(bg, c); ok || err != nil {
		t.Fatalf("repeat chunk: %v %v", ok, err)
	}
	c.Seq, c.Last = 1, true
	if ok, err := db.SaveResultChunk(bg, c); !ok || err != nil {
		t.Fatalf("next chunk: %v %v", ok, err)
	}
	if ok, err := db.SaveEvent(bg, store.Event{ID: "ev1", InvocationID: "i1", Kind: "log", TS: t0, ReceivedAt: t0}); !ok || err != nil {
		t.Fatal(ok, err)
	}
}

// testTouchWorkers: a batch of presence moves each worker's last seen
// forward only, changes nothing else, spans more than one statement, and
// names the ids that have no row.
func testTouchWorkers(t *testing.T, e *env) {
	db := e.store(t)
	a := hello(t, db, "wa", "ma", "la")
	b := hello(t, db, "wb", "mb", "lb")
	seen := []store.Seen{{WorkerID: a.ID, At: t0.Add(10 * time.Second)}, {WorkerID: b.ID, At: t0.Add(-time.Minute)}}
	var want []string
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("gone-%03d", i)
		seen = append(seen, store.Seen{WorkerID: id, At: t0})
		want = append(want, id)
	}
	missing, err := db.TouchWorkers(bg, seen)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(missing)
	if !slices.Equal(missing, want) {
		t.Fatalf("missing %d ids (%v...), want the 300 gone ones", len(missing), missing[:min(len(missing), 3)])
	}
	ga, _ := db.Worker(bg, "", a.ID)
	gb, _ := db.Worker(bg, "", b.ID)
	if !ga.LastSeenAt.Equal(t0.Add(10*time.Second)) || !gb.LastSeenAt.Equal(t0) {
		t.Fatalf("last seen a %v (want +10s), b %v (want t0: never backwards)", ga.LastSeenAt, gb.LastSeenAt)
	}
	if ga.State != a.State || ga.PollQueue != a.PollQueue || ga.LastSeq != a.LastSeq {
		t.Fatalf("touch changed more than last seen: %+v -> %+v", a, ga)
	}
	if missing, err := db.TouchWorkers(bg, nil); err != nil || len(missing) != 0 {
		t.Fatalf("empty batch: %v %v", missing, err)
	}
}

// An exec enqueued for a poll waiting on the worker (DeliverAfter) is
// delivered in the same transaction when that poll would take it alone,
// and is only queued otherwise: something else undelivered, a poll behind
// what was delivered, a single-job worker, or a command that is not an
// exec. A delivered one is still due to a poll with an older cursor.
func testEnqueueDeliversToAWaitingPoll(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	at := func(n int64) *int64 { return &n }
	enq := func(id string, kind string, after *int64) store.Command {
		t.Helper()
		var ex *store.NewExec
		if kind == store.KindExec {
			ex = &store.NewExec{ID: "x-" + id, Namespace: "default", Command: "true"}
		}
		c, err := db.Enqueue(bg, store.NewCommand{ID: id, WorkerID: w.ID, Namespace: "default", Kind: kind, Now: t0, DeliverAfter: after}, ex)
		if err != nil {
			t.Fatalf("enqueue %s: %v", id, err)
		}
		return c
	}
	c1 := enq("c1", store.KindExec, at(0))
	if c1.DeliveredAt == nil || !c1.DeliveredAt.Equal(t0) {
		t.Fatalf("c1 not delivered along: %+v", c1)
	}
	if x, err := db.Exec(bg, "x-c1"); err != nil || x.State != operatorapi.ExecRunning {
		t.Fatalf("exec of c1: %+v %v", x, err)
	}
	if wk := worker(t, db, w.ID); wk.DeliveredSeq != 1 || wk.LastSeq != 1 {
		t.Fatalf("worker after c1: delivered %d last %d", wk.DeliveredSeq, wk.LastSeq)
	}
	// A poll still at cursor 0 (its answer was lost) gets it again.
	if got, err := db.Take(bg, w.ID, 0, 100, false, t0); err != nil || !equal(ids(got), []string{"c1"}) {
		t.Fatalf("take after 0: %v %v", ids(got), err)
	}
	// Behind what was delivered: queued only.
	if c := enq("c2", store.KindExec, at(0)); c.DeliveredAt != nil {
		t.Fatalf("c2 delivered to a poll behind: %+v", c)
	}
	// c2 waits undelivered: c3 may not overtake it.
	if c := enq("c3", store.KindExec, at(1)); c.DeliveredAt != nil {
		t.Fatalf("c3 delivered past c2: %+v", c)
	}
	if x, _ := db.Exec(bg, "x-c3"); x.State != operatorapi.ExecQueued {
		t.Fatalf("exec of c3: %+v", x)
	}
	if got, _ := db.Take(bg, w.ID, 1, 100, false, t0); !equal(ids(got), []string{"c2", "c3"}) {
		t.Fatalf("take after 1: %v", ids(got))
	}
	// Not an exec: queued only.
	if c := enq("c4", store.KindSetup, at(3)); c.DeliveredAt != nil {
		t.Fatalf("a setup delivered along: %+v", c)
	}
	single := helloSingle(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m2", true, t0)
	c, err := db.Enqueue(bg, store.NewCommand{ID: "s1", WorkerID: single.ID, Namespace: "default", Kind: store.KindExec, Now: t0, DeliverAfter: at(0)},
		&store.NewExec{ID: "x-s1", Namespace: "default", Command: "true"})
	if err != nil || c.DeliveredAt != nil {
		t.Fatalf("a single-job worker's exec: %+v %v", c, err)
	}
}
