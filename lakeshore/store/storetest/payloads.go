package storetest

import (
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// testPayloadRetention: a payload expires once it is older than the cutoff
// and no unfinished (or recently finished) job holds it — an invocation
// whose args it is, or the invocation or exec it was uploaded for.
func testPayloadRetention(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "w1", "m", "l")
	cutoff := t0.Add(time.Hour)
	if _, err := db.CreateInvocation(bg, store.NewInvocation{
		ID: "i1", Namespace: "default", Queue: "q", Module: "m", Qualname: "f",
		RunConfig: []byte(`{}`), ArgsKey: "args-i1", ArgsSize: 9, RunBody: []byte("b"), Now: t0,
	}); err != nil {
		t.Fatal(err)
	}
	newInvocation(t, db, "i2", "q", "", t0)
	enqueueExec(t, db, w.ID, "c1", "x1")
	record := func(ns, key, job string, at time.Time) {
		t.Helper()
		if err := db.RecordPayload(bg, store.PayloadBlob{Namespace: ns, Key: key, JobID: job, CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	record("default", "args-i1", "", t0)
	record("default", "free", "", t0)
	record("other", "args-i1", "", t0) // same key, another namespace: i1 does not hold it
	record("default", "result-i2", "i2", t0)
	record("default", "result-x1", "x1", t0)
	record("default", "gone-job", "deleted", t0)
	record("default", "young", "", cutoff)
	// Recording again keeps the first time and takes the job.
	record("default", "free", "", cutoff.Add(time.Hour))

	expired := func(want ...string) {
		t.Helper()
		got, err := db.ExpiredPayloads(bg, cutoff, 100)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, p := range got {
			names = append(names, p.Namespace+"/"+p.Key)
		}
		if !equal(names, want) {
			t.Fatalf("expired = %v, want %v", names, want)
		}
	}
	expired("default/free", "default/gone-job", "other/args-i1")
	if got, err := db.ExpiredPayloads(bg, cutoff, 1); err != nil || len(got) != 1 {
		t.Fatalf("limit 1: %v %v", got, err)
	}

	// Finished before the cutoff: released. After it: still held.
	if _, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i1", State: operatorapi.InvocationFailed,
		From: []string{operatorapi.InvocationQueued}, Error: []byte(`{"type":"E"}`), Now: t0.Add(time.Minute)}); err != nil || !applied {
		t.Fatalf("finish i1: %v %v", applied, err)
	}
	if _, applied, err := db.FinishInvocation(bg, store.Finish{ID: "i2", State: operatorapi.InvocationFailed,
		From: []string{operatorapi.InvocationQueued}, Error: []byte(`{"type":"E"}`), Now: cutoff}); err != nil || !applied {
		t.Fatalf("finish i2: %v %v", applied, err)
	}
	if _, err := db.FinishExec(bg, "x1", []byte{0x80}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	expired("default/args-i1", "default/free", "default/gone-job", "default/result-x1", "other/args-i1")

	for _, k := range []string{"args-i1", "free"} {
		if err := db.ForgetPayload(bg, "default", k); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.ForgetPayload(bg, "default", "never-there"); err != nil {
		t.Fatalf("forget a missing record: %v", err)
	}
	db = e.reopen(t)
	expired("default/gone-job", "default/result-x1", "other/args-i1")
}
