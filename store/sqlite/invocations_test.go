package sqlite_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"nymph/store"
)

func newInvocation(t *testing.T, db interface {
	CreateInvocation(context.Context, store.NewInvocation) (store.Invocation, error)
}, id, queue, runner string, at time.Time) {
	t.Helper()
	if _, err := db.CreateInvocation(context.Background(), store.NewInvocation{
		ID: id, Namespace: "default", Queue: queue, Module: "m", Qualname: "f", Runner: runner,
		RunConfig: []byte(`{}`), Args: []byte{1}, ArgsSize: 1, RunBody: []byte("body-" + id), Now: at,
	}); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
}

func TestInvocationClaimCancelFinishAndReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	db := open(t, path)
	w := hello(t, db, "w1", "m", "l")
	if _, err := db.RecordPoll(ctx, store.Poll{WorkerID: w.ID, Queue: "a*", Now: t0}); err != nil {
		t.Fatal(err)
	}
	newInvocation(t, db, "i1", "a-1", "process", t0)
	newInvocation(t, db, "i2", "b", "", t0.Add(time.Second))
	newInvocation(t, db, "i3", "a-2", "docker", t0.Add(2*time.Second))
	newInvocation(t, db, "i4", "a-3", "", t0.Add(3*time.Second))

	n := 0
	claim := func() []store.Invocation {
		got, err := db.ClaimInvocations(ctx, store.Claim{WorkerID: w.ID, Limit: 10, Now: t0, NewID: func() string { n++; return fmt.Sprint("c", n) }})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got := claim()
	if len(got) != 2 || got[0].ID != "i1" || got[1].ID != "i4" || got[0].State != store.InvocationRunning || got[0].WorkerID != w.ID || got[0].CommandID != "c1" {
		t.Fatalf("claimed %+v", got)
	}
	if again := claim(); len(again) != 0 {
		t.Fatalf("claimed twice: %+v", again)
	}
	cmds, err := db.ListCommands(ctx, w.ID)
	if err != nil || len(cmds) != 2 || cmds[0].Kind != store.KindRun || !bytes.Equal(cmds[0].Body, []byte("body-i1")) || cmds[1].Seq != 2 {
		t.Fatalf("run commands %+v %v", cmds, err)
	}

	// i4's command is not delivered yet: cancelling withdraws it.
	inv, cancelled, err := db.CancelInvocation(ctx, "default", "i4", []byte(`{"type":"Cancelled","message":"m"}`), t0)
	if err != nil || !cancelled || inv.State != store.InvocationCancelled || string(inv.Error) != `{"type":"Cancelled","message":"m"}` {
		t.Fatalf("cancel undelivered: %+v %v %v", inv, cancelled, err)
	}
	took, err := db.Take(ctx, w.ID, 0, 10, false, t0)
	if err != nil || len(took) != 1 || took[0].ID != "c1" {
		t.Fatalf("take after the withdrawal: %+v %v", took, err)
	}
	// i1's is delivered: cancelling it is the daemon's job now.
	if inv, cancelled, err := db.CancelInvocation(ctx, "default", "i1", nil, t0); err != nil || cancelled || inv.State != store.InvocationRunning {
		t.Fatalf("cancel delivered: %+v %v %v", inv, cancelled, err)
	}
	if _, _, err := db.CancelInvocation(ctx, "other", "i1", nil, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("cancel in another namespace: %v", err)
	}

	// The worker goes quiet: i1 is lost to staleness; the guard keeps a
	// finish from another worker or state out.
	lost, err := db.LostInvocations(ctx, t0.Add(time.Minute))
	if err != nil || len(lost) != 1 || lost[0].ID != "i1" || lost[0].Reason != store.LostStale || lost[0].WorkerLabel != "l" {
		t.Fatalf("lost %+v %v", lost, err)
	}
	if _, applied, err := db.FinishInvocation(ctx, store.Finish{ID: "i1", State: store.InvocationFailed, From: []string{store.InvocationRunning}, WorkerID: "w2", Now: t0}); err != nil || applied {
		t.Fatalf("finish from another worker: %v %v", applied, err)
	}
	inv, applied, err := db.FinishInvocation(ctx, store.Finish{ID: "i1", State: store.InvocationSucceeded, From: []string{store.InvocationRunning},
		Result: []byte("r"), Now: t0.Add(time.Second)})
	if err != nil || !applied || string(inv.Result) != "r" || inv.ResultSize != 1 || inv.FinishedAt == nil {
		t.Fatalf("finish: %+v %v %v", inv, applied, err)
	}
	if _, applied, _ := db.FinishInvocation(ctx, store.Finish{ID: "i1", State: store.InvocationFailed, From: []string{store.InvocationRunning}, Now: t0}); applied {
		t.Fatal("a second finish applied")
	}
	if _, _, err := db.FinishInvocation(ctx, store.Finish{ID: "nope", State: store.InvocationFailed, From: []string{store.InvocationRunning}, Now: t0}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("finish unknown: %v", err)
	}
	db.Close()

	db = open(t, path)
	all, err := db.ListInvocations(ctx, store.InvocationFilter{Namespace: "default"})
	if err != nil || len(all) != 4 || all[0].ID != "i4" || all[3].ID != "i1" || all[3].Result != nil || all[3].ResultSize != 1 {
		t.Fatalf("after reopening: %+v %v", all, err)
	}
	queued, _ := db.ListInvocations(ctx, store.InvocationFilter{Namespace: "default", State: store.InvocationQueued, Queue: "b"})
	if len(queued) != 1 || queued[0].ID != "i2" {
		t.Fatalf("queued in b: %+v", queued)
	}
}
