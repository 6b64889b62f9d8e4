package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

func helloSingle(t *testing.T, s store.Store, id, machine string, single bool, now time.Time) store.Worker {
	t.Helper()
	w, _, err := s.Hello(bg, store.Hello{
		NewID: id, Namespace: "default", MachineID: machine, Label: machine,
		Capabilities: store.Capabilities{Runners: []string{"process"}},
		Versions:     json.RawMessage(`{"daemon":"1.0","protocol":"1"}`), SingleJob: single, Now: now,
	})
	if err != nil {
		t.Fatalf("hello %s: %v", machine, err)
	}
	if w.SingleJob != single {
		t.Fatalf("hello %s said single_job %v, the worker has %v", machine, single, w.SingleJob)
	}
	return w
}

func enqueueJobExec(s store.Store, worker, id string) (store.Command, error) {
	return s.Enqueue(bg, store.NewCommand{ID: "cmd-" + id, WorkerID: worker, Kind: store.KindExec, Body: []byte{0xc0}, Now: t0},
		&store.NewExec{ID: id, Namespace: "default", Command: "true"})
}

func worker(t *testing.T, s store.Store, id string) store.Worker {
	t.Helper()
	w, err := s.Worker(bg, "", id)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// wantSingleJobError fails unless err refuses a job because worker has job.
func wantSingleJobError(t *testing.T, err error, worker, job string, delivered bool) {
	t.Helper()
	var sj *store.SingleJobError
	if !errors.As(err, &sj) || sj.WorkerID != worker || sj.Job != job || sj.Delivered != delivered {
		t.Fatalf("got %v (%+v), want a single-job refusal for %s holding %s (delivered %v)", err, sj, worker, job, delivered)
	}
}

func testSingleJobWorkerIsHandedOneJob(t *testing.T, e *env) {
	db := e.store(t)
	w := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "solo", true, t0)
	if w.HasJob() || w.JobSeq != 0 {
		t.Fatalf("a fresh single-job worker has a job: %+v", w)
	}
	enqueue(t, db, w.ID, "setup-1", store.KindSetup)
	job, err := enqueueJobExec(db, w.ID, "x1")
	if err != nil {
		t.Fatal(err)
	}
	if w = worker(t, db, w.ID); !w.HasJob() || w.JobsQueued != 1 || w.JobSeq != 0 {
		t.Fatalf("with its job queued: %+v", w)
	}
	// A second job, while the first is queued: refused, nothing stored.
	_, err = enqueueJobExec(db, w.ID, "x2")
	wantSingleJobError(t, err, w.ID, "exec x1", false)
	if _, err := db.Exec(bg, "x2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused exec was stored: %v", err)
	}
	got, err := db.Take(bg, w.ID, 0, 100, false, t0)
	if err != nil || !equal(ids(got), []string{"setup-1", "cmd-x1"}) {
		t.Fatalf("take: %v %v", ids(got), err)
	}
	if w = worker(t, db, w.ID); w.JobSeq != job.Seq || !w.HasJob() || w.JobsQueued != 0 {
		t.Fatalf("after its job was handed over: %+v", w)
	}
	_, err = enqueueJobExec(db, w.ID, "x3")
	wantSingleJobError(t, err, w.ID, "exec x1", true)
	// Other commands still go through, around its one job.
	enqueue(t, db, w.ID, "reset-1", "reset_backoff")
	if got, _ := db.Take(bg, w.ID, job.Seq, 100, false, t0); !equal(ids(got), []string{"reset-1"}) {
		t.Fatalf("non-job command after the job: %v", ids(got))
	}
	// An answer lost on the way: the same job comes again, not another.
	if got, _ := db.Take(bg, w.ID, 0, 100, false, t0); !equal(ids(got), []string{"setup-1", "cmd-x1", "reset-1"}) {
		t.Fatalf("redelivery: %v", ids(got))
	}
	if w = worker(t, db, w.ID); w.JobSeq != job.Seq {
		t.Fatalf("redelivery moved the job: %+v", w)
	}
	// It survives a restart of the store.
	db = e.reopen(t)
	if w = worker(t, db, w.ID); w.JobSeq != job.Seq || !w.SingleJob {
		t.Fatalf("after a reopen: %+v", w)
	}
	_, err = enqueueJobExec(db, w.ID, "x4")
	wantSingleJobError(t, err, w.ID, "exec x1", true)
}

func testSingleJobNeverGetsASecondQueuedJob(t *testing.T, e *env) {
	db := e.store(t)
	// Two execs queued while the worker was a pool daemon; it comes back
	// single-job.
	w := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "was-pool", false, t0)
	first, err := enqueueJobExec(db, w.ID, "x1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enqueueJobExec(db, w.ID, "x2"); err != nil {
		t.Fatal(err)
	}
	enqueue(t, db, w.ID, "reset-1", "reset_backoff")
	w = helloSingle(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "was-pool", true, t0)
	for _, ack := range []bool{false, true} {
		got, err := db.Take(bg, w.ID, 0, 100, ack, t0)
		if err != nil || !equal(ids(got), []string{"cmd-x1"}) {
			t.Fatalf("take (ack now %v): %v %v; want the first job only", ack, ids(got), err)
		}
	}
	for _, after := range []int64{0, first.Seq} {
		if got, _ := db.Take(bg, w.ID, after, 100, false, t0); len(got) != 0 {
			t.Fatalf("take after %d: %v; the second job must never be delivered", after, ids(got))
		}
	}
	cmds, err := db.ListCommands(bg, w.ID)
	if err != nil || len(cmds) != 3 || cmds[1].State() != store.CommandQueued {
		t.Fatalf("commands %+v %v; the second job stays queued", cmds, err)
	}
	if x2, err := db.Exec(bg, "x2"); err != nil || x2.State != operatorapi.ExecQueued {
		t.Fatalf("second exec %+v %v", x2, err)
	}
}

func testSingleJobClaimsOneInvocation(t *testing.T, e *env) {
	db := e.store(t)
	newInvocation(t, db, "inv-1", "default", "", t0)
	newInvocation(t, db, "inv-2", "default", "", t0.Add(time.Second))
	holder := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "holder", true, t0)
	if _, err := enqueueJobExec(db, holder.ID, "x1"); err != nil {
		t.Fatal(err)
	}
	claim := func(w string) []string {
		t.Helper()
		invs, err := db.ClaimInvocations(bg, store.Claim{WorkerID: w, Limit: 10, Now: t0, NewID: func() string { return fmt.Sprintf("run-%d", time.Now().UnixNano()) }})
		if err != nil {
			t.Fatal(err)
		}
		out := []string{}
		for _, inv := range invs {
			out = append(out, inv.ID)
		}
		return out
	}
	if got := claim(holder.ID); len(got) != 0 {
		t.Fatalf("a single-job worker with its job queued claimed %v", got)
	}
	solo := helloSingle(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "solo", true, t0)
	if got := claim(solo.ID); !equal(got, []string{"inv-1"}) {
		t.Fatalf("a free single-job worker claimed %v, want inv-1 alone", got)
	}
	if got := claim(solo.ID); len(got) != 0 {
		t.Fatalf("a single-job worker with its run claimed %v", got)
	}
	_, err := enqueueJobExec(db, solo.ID, "x2")
	wantSingleJobError(t, err, solo.ID, "run inv-1", false)
	got, err := db.Take(bg, solo.ID, 0, 100, false, t0)
	if err != nil || len(got) != 1 || got[0].Kind != store.KindRun {
		t.Fatalf("take %v %v", ids(got), err)
	}
	_, err = enqueueJobExec(db, solo.ID, "x3")
	wantSingleJobError(t, err, solo.ID, "run inv-1", true)
	pool := helloSingle(t, db, "cccccccccccccccccccccccc", "pool", false, t0)
	if got := claim(pool.ID); !equal(got, []string{"inv-2"}) {
		t.Fatalf("a pool worker claimed %v", got)
	}
}

func testSingleJobHelloAfterItsJobEnded(t *testing.T, e *env) {
	db := e.store(t)
	w := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "solo", true, t0)
	enqueue(t, db, w.ID, "setup-1", store.KindSetup)
	if _, err := enqueueJobExec(db, w.ID, "x1"); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.Take(bg, w.ID, 0, 100, false, t0); len(got) != 2 {
		t.Fatalf("take %v", ids(got))
	}
	// A hello while its job runs (a re-hello of the same process, or a new
	// one after a crash): the job stays its job.
	w = helloSingle(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "solo", true, t0.Add(time.Second))
	if !w.HasJob() || w.AckedSeq != 0 {
		t.Fatalf("hello while the job runs: %+v", w)
	}
	if got, _ := db.Take(bg, w.ID, w.AckedSeq, 100, false, t0); !equal(ids(got), []string{"setup-1", "cmd-x1"}) {
		t.Fatalf("the job not ended is delivered again: %v", ids(got))
	}
	// Its outcome is in; the daemon exited without acknowledging the batch.
	if _, err := db.FinishExec(bg, "x1", []byte{0xc0}, t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	w = helloSingle(t, db, "cccccccccccccccccccccccc", "solo", true, t0.Add(3*time.Second))
	if w.HasJob() || w.AckedSeq != 2 || w.DeliveredSeq != 2 {
		t.Fatalf("hello of a new process after the job ended: %+v", w)
	}
	if got, _ := db.Take(bg, w.ID, w.AckedSeq, 100, false, t0); len(got) != 0 {
		t.Fatalf("the ended job's batch came again: %v", ids(got))
	}
	next, err := enqueueJobExec(db, w.ID, "x2")
	if err != nil {
		t.Fatalf("the new process may take a job: %v", err)
	}
	if got, _ := db.Take(bg, w.ID, w.AckedSeq, 100, false, t0); !equal(ids(got), []string{"cmd-x2"}) {
		t.Fatalf("take %v", ids(got))
	}
	// Said without single_job, the worker takes jobs without a limit.
	w = helloSingle(t, db, "dddddddddddddddddddddddd", "solo", false, t0.Add(4*time.Second))
	if w.HasJob() || w.JobSeq != 0 {
		t.Fatalf("a pool worker holds a single job: %+v", w)
	}
	if _, err := enqueueJobExec(db, w.ID, "x3"); err != nil {
		t.Fatal(err)
	}
	if _, err := enqueueJobExec(db, w.ID, "x4"); err != nil {
		t.Fatal(err)
	}
	if got, _ := db.Take(bg, w.ID, next.Seq-1, 100, false, t0); !equal(ids(got), []string{"cmd-x2", "cmd-x3", "cmd-x4"}) {
		t.Fatalf("pool take %v", ids(got))
	}
}

// A single-job worker that took its run polls no more: it is not stale,
// however long the run; removed, it is lost.
func testSingleJobRunIsNotLostToSilence(t *testing.T, e *env) {
	db := e.store(t)
	newInvocation(t, db, "inv-1", "default", "", t0)
	newInvocation(t, db, "inv-2", "default", "", t0)
	solo := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "solo", true, t0)
	pool := helloSingle(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "pool", false, t0)
	for _, w := range []string{solo.ID, pool.ID} {
		if invs, err := db.ClaimInvocations(bg, store.Claim{WorkerID: w, Limit: 1, Now: t0, NewID: func() string { return "run-" + w }}); err != nil || len(invs) != 1 {
			t.Fatalf("claim for %s: %v %v", w, invs, err)
		}
		if got, err := db.Take(bg, w, 0, 100, false, t0); err != nil || len(got) != 1 {
			t.Fatalf("take for %s: %v %v", w, ids(got), err)
		}
	}
	lost, err := db.LostInvocations(bg, t0.Add(time.Hour))
	if err != nil || len(lost) != 1 || lost[0].WorkerID != pool.ID || lost[0].Reason != store.LostStale {
		t.Fatalf("lost %+v %v; want only the pool worker's run, as stale", lost, err)
	}
	if err := db.DeleteWorker(bg, "default", solo.ID); err != nil {
		t.Fatal(err)
	}
	lost, _ = db.LostInvocations(bg, t0.Add(time.Hour))
	if len(lost) != 2 || lost[0].WorkerID == lost[1].WorkerID {
		t.Fatalf("lost %+v; the removed single-job worker's run is lost too", lost)
	}
	for _, l := range lost {
		if l.WorkerID == solo.ID && l.Reason != store.LostRemoved {
			t.Fatalf("removed single-job worker's run: %+v", l)
		}
	}
}

// Jobs racing for one single-job worker, from every replica: one is
// queued, the others are refused, and the sequence has no gap.
func testConcurrentJobsForASingleJobWorker(t *testing.T, e *env) {
	db := e.store(t)
	w := helloSingle(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "solo", true, t0)
	stores := e.racers(t, 4)
	const n = 8
	refused := make([]bool, n)
	err := race(n, func(i int) error {
		_, err := enqueueJobExec(stores[i%len(stores)], w.ID, fmt.Sprintf("x%d", i))
		var sj *store.SingleJobError
		if errors.As(err, &sj) {
			refused[i] = true
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	queued := 0
	for _, r := range refused {
		if !r {
			queued++
		}
	}
	if queued != 1 {
		t.Fatalf("%d jobs queued for a single-job worker, want 1", queued)
	}
	if cmds := checkSeqs(t, db, w.ID); len(cmds) != 1 {
		t.Fatalf("commands %+v", cmds)
	}
}
