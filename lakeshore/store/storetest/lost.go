package storetest

import (
	"encoding/json"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// helloAs says hello for (machine, label) as the daemon process inc.
func helloAs(t *testing.T, s store.Store, id, machine, label, inc string, now time.Time) store.Worker {
	t.Helper()
	w, _, err := s.Hello(bg, store.Hello{
		NewID: id, Namespace: "default", MachineID: machine, Label: label,
		Capabilities: store.Capabilities{Runners: []string{"process"}},
		Versions:     json.RawMessage(`{"daemon":"1.0","protocol":"1"}`), Incarnation: inc, Now: now,
	})
	if err != nil {
		t.Fatalf("hello as %q: %v", inc, err)
	}
	if w.Incarnation != inc {
		t.Fatalf("hello as %q: the worker reads incarnation %q", inc, w.Incarnation)
	}
	return w
}

func enqueueExec(t *testing.T, s store.Store, worker, cmdID, execID string) {
	t.Helper()
	if _, err := s.Enqueue(bg, store.NewCommand{ID: cmdID, WorkerID: worker, Kind: "exec", Body: []byte{0x80}, Now: t0},
		&store.NewExec{ID: execID, Namespace: "default", Command: "sleep 120"}); err != nil {
		t.Fatalf("enqueue %s: %v", execID, err)
	}
}

func lostExecs(t *testing.T, s store.Store, staleBefore time.Time) map[string]store.LostExec {
	t.Helper()
	got, err := s.LostExecs(bg, staleBefore)
	if err != nil {
		t.Fatalf("lost execs: %v", err)
	}
	out := map[string]store.LostExec{}
	for _, l := range got {
		out[l.ID] = l
	}
	return out
}

func lostInvocations(t *testing.T, s store.Store, staleBefore time.Time) map[string]store.LostInvocation {
	t.Helper()
	got, err := s.LostInvocations(bg, staleBefore)
	if err != nil {
		t.Fatalf("lost invocations: %v", err)
	}
	out := map[string]store.LostInvocation{}
	for _, l := range got {
		out[l.ID] = l
	}
	return out
}

// A new process of a worker loses the jobs the old one received (their
// commands acknowledged, by cursor or on delivery), and only those: a
// command delivered but not acknowledged goes to the new process instead.
func testRestartLosesReceivedJobs(t *testing.T, e *env) {
	db := e.store(t)
	// Seen "now" throughout, so nothing here is stale.
	never := t0.Add(-time.Hour)
	w := helloAs(t, db, "w1", "m", "l", "proc-a", t0)
	enqueueExec(t, db, w.ID, "c1", "e1") // seq 1
	newInvocation(t, db, "i1", "default", "", t0)
	if got := claimer(t, db, w.ID, "r", t0)(1); len(got) != 1 { // seq 2
		t.Fatalf("claimed %+v", got)
	}
	enqueueExec(t, db, w.ID, "c3", "e3") // seq 3
	if got, err := db.Take(bg, w.ID, 0, 10, false, t0); err != nil || len(got) != 3 {
		t.Fatalf("take: %v %v", ids(got), err)
	}
	// proc-a acknowledges seq 1 and 2; seq 3 is delivered, not acknowledged.
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(2)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	if l := lostExecs(t, db, never); len(l) != 0 {
		t.Fatalf("lost before any restart: %+v", l)
	}
	// A re-hello of the same process loses nothing.
	helloAs(t, db, "x", "m", "l", "proc-a", t0)
	if l, li := lostExecs(t, db, never), lostInvocations(t, db, never); len(l) != 0 || len(li) != 0 {
		t.Fatalf("lost after a re-hello of the same process: %+v %+v", l, li)
	}

	// A new process: what proc-a received is lost, e3 is not.
	w = helloAs(t, db, "x", "m", "l", "proc-b", t0)
	l := lostExecs(t, db, never)
	if len(l) != 1 || l["e1"].Reason != store.LostRestarted || l["e1"].WorkerID != w.ID || l["e1"].WorkerLabel != "l" ||
		l["e1"].State != operatorapi.ExecRunning || l["e1"].Namespace != "default" {
		t.Fatalf("lost execs after a restart: %+v", l)
	}
	li := lostInvocations(t, db, never)
	if len(li) != 1 || li["i1"].Reason != store.LostRestarted || li["i1"].WorkerID != w.ID {
		t.Fatalf("lost invocations after a restart: %+v", li)
	}
	// proc-b is handed seq 3 again from the hello's cursor and
	// acknowledges it: it is proc-b's now.
	if got, err := db.Take(bg, w.ID, w.AckedSeq, 10, false, t0); err != nil || !equal(ids(got), []string{"c3"}) {
		t.Fatalf("redelivery to the new process: %v %v", ids(got), err)
	}
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: ptr(int64(3)), Now: t0}); err != nil {
		t.Fatal(err)
	}
	if l := lostExecs(t, db, never); len(l) != 1 || l["e3"].ID != "" {
		t.Fatalf("after proc-b acknowledged e3: %+v", l)
	}
	// Resolved, e1 is no longer listed.
	if ok, err := db.FinishExec(bg, "e1", []byte("lost"), t0); !ok || err != nil {
		t.Fatalf("finish e1: %v %v", ok, err)
	}
	if _, ok, err := db.FinishInvocation(bg, store.Finish{ID: "i1", State: operatorapi.InvocationFailed,
		From: []string{operatorapi.InvocationRunning}, WorkerID: w.ID, Error: []byte(`{"type":"WorkerLost"}`), Now: t0}); !ok || err != nil {
		t.Fatalf("finish i1: %v %v", ok, err)
	}
	if l, li := lostExecs(t, db, never), lostInvocations(t, db, never); len(l) != 0 || len(li) != 0 {
		t.Fatalf("lost after resolving: %+v %+v", l, li)
	}

	// A daemon that names no incarnation is never taken as restarted:
	// neither what it receives nor what a named process received before.
	w = helloAs(t, db, "x", "m", "l", "", t0)
	if l := lostExecs(t, db, never); len(l) != 0 {
		t.Fatalf("lost after a hello without an incarnation: %+v", l)
	}
	enqueueExec(t, db, w.ID, "c4", "e4")
	if _, err := db.Take(bg, w.ID, 0, 10, true, t0); err != nil {
		t.Fatal(err)
	}
	helloAs(t, db, "x", "m", "l", "proc-c", t0)
	if l := lostExecs(t, db, never); len(l) != 1 || l["e3"].Reason != store.LostRestarted {
		t.Fatalf("after proc-c: want only e3 (proc-b's) lost, e4 came to a nameless daemon: %+v", l)
	}
	if _, err := db.FinishExec(bg, "e3", []byte("lost"), t0); err != nil {
		t.Fatal(err)
	}
	// Delete-on-delivery acknowledges for the process polling.
	enqueueExec(t, db, w.ID, "c5", "e5")
	if _, err := db.Take(bg, w.ID, 0, 10, true, t0); err != nil {
		t.Fatal(err)
	}
	helloAs(t, db, "x", "m", "l", "proc-d", t0)
	if l := lostExecs(t, db, never); len(l) != 1 || l["e5"].Reason != store.LostRestarted {
		t.Fatalf("after proc-d: want e5 lost: %+v", l)
	}
	// The incarnation is kept across a restart of the store.
	db = e.reopen(t)
	if got, err := db.Worker(bg, "", w.ID); err != nil || got.Incarnation != "proc-d" {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
	if l := lostExecs(t, db, never); len(l) != 1 || l["e5"].Reason != store.LostRestarted {
		t.Fatalf("after reopen: %+v", l)
	}
}

// An exec is lost with its worker's row (queued or running), and when its
// worker has not been seen since the deadline (running only: a queued one
// still goes out if the worker comes back); a hibernating worker is not
// stale while it sleeps, and a finished exec is never lost.
func testLostExecsStaleAndRemoved(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "w1", "m1", "stale") // seen at t0
	enqueueExec(t, db, w.ID, "c1", "running")
	enqueueExec(t, db, w.ID, "c2", "done")
	if _, err := db.Take(bg, w.ID, 0, 10, false, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := db.FinishExec(bg, "done", []byte("ok"), t0); err != nil {
		t.Fatal(err)
	}
	enqueueExec(t, db, w.ID, "c3", "queued")
	if l := lostExecs(t, db, t0); len(l) != 0 {
		t.Fatalf("lost at the deadline itself: %+v", l)
	}
	l := lostExecs(t, db, t0.Add(time.Millisecond))
	if len(l) != 1 || l["running"].Reason != store.LostStale || l["running"].WorkerLabel != "stale" {
		t.Fatalf("past the deadline: %+v", l)
	}

	h := hello(t, db, "w2", "m2", "sleeper")
	enqueueExec(t, db, h.ID, "h1", "sleeping")
	until := t0.Add(2 * time.Hour)
	if _, err := db.Enqueue(bg, store.NewCommand{ID: "hib", WorkerID: h.ID, Kind: store.KindHibernate, Now: t0, HibernateUntil: &until}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Take(bg, h.ID, 0, 10, false, t0); err != nil {
		t.Fatal(err)
	}
	if l := lostExecs(t, db, t0.Add(time.Hour)); l["sleeping"].ID != "" {
		t.Fatalf("a hibernating worker's exec counted lost: %+v", l)
	}
	if l := lostExecs(t, db, t0.Add(3*time.Hour)); l["sleeping"].Reason != store.LostStale {
		t.Fatalf("past the hibernation: %+v", l)
	}

	if err := db.DeleteWorker(bg, "default", w.ID); err != nil {
		t.Fatal(err)
	}
	l = lostExecs(t, db, t0.Add(-time.Hour))
	if len(l) != 2 || l["running"].Reason != store.LostRemoved || l["queued"].Reason != store.LostRemoved ||
		l["queued"].State != operatorapi.ExecQueued || l["running"].WorkerID != w.ID || l["running"].WorkerLabel != "" {
		t.Fatalf("after removal: %+v", l)
	}
}
