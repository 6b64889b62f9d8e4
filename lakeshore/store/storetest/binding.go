package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// tokenHello is a hello of machine/label made with the token id (fleet:
// with a fleet credential instead) by daemon process incarnation.
func tokenHello(db store.Store, newID, machine, label, tokenID string, fleet bool, incarnation string, now time.Time) (store.Worker, error) {
	w, _, err := db.Hello(bg, store.Hello{NewID: newID, Namespace: "default", MachineID: machine, Label: label,
		Incarnation: incarnation, TokenID: tokenID, Fleet: fleet, Now: now})
	return w, err
}

func mintDaemonToken(t *testing.T, db store.Store, id string, fleet bool, exp *time.Time) {
	t.Helper()
	if err := db.CreateToken(bg, store.Token{ID: id, Kind: store.TokenDaemon, Namespace: "default", Hash: "hash-" + id,
		CreatedAt: t0, ExpiresAt: exp, Fleet: fleet}); err != nil {
		t.Fatal(err)
	}
}

func boundTo(t *testing.T, db store.Store, tokenID string) string {
	t.Helper()
	tok, err := db.TokenByHash(bg, "hash-"+tokenID)
	if err != nil {
		t.Fatal(err)
	}
	return tok.WorkerID
}

// unchanged fails unless worker id still reads as it did in was: a refused
// hello wrote nothing.
func unchanged(t *testing.T, db store.Store, was store.Worker) {
	t.Helper()
	w, err := db.Worker(bg, "", was.ID)
	if err != nil {
		t.Fatal(err)
	}
	if w.Incarnation != was.Incarnation || !w.LastSeenAt.Equal(was.LastSeenAt) {
		t.Fatalf("a refused hello rewrote worker %s: incarnation %q last seen %v, was %q %v",
			was.ID, w.Incarnation, w.LastSeenAt, was.Incarnation, was.LastSeenAt)
	}
}

func testTokenBindsToItsFirstWorker(t *testing.T, e *env) {
	db := e.store(t)
	soon := t0.Add(time.Hour)
	mintDaemonToken(t, db, "ta", false, nil)
	mintDaemonToken(t, db, "tb", false, nil)
	mintDaemonToken(t, db, "tx", false, &soon)
	mintDaemonToken(t, db, "fleet", true, nil)
	if got := boundTo(t, db, "ta"); got != "" {
		t.Fatalf("a new token is bound to %q", got)
	}

	a, err := tokenHello(db, "wa", "ma", "a", "ta", false, "i1", t0)
	if err != nil || boundTo(t, db, "ta") != a.ID {
		t.Fatalf("first hello: %v, token bound to %q, worker %s", err, boundTo(t, db, "ta"), a.ID)
	}
	if tok, _ := db.TokenByHash(bg, "hash-fleet"); !tok.Fleet || tok.WorkerID != "" {
		t.Fatalf("fleet token reads back %+v", tok)
	}
	// The token's own worker says hello again, from a new process.
	a, err = tokenHello(db, "wa2", "ma", "a", "ta", false, "i2", t0.Add(time.Second))
	if err != nil || a.ID != "wa" || a.Incarnation != "i2" {
		t.Fatalf("re-hello: %+v %v", a, err)
	}

	// Token a on another machine: bound elsewhere, and no row is made.
	if _, err := tokenHello(db, "wz", "mz", "z", "ta", false, "i9", t0.Add(2*time.Second)); !errors.Is(err, store.ErrTokenBound) {
		t.Fatalf("token a from another machine: %v", err)
	}
	if _, err := db.Worker(bg, "", "wz"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused hello created its worker: %v", err)
	}
	// Token b, and a fleet credential, claiming worker a: refused, and
	// worker a keeps its incarnation (its running jobs are not lost).
	if _, err := tokenHello(db, "wb", "ma", "a", "tb", false, "evil", t0.Add(3*time.Second)); !errors.Is(err, store.ErrWorkerOwned) {
		t.Fatalf("token b claiming worker a: %v", err)
	}
	if _, err := tokenHello(db, "wb", "ma", "a", "", true, "evil", t0.Add(3*time.Second)); !errors.Is(err, store.ErrWorkerOwned) {
		t.Fatalf("fleet hello claiming worker a: %v", err)
	}
	unchanged(t, db, a)
	if got := boundTo(t, db, "tb"); got != "" {
		t.Fatalf("a refused hello bound token b to %q", got)
	}

	// A fleet credential binds nothing; a worker nobody owns may be taken
	// by a token.
	f, err := tokenHello(db, "wf", "mf", "f", "", true, "", t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tokenHello(db, "wf2", "mf", "f", "", true, "", t0); err != nil {
		t.Fatalf("second fleet hello: %v", err)
	}
	if w, err := tokenHello(db, "wf3", "mf", "f", "tb", false, "", t0); err != nil || w.ID != f.ID || boundTo(t, db, "tb") != f.ID {
		t.Fatalf("token b taking an unowned worker: %+v %v", w, err)
	}

	// A revoked owner lets a fresh token take its worker over.
	mintDaemonToken(t, db, "tc", false, nil)
	if _, err := db.RevokeToken(bg, "ta", t0.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if w, err := tokenHello(db, "wc", "ma", "a", "tc", false, "i3", t0.Add(5*time.Second)); err != nil || w.ID != a.ID {
		t.Fatalf("fresh token after the owner was revoked: %+v %v", w, err)
	}
	if boundTo(t, db, "tc") != a.ID || boundTo(t, db, "ta") != "" {
		t.Fatalf("after the take-over: c bound to %q, a to %q", boundTo(t, db, "tc"), boundTo(t, db, "ta"))
	}
	// So does an expired one.
	x, err := tokenHello(db, "wx", "mx", "x", "tx", false, "", t0)
	if err != nil {
		t.Fatal(err)
	}
	mintDaemonToken(t, db, "td", false, nil)
	if _, err := tokenHello(db, "wd", "mx", "x", "td", false, "", soon.Add(-time.Second)); !errors.Is(err, store.ErrWorkerOwned) {
		t.Fatalf("before the owner expired: %v", err)
	}
	if w, err := tokenHello(db, "wd", "mx", "x", "td", false, "", soon); err != nil || w.ID != x.ID {
		t.Fatalf("after the owner expired: %+v %v", w, err)
	}

	// A token whose worker row was deleted binds to its next hello's.
	if err := db.DeleteWorker(bg, "default", a.ID); err != nil {
		t.Fatal(err)
	}
	n, err := tokenHello(db, "wn", "ma", "a", "tc", false, "", t0.Add(6*time.Second))
	if err != nil || n.ID != "wn" || boundTo(t, db, "tc") != "wn" {
		t.Fatalf("after its worker was deleted: %+v %v, bound to %q", n, err, boundTo(t, db, "tc"))
	}
	// A hello its key admitted looks at no binding.
	if _, err := tokenHello(db, "wk", "mf", "f", "", false, "k", t0); err != nil {
		t.Fatalf("keyed hello of a token's worker: %v", err)
	}
	if list, _ := db.ListTokens(bg); len(list) != 6 {
		t.Fatalf("%d tokens listed", len(list))
	}
}

func testRefusedKeyHelloWritesNothing(t *testing.T, e *env) {
	db := e.store(t)
	a := hello(t, db, "wa", "ma", "a")
	if _, _, err := db.Hello(bg, store.Hello{NewID: "wa", Namespace: "default", MachineID: "ma", Label: "a", Incarnation: "i1", Now: t0,
		AddKey: &store.Key{ID: "k1", Namespace: "default", PublicKey: []byte("pub1"), CreatedAt: t0}}); err != nil {
		t.Fatal(err)
	}
	if k, err := db.CurrentKey(bg, a.ID); err != nil || k.ID != "k1" {
		t.Fatalf("key enrolled with the hello: %+v %v", k, err)
	}
	a, _ = db.Worker(bg, "", a.ID)
	b := hello(t, db, "wb", "mb", "b")
	// Enrolling k1 again, now for b: refused, and b is as it was.
	_, _, err := db.Hello(bg, store.Hello{NewID: "wb", Namespace: "default", MachineID: "mb", Label: "b", Incarnation: "evil", Now: t0.Add(time.Second),
		AddKey: &store.Key{ID: "k1", Namespace: "default", PublicKey: []byte("pub1"), CreatedAt: t0}})
	if !errors.Is(err, store.ErrKeyExists) {
		t.Fatalf("a stored key enrolled again: %v", err)
	}
	unchanged(t, db, b)
	if _, err := db.CurrentKey(bg, b.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("b got a key: %v", err)
	}
	// Moving k1 to b, which has a key of its own now: refused likewise.
	if err := db.AddKey(bg, store.Key{ID: "k2", WorkerID: b.ID, Namespace: "default", PublicKey: []byte("pub2"), CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	b, _ = db.Worker(bg, "", b.ID)
	_, _, err = db.Hello(bg, store.Hello{NewID: "wb", Namespace: "default", MachineID: "mb", Label: "b", Incarnation: "evil", Now: t0.Add(2 * time.Second),
		RebindKey: &store.KeyRebind{KeyID: "k1", From: a.ID}})
	if !errors.Is(err, store.ErrKeyNotCurrent) {
		t.Fatalf("rebind onto a worker with a key: %v", err)
	}
	unchanged(t, db, b)
	// A rebind naming the hello's own worker changes nothing.
	if _, _, err := db.Hello(bg, store.Hello{NewID: "wa", Namespace: "default", MachineID: "ma", Label: "a", Incarnation: "i2", Now: t0.Add(3 * time.Second),
		RebindKey: &store.KeyRebind{KeyID: "k1", From: a.ID}}); err != nil {
		t.Fatal(err)
	}
	if k, err := db.CurrentKey(bg, a.ID); err != nil || k.ID != "k1" {
		t.Fatalf("a's key after its own re-hello: %+v %v", k, err)
	}
}

func testExecReportsOnlyWhileRunning(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "wa", "ma", "a")
	for _, id := range []string{"e1", "e2"} {
		if _, err := db.Enqueue(bg, store.NewCommand{ID: "c" + id, WorkerID: w.ID, Kind: "exec", Body: []byte{0x80}, Now: t0},
			&store.NewExec{ID: id, Namespace: "default", Command: "echo", Stream: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.AppendOutput(bg, "e1", []byte("early")); !errors.Is(err, store.ErrExecNotDelivered) {
		t.Fatalf("chunk for a queued exec: %v", err)
	}
	if _, err := db.FinishRunningExec(bg, "e1", []byte("forged"), t0); !errors.Is(err, store.ErrExecNotDelivered) {
		t.Fatalf("result for a queued exec: %v", err)
	}
	if x, _ := db.Exec(bg, "e1"); x.State != operatorapi.ExecQueued || x.OutputLen != 0 || x.Result != nil && len(x.Result) > 0 {
		t.Fatalf("queued exec after refused reports: %+v", x)
	}
	if _, err := db.Take(bg, w.ID, 0, 10, false, t0); err != nil {
		t.Fatal(err)
	}
	if n, err := db.AppendOutput(bg, "e1", []byte("out")); err != nil || n != 3 {
		t.Fatalf("chunk while running: %d %v", n, err)
	}
	fin, err := db.FinishRunningExec(bg, "e1", []byte("real"), t0.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.FinishRunningExec(bg, "e1", []byte("again"), t0); !errors.Is(err, store.ErrExecFinished) {
		t.Fatalf("second result: %v", err)
	}
	if _, err := db.AppendOutput(bg, "e1", []byte("late")); !errors.Is(err, store.ErrExecFinished) {
		t.Fatalf("chunk after the result: %v", err)
	}
	x, _ := db.Exec(bg, "e1")
	if x.State != operatorapi.ExecFinished || string(x.Result) != "real" || x.OutputLen != 3 || x.FinishedAt == nil ||
		!x.FinishedAt.Equal(t0.Add(time.Second)) {
		t.Fatalf("finished exec %+v", x)
	}
	// What it returned is the row as it finished.
	if fin.ID != "e1" || fin.Namespace != "default" || fin.WorkerID != w.ID || fin.Command != "echo" || !fin.Stream ||
		fin.State != operatorapi.ExecFinished || string(fin.Result) != "real" || fin.OutputLen != 3 ||
		fin.FinishedAt == nil || !fin.FinishedAt.Equal(*x.FinishedAt) || !fin.CreatedAt.Equal(x.CreatedAt) {
		t.Fatalf("FinishRunningExec returned %+v; the row is %+v", fin, x)
	}
	if _, err := db.FinishRunningExec(bg, "nope", nil, t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown exec: %v", err)
	}

	// The worker's result racing the lost sweep: one of them wins.
	stores := e.racers(t, 2)
	var worker, sweep bool
	err = race(2, func(i int) error {
		if i == 0 {
			_, err := stores[0].FinishRunningExec(bg, "e2", []byte("worker"), t0)
			worker = err == nil
			if errors.Is(err, store.ErrExecFinished) {
				return nil
			}
			return err
		}
		applied, err := stores[1].FinishExec(bg, "e2", []byte("lost"), t0)
		sweep = applied
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	x, _ = db.Exec(bg, "e2")
	if worker == sweep || (worker && string(x.Result) != "worker") || (sweep && string(x.Result) != "lost") {
		t.Fatalf("worker applied %v, sweep applied %v, result %q", worker, sweep, x.Result)
	}
}

func testConcurrentHellosBindATokenOnce(t *testing.T, e *env) {
	db := e.store(t)
	mintDaemonToken(t, db, "t1", false, nil)
	for i := range 8 {
		mintDaemonToken(t, db, fmt.Sprintf("u%d", i), false, nil)
	}
	stores := e.racers(t, 4)
	// One token, eight machines: one hello wins.
	won := map[string]bool{}
	results := make([]string, 8)
	err := race(8, func(i int) error {
		w, err := tokenHello(stores[i%len(stores)], fmt.Sprintf("w%d", i), fmt.Sprintf("m%d", i), "l", "t1", false, "", t0)
		if errors.Is(err, store.ErrTokenBound) {
			return nil
		}
		results[i] = w.ID
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range results {
		if id != "" {
			won[id] = true
		}
	}
	if len(won) != 1 {
		t.Fatalf("one token bound to %d workers: %v", len(won), results)
	}
	for id := range won {
		if boundTo(t, db, "t1") != id {
			t.Fatalf("token bound to %q, the winner is %s", boundTo(t, db, "t1"), id)
		}
	}
	if list, _ := db.ListWorkers(bg, "default"); len(list) != 1 {
		t.Fatalf("%d workers made by racing hellos", len(list))
	}
	// Eight tokens, one new machine: one token owns it.
	owners := 0
	err = race(8, func(i int) error {
		_, err := tokenHello(stores[i%len(stores)], fmt.Sprintf("x%d", i), "mx", "l", fmt.Sprintf("u%d", i), false, "", t0)
		if errors.Is(err, store.ErrWorkerOwned) {
			return nil
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var owner string
	for i := range 8 {
		if w := boundTo(t, db, fmt.Sprintf("u%d", i)); w != "" {
			owners++
			owner = w
		}
	}
	if w, err := db.Worker(bg, "", owner); owners != 1 || err != nil || w.MachineID != "mx" {
		t.Fatalf("%d tokens own machine mx (%q, %v)", owners, owner, err)
	}
}
