package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

func testEnrollTokenIsConsumedOnce(t *testing.T, e *env) {
	db := e.store(t)
	exp := t0.Add(time.Hour)
	for _, tok := range []store.Token{
		{ID: "e1", Kind: store.TokenEnroll, Namespace: "default", Hash: "h1", CreatedAt: t0, ExpiresAt: &exp},
		{ID: "e2", Kind: store.TokenEnroll, Namespace: "default", Hash: "h2", CreatedAt: t0, ExpiresAt: &exp},
		{ID: "d1", Kind: store.TokenDaemon, Namespace: "default", Hash: "h3", CreatedAt: t0},
		{ID: "r1", Kind: store.TokenEnroll, Namespace: "default", Hash: "h4", CreatedAt: t0, RevokedAt: &t0},
	} {
		if err := db.CreateToken(bg, tok); err != nil {
			t.Fatal(err)
		}
	}

	// Many racers, on as many replicas as the backend has, one winner.
	stores := e.racers(t, 4)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, 16)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = stores[i%len(stores)].ConsumeToken(bg, "e1", fmt.Sprintf("k%d", i), t0)
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrTokenConsumed):
			t.Fatalf("racer: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d racers consumed one token", won)
	}

	if err := db.ConsumeToken(bg, "e2", "k", exp); !errors.Is(err, store.ErrTokenExpired) {
		t.Fatalf("at expiry: %v", err)
	}
	for _, id := range []string{"d1", "r1", "nope"} {
		if err := db.ConsumeToken(bg, id, "k", t0); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if err := db.ConsumeToken(bg, "e2", "k-a", t0); err != nil {
		t.Fatal(err)
	}
	if err := db.ReleaseToken(bg, "e2", "k-b"); err != nil {
		t.Fatal(err)
	}
	if err := db.ConsumeToken(bg, "e2", "k-b", t0); !errors.Is(err, store.ErrTokenConsumed) {
		t.Fatalf("released by the wrong consumer: %v", err)
	}
	if err := db.ReleaseToken(bg, "e2", "k-a"); err != nil {
		t.Fatal(err)
	}
	if err := db.ConsumeToken(bg, "e2", "k-b", t0); err != nil {
		t.Fatalf("after release: %v", err)
	}
	if tok, err := db.TokenByHash(bg, "h2"); err != nil || tok.ConsumedAt == nil || !tok.ConsumedAt.Equal(t0) {
		t.Fatalf("consumed token reads back %+v %v", tok, err)
	}
}

func testKeysLifecycle(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	key := func(id string, at time.Time) store.Key {
		return store.Key{ID: id, WorkerID: w.ID, Namespace: "default", PublicKey: []byte(id + "-pub"), CreatedAt: at}
	}
	if _, err := db.CurrentKey(bg, w.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("no key yet: %v", err)
	}
	if err := db.AddKey(bg, key("k1", t0)); err != nil {
		t.Fatal(err)
	}
	if err := db.AddKey(bg, key("k1", t0)); !errors.Is(err, store.ErrKeyExists) {
		t.Fatalf("same id twice: %v", err)
	}
	// A second enrollment replaces the first key.
	if err := db.AddKey(bg, key("k2", t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if k, err := db.Key(bg, "k1"); err != nil || k.RevokedAt == nil || !k.RevokedAt.Equal(t0.Add(time.Minute)) || k.ReplacedBy != "" {
		t.Fatalf("k1 after re-enrollment: %+v %v", k, err)
	}
	if k, err := db.CurrentKeyOf(bg, "default", "m1", "gpu"); err != nil || k.ID != "k2" || string(k.PublicKey) != "k2-pub" || k.WorkerID != w.ID {
		t.Fatalf("current of identity: %+v %v", k, err)
	}
	if _, err := db.CurrentKeyOf(bg, "default", "m1", "cpu"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("current of an unknown identity: %v", err)
	}

	// Rotation needs the current key.
	if err := db.RotateKey(bg, "k1", key("k3", t0.Add(2*time.Minute))); !errors.Is(err, store.ErrKeyNotCurrent) {
		t.Fatalf("rotate from a revoked key: %v", err)
	}
	if err := db.RotateKey(bg, "k2", key("k1", t0.Add(2*time.Minute))); !errors.Is(err, store.ErrKeyExists) {
		t.Fatalf("rotate to a used key: %v", err)
	}
	if k, err := db.CurrentKey(bg, w.ID); err != nil || k.ID != "k2" {
		t.Fatalf("a refused rotation changed the current key: %+v %v", k, err)
	}
	if err := db.RotateKey(bg, "k2", key("k3", t0.Add(2*time.Minute))); err != nil {
		t.Fatal(err)
	}
	if k, err := db.Key(bg, "k2"); err != nil || k.RevokedAt == nil || k.ReplacedBy != "k3" {
		t.Fatalf("k2 after rotation: %+v %v", k, err)
	}

	// Revocation: current key by default, idempotent, per worker.
	if _, err := db.RevokeKey(bg, "someone-else", "k3", t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke another worker's key: %v", err)
	}
	k, err := db.RevokeKey(bg, w.ID, "", t0.Add(3*time.Minute))
	if err != nil || k.ID != "k3" || k.RevokedAt == nil {
		t.Fatalf("revoke current: %+v %v", k, err)
	}
	again, err := db.RevokeKey(bg, w.ID, "k3", t0.Add(time.Hour))
	if err != nil || !again.RevokedAt.Equal(*k.RevokedAt) {
		t.Fatalf("revoke twice: %+v %v", again, err)
	}
	if _, err := db.RevokeKey(bg, w.ID, "", t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("no current key left: %v", err)
	}
	ks, err := db.WorkerKeys(bg, w.ID)
	if err != nil || len(ks) != 3 || ks[0].ID != "k1" || ks[2].ID != "k3" {
		t.Fatalf("worker keys %+v %v", ks, err)
	}
	if ns, err := db.NamespaceKeys(bg, "default"); err != nil || len(ns) != 3 {
		t.Fatalf("namespace keys %+v %v", ns, err)
	}
	if _, err := db.Key(bg, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
}

func testRebindKeyToRecreatedWorker(t *testing.T, e *env) {
	db := e.store(t)
	old := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	if err := db.AddKey(bg, store.Key{ID: "k1", WorkerID: old.ID, Namespace: "default", PublicKey: []byte("p"), CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteWorker(bg, "default", old.ID); err != nil {
		t.Fatal(err)
	}
	if k, err := db.Key(bg, "k1"); err != nil || k.WorkerID != old.ID || k.RevokedAt != nil {
		t.Fatalf("a key outlives its worker row: %+v %v", k, err)
	}
	fresh := hello(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m1", "gpu")
	if err := db.RebindKey(bg, "k1", "wrong", fresh.ID); !errors.Is(err, store.ErrKeyNotCurrent) {
		t.Fatalf("rebind from the wrong worker: %v", err)
	}
	if err := db.RebindKey(bg, "k1", old.ID, fresh.ID); err != nil {
		t.Fatal(err)
	}
	if k, err := db.CurrentKey(bg, fresh.ID); err != nil || k.ID != "k1" {
		t.Fatalf("after rebind: %+v %v", k, err)
	}
	other := hello(t, db, "cccccccccccccccccccccccc", "m2", "cpu")
	if err := db.AddKey(bg, store.Key{ID: "k2", WorkerID: other.ID, Namespace: "default", PublicKey: []byte("q"), CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := db.RebindKey(bg, "k1", fresh.ID, other.ID); !errors.Is(err, store.ErrKeyNotCurrent) {
		t.Fatalf("rebind onto a worker with its own key: %v", err)
	}
}

func testTokensListAndRevoke(t *testing.T, e *env) {
	db := e.open(t)
	t0 := time.UnixMilli(1_700_000_000_000).UTC()
	for i, id := range []string{"t1", "t2"} {
		tok := store.Token{ID: id, Kind: store.TokenDaemon, Namespace: "default", Label: "l-" + id,
			Hash: "hash-" + id, CreatedAt: t0.Add(time.Duration(i) * time.Second)}
		if err := db.CreateToken(bg, tok); err != nil {
			t.Fatal(err)
		}
	}
	list, err := db.ListTokens(bg)
	if err != nil || len(list) != 2 || list[0].ID != "t1" || list[1].ID != "t2" || list[1].Label != "l-t2" || list[0].RevokedAt != nil {
		t.Fatalf("list %+v: %v", list, err)
	}
	at := t0.Add(time.Minute)
	got, err := db.RevokeToken(bg, "t2", at)
	if err != nil || got.ID != "t2" || got.RevokedAt == nil || !got.RevokedAt.Equal(at) {
		t.Fatalf("revoke: %+v %v", got, err)
	}
	// Revoking again keeps the first time.
	if got, err := db.RevokeToken(bg, "t2", at.Add(time.Hour)); err != nil || !got.RevokedAt.Equal(at) {
		t.Fatalf("revoke again: %+v %v", got, err)
	}
	if tok, err := db.TokenByHash(bg, "hash-t2"); err != nil || tok.RevokedAt == nil {
		t.Fatalf("by hash after revoke: %+v %v", tok, err)
	}
	if _, err := db.RevokeToken(bg, "nope", at); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	// The revocation is durable and seen by every replica.
	other := e.open(t)
	if tok, err := other.TokenByHash(bg, "hash-t2"); err != nil || tok.RevokedAt == nil || !tok.RevokedAt.Equal(at) {
		t.Fatalf("another store: %+v %v", tok, err)
	}
}
