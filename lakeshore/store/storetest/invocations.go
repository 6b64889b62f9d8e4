package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// claimer returns a claim function for worker on s that names its run
// commands prefix1, prefix2, ...
func claimer(t *testing.T, s store.Store, worker, prefix string, now time.Time) func(limit int) []store.Invocation {
	n := 0
	return func(limit int) []store.Invocation {
		t.Helper()
		got, err := s.ClaimInvocations(bg, store.Claim{WorkerID: worker, Limit: limit, Now: now,
			NewID: func() string { n++; return fmt.Sprint(prefix, n) }})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
}

func testInvocationClaimCancelFinishAndReopen(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "w1", "m", "l")
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Queue: "a*", Now: t0}); err != nil {
		t.Fatal(err)
	}
	newInvocation(t, db, "i1", "a-1", "process", t0)
	newInvocation(t, db, "i2", "b", "", t0.Add(time.Second))
	newInvocation(t, db, "i3", "a-2", "docker", t0.Add(2*time.Second))
	newInvocation(t, db, "i4", "a-3", "", t0.Add(3*time.Second))
	if inv, err := db.Invocation(bg, "default", "i1"); err != nil || inv.State != operatorapi.InvocationQueued ||
		!bytes.Equal(inv.Args, []byte{1}) || string(inv.RunConfig) != "{}" || inv.Script != nil || !inv.CreatedAt.Equal(t0) {
		t.Fatalf("created %+v %v", inv, err)
	}
	if _, err := db.Invocation(bg, "other", "i1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("invocation in another namespace: %v", err)
	}

	claim := claimer(t, db, w.ID, "c", t0)
	got := claim(10)
	if len(got) != 2 || got[0].ID != "i1" || got[1].ID != "i4" || got[0].State != operatorapi.InvocationRunning || got[0].WorkerID != w.ID ||
		got[0].CommandID != "c1" || got[0].WorkerLabel != "l" || got[0].StartedAt == nil {
		t.Fatalf("claimed %+v", got)
	}
	if again := claim(10); len(again) != 0 {
		t.Fatalf("claimed twice: %+v", again)
	}
	cmds, err := db.ListCommands(bg, w.ID)
	if err != nil || len(cmds) != 2 || cmds[0].Kind != store.KindRun || !bytes.Equal(cmds[0].Body, []byte("body-i1")) || cmds[1].Seq != 2 {
		t.Fatalf("run commands %+v %v", cmds, err)
	}
	if wk, _ := db.Worker(bg, "", w.ID); wk.LastSeq != 2 {
		t.Fatalf("claims numbered the worker's commands up to %d", wk.LastSeq)
	}

	// i4's command is not delivered yet: cancelling withdraws it.
	inv, cancelled, err := db.CancelInvocation(bg, "default", "i4", []byte(`{"type":"Cancelled","message":"m"}`), t0)
	if err != nil || !cancelled || inv.State != operatorapi.InvocationCancelled || string(inv.Error) != `{"type":"Cancelled","message":"m"}` || inv.FinishedAt == nil {
		t.Fatalf("cancel undelivered: %+v %v %v", inv, cancelled, err)
	}
	took, err := db.Take(bg, w.ID, 0, 10, false, t0)
	if err != nil || len(took) != 1 || took[0].ID != "c1" {
		t.Fatalf("take after the withdrawal: %+v %v", took, err)
	}
	// i1's is delivered: cancelling it is the daemon's job now.
	if inv, cancelled, err := db.CancelInvocation(bg, "default", "i1", nil, t0); err != nil || cancelled || inv.State != operatorapi.InvocationRunning {
		t.Fatalf("cancel delivered: %+v %v %v", inv, cancelled, err)
	}
	if _, _, err := db.CancelInvocation(bg, "other", "i1", nil, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cancel in another namespace: %v", err)
	}
	// A queued invocation cancels outright; a finished one stays as it is.
	if inv, cancelled, err := db.CancelInvocation(bg, "default", "i2", nil, t0); err != nil || !cancelled || inv.State != operatorapi.InvocationCancelled || inv.Error != nil {
		t.Fatalf("cancel queued: %+v %v %v", inv, cancelled, err)
	}
	if inv, cancelled, err := db.CancelInvocation(bg, "default", "i2", nil, t0); err != nil || cancelled || inv.State != operatorapi.InvocationCancelled {
		t.Fatalf("cancel twice: %+v %v %v", inv, cancelled, err)
	}

	// The worker goes quiet: i1 is lost to staleness; the guard keeps a
	// finish from another worker or state out.
	lost, err := db.LostInvocations(bg, t0.Add(time.Minute))
	if err != nil || len(lost) != 1 || lost[0].ID != "i1" || lost[0].Reason != store.LostStale || lost[0].WorkerLabel != "l" || lost[0].WorkerID != w.ID {
		t.Fatalf("lost %+v %v", lost, err)
	}
	if _, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i1", State: operatorapi.InvocationFailed, From: []string{operatorapi.InvocationRunning}, WorkerID: "w2", Now: t0}); err != nil || applied {
		t.Fatalf("finish from another worker: %v %v", applied, err)
	}
	inv, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i1", State: operatorapi.InvocationSucceeded, From: []string{operatorapi.InvocationRunning},
		WorkerID: w.ID, Result: []byte("r"), Now: t0.Add(time.Second)})
	if err != nil || !applied || string(inv.Result) != "r" || inv.ResultSize != 1 || inv.FinishedAt == nil || !inv.FinishedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("finish: %+v %v %v", inv, applied, err)
	}
	if _, applied, _ := db.FinishInvocation(bg, store.Finish{ID: "i1", State: operatorapi.InvocationFailed, From: []string{operatorapi.InvocationRunning}, Now: t0}); applied {
		t.Fatal("a second finish applied")
	}
	if _, _, err := db.FinishInvocation(bg, store.Finish{ID: "nope", State: operatorapi.InvocationFailed, From: []string{operatorapi.InvocationRunning}, Now: t0}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("finish unknown: %v", err)
	}
	// Finishing a queued invocation (a submit-side failure) is allowed
	// when the caller says so.
	if inv, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i3", State: operatorapi.InvocationFailed, From: []string{operatorapi.InvocationQueued},
		Error: []byte(`{"type":"E"}`), Now: t0}); err != nil || !applied || string(inv.Error) != `{"type":"E"}` || inv.Result != nil {
		t.Fatalf("finish queued: %+v %v %v", inv, applied, err)
	}

	db = e.reopen(t)
	all, err := db.ListInvocations(bg, store.InvocationFilter{Namespace: "default"})
	if err != nil || len(all) != 4 || all[0].ID != "i4" || all[3].ID != "i1" || all[3].Result != nil || all[3].ResultSize != 1 || all[3].Args != nil {
		t.Fatalf("after reopening: %+v %v", all, err)
	}
	cancelledInB, _ := db.ListInvocations(bg, store.InvocationFilter{Namespace: "default", State: operatorapi.InvocationCancelled, Queue: "b"})
	if len(cancelledInB) != 1 || cancelledInB[0].ID != "i2" {
		t.Fatalf("cancelled in b: %+v", cancelledInB)
	}
	if two, _ := db.ListInvocations(bg, store.InvocationFilter{Namespace: "default", Limit: 2}); len(two) != 2 {
		t.Fatalf("limit 2 listed %d", len(two))
	}
	if none, err := db.ListInvocations(bg, store.InvocationFilter{Namespace: "other"}); err != nil || none == nil || len(none) != 0 {
		t.Fatalf("other namespace: %v %v", none, err)
	}
}

func testClaimRespectsCapacityRunnersAndState(t *testing.T, e *env) {
	db := e.store(t)
	w, _, err := db.Hello(bg, store.Hello{NewID: "w1", Namespace: "default", MachineID: "m", Label: "l",
		Capabilities: store.Capabilities{Runners: []string{"process", "echo"}, MaxInvocations: 2}, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := db.Hello(bg, store.Hello{NewID: "w2", Namespace: "elsewhere", MachineID: "m", Label: "l",
		Capabilities: store.Capabilities{Runners: []string{"process"}}, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	for i, runner := range []string{"echo", "docker", "", "process"} {
		newInvocation(t, db, fmt.Sprint("i", i), "default", runner, t0.Add(time.Duration(i)*time.Second))
	}
	if got := claimer(t, db, other.ID, "o", t0)(10); len(got) != 0 {
		t.Fatalf("a worker of another namespace claimed %+v", got)
	}
	if got := claimer(t, db, w.ID, "c", t0)(0); len(got) != 0 {
		t.Fatalf("limit 0 claimed %+v", got)
	}
	// Hibernating: nothing.
	until := t0.Add(time.Hour)
	if _, err := db.Enqueue(bg, store.NewCommand{ID: "h", WorkerID: w.ID, Kind: store.KindHibernate, Now: t0, HibernateUntil: &until}, nil); err != nil {
		t.Fatal(err)
	}
	if got := claimer(t, db, w.ID, "c", t0)(10); len(got) != 0 {
		t.Fatalf("a hibernating worker claimed %+v", got)
	}
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Now: until}); err != nil {
		t.Fatal(err)
	}
	// Setting up: nothing.
	enqueue(t, db, w.ID, "s", store.KindSetup)
	if got := claimer(t, db, w.ID, "c", until)(10); len(got) != 0 {
		t.Fatalf("a worker setting up claimed %+v", got)
	}
	// The hibernate ends a batch: two takes deliver both commands.
	for range 2 {
		if _, err := db.Take(bg, w.ID, 0, 10, true, until); err != nil {
			t.Fatal(err)
		}
	}
	if wk, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Now: until}); err != nil || wk.State != operatorapi.StateActive {
		t.Fatalf("after the setup: %+v %v", wk, err)
	}
	// Active, max_invocations 2: the two oldest it can run (not docker).
	got := claimer(t, db, w.ID, "c", until)(10)
	if len(got) != 2 || got[0].ID != "i0" || got[1].ID != "i2" {
		t.Fatalf("claimed %+v", got)
	}
	if more := claimer(t, db, w.ID, "d", until)(10); len(more) != 0 {
		t.Fatalf("claimed beyond capacity: %+v", more)
	}
	if _, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i0", State: operatorapi.InvocationSucceeded, From: []string{operatorapi.InvocationRunning}, Now: until}); err != nil || !applied {
		t.Fatalf("finish: %v %v", applied, err)
	}
	if more := claimer(t, db, w.ID, "e", until)(10); len(more) != 1 || more[0].ID != "i3" {
		t.Fatalf("after a slot freed: %+v", more)
	}
	// i0 finished before its run command was delivered: it was withdrawn.
	cmds, _ := db.ListCommands(bg, w.ID)
	for _, c := range cmds {
		if c.ID == "c1" {
			t.Fatalf("the run command of a finished invocation is still queued: %+v", c)
		}
	}
}

func testReportRunningAndLost(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "w1", "m", "l")
	newInvocation(t, db, "i1", "default", "", t0)
	newInvocation(t, db, "i2", "default", "", t0)
	newInvocation(t, db, "i3", "default", "", t0)
	if got := claimer(t, db, w.ID, "c", t0)(10); len(got) != 3 {
		t.Fatalf("claimed %+v", got)
	}
	// i1 and i2 are received (delivered and acknowledged); i3 is not sent yet.
	if _, err := db.Take(bg, w.ID, 0, 2, true, t0); err != nil {
		t.Fatal(err)
	}
	grace := 30 * time.Second
	report := func(at time.Time, statuses ...store.InvocationStatus) []store.LostInvocation {
		t.Helper()
		lost, running, err := db.ReportRunning(bg, store.RunningReport{WorkerID: w.ID, Statuses: statuses, Now: at, MissingGrace: grace})
		if err != nil {
			t.Fatal(err)
		}
		// i1, i2 and i3 are all claimed; none is finished here.
		if running != 3 {
			t.Fatalf("running %d, want 3", running)
		}
		return lost
	}
	if lost := report(t0, store.InvocationStatus{InvocationID: "i1", State: "running", StdoutTail: "tail-1"}); len(lost) != 0 {
		t.Fatalf("lost at once: %+v", lost)
	}
	if inv, _ := db.Invocation(bg, "", "i1"); inv.StdoutTail != "tail-1" || inv.ReportedAt == nil || !inv.ReportedAt.Equal(t0) {
		t.Fatalf("tail %+v", inv)
	}
	// i2 has been left out since t0; within the grace it is not lost yet.
	if lost := report(t0.Add(10*time.Second), store.InvocationStatus{InvocationID: "i1", State: "running"}); len(lost) != 0 {
		t.Fatalf("lost within the grace: %+v", lost)
	}
	// Past the grace i2 is lost; i1, left out for the first time now, is
	// not yet, and i3 was never received, so it cannot be missing.
	lost := report(t0.Add(31 * time.Second))
	if len(lost) != 1 || lost[0].ID != "i2" || lost[0].Reason != store.LostMissing || lost[0].WorkerLabel != "l" || lost[0].WorkerID != w.ID {
		t.Fatalf("lost after the grace: %+v", lost)
	}
	// A tail longer than the cap is clipped to its end.
	long := bytes.Repeat([]byte("x"), 64<<10)
	report(t0, store.InvocationStatus{InvocationID: "i1", State: "running", StdoutTail: string(long) + "END"})
	if inv, _ := db.Invocation(bg, "", "i1"); len(inv.StdoutTail) >= len(long) || !bytes.HasSuffix([]byte(inv.StdoutTail), []byte("END")) {
		t.Fatalf("long tail kept %d bytes", len(inv.StdoutTail))
	}
	// A worker with nothing running is told so, by an empty report or not.
	idle := hello(t, db, "w-idle", "m-idle", "l-idle")
	for _, statuses := range [][]store.InvocationStatus{nil, {{InvocationID: "i9", State: "running"}}} {
		if lost, running, err := db.ReportRunning(bg, store.RunningReport{WorkerID: idle.ID, Statuses: statuses, Now: t0}); err != nil || running != 0 || len(lost) != 0 {
			t.Fatalf("idle worker, report %v: lost %v running %d err %v", statuses, lost, running, err)
		}
	}

	// Removal of the worker: every running invocation of it is lost.
	if err := db.DeleteWorker(bg, "default", w.ID); err != nil {
		t.Fatal(err)
	}
	all, err := db.LostInvocations(bg, t0.Add(-time.Hour))
	if err != nil || len(all) != 3 {
		t.Fatalf("lost after removal: %+v %v", all, err)
	}
	for _, l := range all {
		if l.Reason != store.LostRemoved {
			t.Fatalf("lost after removal: %+v", all)
		}
	}

	// A hibernating worker is not stale while it sleeps.
	h := hello(t, db, "w2", "m2", "h")
	newInvocation(t, db, "j1", "default", "", t0)
	if got := claimer(t, db, h.ID, "d", t0)(1); len(got) != 1 {
		t.Fatalf("claimed %+v", got)
	}
	until := t0.Add(2 * time.Hour)
	if _, err := db.Enqueue(bg, store.NewCommand{ID: "hib", WorkerID: h.ID, Kind: store.KindHibernate, Now: t0, HibernateUntil: &until}, nil); err != nil {
		t.Fatal(err)
	}
	stale, err := db.LostInvocations(bg, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range stale {
		if l.ID == "j1" {
			t.Fatalf("a hibernating worker's invocation counted lost: %+v", l)
		}
	}
}
