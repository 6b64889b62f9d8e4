package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

func testQueueEditsSurviveHelloAndReopen(t *testing.T, e *env) {
	db := e.store(t)
	w, _, err := db.Hello(bg, store.Hello{NewID: "aaaaaaaaaaaaaaaaaaaaaaaa", Namespace: "default", MachineID: "m", Label: "l",
		Queues: []string{"gpu", "cpu"}, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(w.Queues, []string{"gpu", "cpu"}) || !slices.Equal(w.Lanes, w.Queues) || len(w.QueuesAdded) != 0 {
		t.Fatalf("fresh worker: %+v", w)
	}

	_, err = db.EditWorkerQueues(bg, store.QueueEdit{Namespace: "default", WorkerID: w.ID, Add: []string{"batch"}})
	var uq *store.UnknownQueueError
	if !errors.As(err, &uq) || uq.Name != "batch" || !errors.Is(err, store.ErrUnknownQueue) {
		t.Fatalf("add of a missing queue: %v", err)
	}
	if created, err := db.CreateQueue(bg, "default", "batch", t0); err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if created, err := db.CreateQueue(bg, "default", "batch", t0.Add(time.Hour)); err != nil || created {
		t.Fatalf("create again: %v %v", created, err)
	}
	if _, err := db.EditWorkerQueues(bg, store.QueueEdit{Namespace: "other", WorkerID: w.ID, Remove: []string{"gpu"}}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("edit in the wrong namespace: %v", err)
	}
	w, err = db.EditWorkerQueues(bg, store.QueueEdit{Namespace: "default", WorkerID: w.ID, Add: []string{"batch"}, Remove: []string{"gpu"}})
	if err != nil || !slices.Equal(w.Queues, []string{"cpu", "batch"}) {
		t.Fatalf("edit: %+v %v", w, err)
	}
	// The daemon names its lanes again; the operator's edits stand.
	if _, _, err := db.Hello(bg, store.Hello{NewID: "x", Namespace: "default", MachineID: "m", Label: "l", Queues: []string{"gpu"}, Now: t0}); err != nil {
		t.Fatal(err)
	}
	if err := db.SetTargetVersion(bg, "default", ptr("1.2.3"), t0); err != nil {
		t.Fatal(err)
	}

	db = e.reopen(t)
	w, err = db.Worker(bg, "default", w.ID)
	if err != nil || !slices.Equal(w.Queues, []string{"batch"}) || !slices.Equal(w.Lanes, []string{"gpu"}) ||
		!slices.Equal(w.QueuesAdded, []string{"batch"}) || !slices.Equal(w.QueuesRemoved, []string{"gpu"}) {
		t.Fatalf("after re-hello and reopen: %+v %v", w, err)
	}
	qs, err := db.ListQueues(bg, "default")
	if err != nil || len(qs) != 2 || qs[0].Name != "batch" || qs[0].CreatedAt == nil || !qs[0].CreatedAt.Equal(t0) ||
		!slices.Equal(qs[0].Members, []string{w.ID}) || qs[1].Name != "gpu" || qs[1].CreatedAt != nil || len(qs[1].Members) != 0 {
		t.Fatalf("queues: %+v %v", qs, err)
	}
	// The queue a worker polls exists and counts it as a member.
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Queue: "polled", Now: t0}); err != nil {
		t.Fatal(err)
	}
	qs, _ = db.ListQueues(bg, "default")
	if len(qs) != 3 || qs[2].Name != "polled" || !slices.Equal(qs[2].Members, []string{w.ID}) {
		t.Fatalf("queues with a polled one: %+v", qs)
	}
	if v, err := db.TargetVersion(bg, "default"); err != nil || v == nil || *v != "1.2.3" {
		t.Fatalf("target after reopen: %v %v", v, err)
	}
	if err := db.SetTargetVersion(bg, "lab", ptr("1.2.3"), t0); err != nil {
		t.Fatal(err)
	}
	if err := db.SetTargetVersion(bg, "other", ptr("2.0.0"), t0); err != nil {
		t.Fatal(err)
	}
	if nss, err := db.NamespacesTargeting(bg, "1.2.3"); err != nil || !slices.Equal(nss, []string{"default", "lab"}) {
		t.Fatalf("namespaces targeting 1.2.3: %v %v", nss, err)
	}
	if nss, err := db.NamespacesTargeting(bg, "9.9.9"); err != nil || len(nss) != 0 {
		t.Fatalf("namespaces targeting 9.9.9: %v %v", nss, err)
	}
	if err := db.SetTargetVersion(bg, "default", nil, t0); err != nil {
		t.Fatal(err)
	}
	if v, err := db.TargetVersion(bg, "default"); err != nil || v != nil {
		t.Fatalf("cleared target: %v %v", v, err)
	}
	if v, err := db.TargetVersion(bg, "never-set"); err != nil || v != nil {
		t.Fatalf("unset namespace: %v %v", v, err)
	}
}

// testClaimFollowsMembership: a worker claims the invocations of every queue
// it is a member of (Worker.InQueue), as a queue exec would reach it: its
// lanes, the operator's additions whatever it polls, its poll queue (the
// default one when it names none) unless the operator removed that.
func testClaimFollowsMembership(t *testing.T, e *env) {
	db := e.store(t)
	w, _, err := db.Hello(bg, store.Hello{NewID: "w1", Namespace: "default", MachineID: "m", Label: "l",
		Queues: []string{"gpu"}, Capabilities: store.Capabilities{Runners: []string{"process"}}, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Queue: "polled-*", Now: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateQueue(bg, "default", "training", t0); err != nil {
		t.Fatal(err)
	}
	for i, q := range []string{"training", "gpu", "polled-a", "default", "cpu", "polled"} {
		newInvocation(t, db, fmt.Sprint("i", i), q, "", t0.Add(time.Duration(i)*time.Second))
	}
	claim := claimer(t, db, w.ID, "c", t0)
	ids := func(invs []store.Invocation) []string {
		var out []string
		for _, inv := range invs {
			out = append(out, inv.ID)
		}
		return out
	}
	// Before the edit: its lane and its poll queue's prefix; not the
	// default queue (it polls another), not training.
	if got := ids(claim(10)); !slices.Equal(got, []string{"i1", "i2"}) {
		t.Fatalf("by lane and poll queue: claimed %v", got)
	}
	w, err = db.EditWorkerQueues(bg, store.QueueEdit{Namespace: "default", WorkerID: w.ID, Add: []string{"training"}})
	if err != nil {
		t.Fatal(err)
	}
	if !w.InQueue("training") || w.InQueue("cpu") {
		t.Fatalf("membership after the edit: %+v", w)
	}
	if got := ids(claim(10)); !slices.Equal(got, []string{"i0"}) {
		t.Fatalf("added to training while polling polled-*: claimed %v", got)
	}
	// The operator removes the poll queue: its invocations stay queued.
	if _, err := db.EditWorkerQueues(bg, store.QueueEdit{Namespace: "default", WorkerID: w.ID, Remove: []string{"polled-*"}}); err != nil {
		t.Fatal(err)
	}
	newInvocation(t, db, "i6", "polled-b", "", t0.Add(6*time.Second))
	if got := ids(claim(10)); len(got) != 0 {
		t.Fatalf("after removing the poll queue: claimed %v", got)
	}
	// A worker that polls no queue is in the default one.
	other := hello(t, db, "w2", "m2", "l2")
	if !other.InQueue("default") {
		t.Fatalf("a worker polling no queue is not in default: %+v", other)
	}
	if got := ids(claimer(t, db, other.ID, "d", t0)(10)); !slices.Equal(got, []string{"i3"}) {
		t.Fatalf("a worker polling no queue claimed %v", got)
	}
}
