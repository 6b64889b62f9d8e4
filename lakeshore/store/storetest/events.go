package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

func logEvent(inv, worker string, seq int64, data string) store.Event {
	return store.Event{ID: fmt.Sprintf("%s-%s-%d", inv, worker, seq), InvocationID: inv, WorkerID: worker, Kind: "invocation.log",
		Data: []byte(data), TS: t0, ReceivedAt: t0.Add(time.Duration(seq) * time.Millisecond), Seq: ptr(seq), Size: int64(len(data))}
}

func seqs(evs []store.Event) []int64 {
	out := []int64{}
	for _, e := range evs {
		if e.Seq == nil {
			out = append(out, -1)
			continue
		}
		out = append(out, *e.Seq)
	}
	return out
}

func wantSeqs(t *testing.T, what string, evs []store.Event, more bool, wantMore bool, want ...int64) {
	t.Helper()
	got := seqs(evs)
	if fmt.Sprint(got) != fmt.Sprint(want) || more != wantMore {
		t.Fatalf("%s: seqs %v more %v, want %v more %v", what, got, more, want, wantMore)
	}
}

func testEventsLogAndOutcomes(t *testing.T, e *env) {
	db := e.store(t)
	w1, w2 := hello(t, db, "w1", "m1", "one"), hello(t, db, "w2", "m2", "two")
	// Pieces arrive out of order and once more on a retry; the log reads
	// back in seq order, each piece once.
	for _, seq := range []int64{2, 1, 3, 5, 4} {
		if ok, err := db.SaveEvent(bg, logEvent("i1", w1.ID, seq, fmt.Sprintf("piece %d;", seq))); !ok || err != nil {
			t.Fatalf("save seq %d: %v %v", seq, ok, err)
		}
	}
	if ok, err := db.SaveEvent(bg, logEvent("i1", w1.ID, 3, "piece 3;")); ok || err != nil {
		t.Fatalf("repeat of seq 3: %v %v", ok, err)
	}
	// Events without a seq are kept each time.
	for i := 0; i < 2; i++ {
		if ok, err := db.SaveEvent(bg, store.Event{ID: fmt.Sprint("p", i), InvocationID: "i1", WorkerID: w1.ID, Kind: "invocation.progress",
			Data: []byte{0xc0}, TS: t0, ReceivedAt: t0}); !ok || err != nil {
			t.Fatalf("progress %d: %v %v", i, ok, err)
		}
	}
	q := store.LogQuery{InvocationID: "i1", Kind: "invocation.log", MaxEvents: 100, MaxBytes: 1 << 20}
	evs, more, err := db.InvocationLog(bg, q)
	if err != nil {
		t.Fatal(err)
	}
	wantSeqs(t, "whole log", evs, more, false, 1, 2, 3, 4, 5)
	if e := evs[2]; string(e.Data) != "piece 3;" || e.WorkerID != w1.ID || e.Kind != "invocation.log" || !e.TS.Equal(t0) || e.ID != "i1-w1-3" || e.Size != 8 {
		t.Fatalf("event %+v", e)
	}
	// A byte cap: each piece is 8 bytes; the first always comes, whatever
	// the cap.
	q.MaxBytes = 20
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "20 bytes", evs, more, true, 1, 2)
	q.MaxBytes = 1
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "1 byte", evs, more, true, 1)
	// A count cap, and a cursor that pages on.
	q.MaxBytes, q.MaxEvents = 1<<20, 2
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "2 events", evs, more, true, 1, 2)
	q.After = 2
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "after 2", evs, more, true, 3, 4)
	q.After = 4
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "after 4", evs, more, false, 5)
	q.After = 5
	evs, more, _ = db.InvocationLog(bg, q)
	wantSeqs(t, "after the end", evs, more, false)
	if evs, _, _ := db.InvocationLog(bg, store.LogQuery{InvocationID: "nosuch", Kind: "invocation.log", MaxEvents: 10, MaxBytes: 10}); len(evs) != 0 {
		t.Fatalf("log of an unknown invocation: %+v", evs)
	}

	// Outcomes, one per command: listed per worker newest first, and the
	// newest setup of each worker of a namespace.
	outcome := func(id, worker, kind string, at time.Duration, data string) {
		t.Helper()
		ok, err := db.SaveEvent(bg, store.Event{ID: "ev-" + id, InvocationID: id, WorkerID: worker, Kind: kind, Data: []byte(data),
			TS: t0.Add(at), ReceivedAt: t0.Add(at), Seq: ptr(int64(0))})
		if !ok || err != nil {
			t.Fatalf("outcome %s: %v %v", id, ok, err)
		}
	}
	outcome("c1", w1.ID, "setup.finished", time.Second, "first")
	outcome("c2", w1.ID, "ota.finished", 2*time.Second, "update")
	outcome("c3", w1.ID, "setup.finished", 3*time.Second, "second")
	outcome("c4", w2.ID, "setup.finished", time.Second, "other")
	if ok, err := db.SaveEvent(bg, store.Event{ID: "ev-c1-again", InvocationID: "c1", WorkerID: w1.ID, Kind: "setup.finished",
		Data: []byte("first"), TS: t0, ReceivedAt: t0.Add(time.Minute), Seq: ptr(int64(0))}); ok || err != nil {
		t.Fatalf("repeated outcome: %v %v", ok, err)
	}
	got, err := db.WorkerEvents(bg, w1.ID, []string{"setup.finished", "ota.finished"}, 10)
	if err != nil || len(got) != 3 || got[0].InvocationID != "c3" || got[1].InvocationID != "c2" || got[2].InvocationID != "c1" ||
		!bytes.Equal(got[1].Data, []byte("update")) || got[0].Seq == nil || *got[0].Seq != 0 {
		t.Fatalf("outcomes of w1: %+v %v", got, err)
	}
	if got, _ := db.WorkerEvents(bg, w1.ID, []string{"setup.finished"}, 1); len(got) != 1 || got[0].InvocationID != "c3" {
		t.Fatalf("newest setup of w1: %+v", got)
	}
	latest, err := db.LatestWorkerEvents(bg, "default", "setup.finished")
	if err != nil || len(latest) != 2 || latest[w1.ID].InvocationID != "c3" || latest[w2.ID].InvocationID != "c4" {
		t.Fatalf("latest setups: %+v %v", latest, err)
	}
	if latest, _ := db.LatestWorkerEvents(bg, "other", "setup.finished"); len(latest) != 0 {
		t.Fatalf("latest setups of another namespace: %+v", latest)
	}

	// Commands are read by id, for the checks on outcomes.
	c := enqueue(t, db, w1.ID, "cmd-setup", store.KindSetup)
	if got, err := db.Command(bg, "cmd-setup"); err != nil || got.WorkerID != w1.ID || got.Kind != store.KindSetup || got.Seq != c.Seq {
		t.Fatalf("command by id: %+v %v", got, err)
	}
	if _, err := db.Command(bg, "nosuch"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown command: %v", err)
	}

	// All of it survives a restart.
	db = e.reopen(t)
	evs, _, _ = db.InvocationLog(bg, store.LogQuery{InvocationID: "i1", Kind: "invocation.log", MaxEvents: 100, MaxBytes: 1 << 20})
	wantSeqs(t, "after reopen", evs, false, false, 1, 2, 3, 4, 5)
	if got, _ := db.WorkerEvents(bg, w1.ID, []string{"setup.finished"}, 10); len(got) != 2 {
		t.Fatalf("setups after reopen: %+v", got)
	}
}
