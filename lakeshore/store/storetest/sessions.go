package storetest

import (
	"errors"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

// Sessions: found while neither expiry has passed, the idle one moved by
// use but never past the absolute one; seen by another replica and after
// a restart; gone everywhere once deleted; purged once expired.
func testSessionsExpireAndEnd(t *testing.T, e *env) {
	db := e.store(t)
	s := store.Session{IDHash: "h1", CSRF: "c1", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), AbsoluteAt: t0.Add(3 * time.Hour)}
	if err := db.CreateSession(bg, s); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := db.CreateSession(bg, s); err == nil {
		t.Fatal("a second session with one id hash was stored")
	}
	got, err := db.TouchSession(bg, "h1", t0.Add(50*time.Minute), time.Hour)
	if err != nil || got.CSRF != "c1" || !got.ExpiresAt.Equal(t0.Add(110*time.Minute)) || !got.CreatedAt.Equal(t0) {
		t.Fatalf("touch: %+v, %v", got, err)
	}
	// Another replica, and a restart, see it with its moved expiry.
	if got, err := e.open(t).TouchSession(bg, "h1", t0.Add(100*time.Minute), time.Hour); err != nil || !got.ExpiresAt.Equal(t0.Add(160*time.Minute)) {
		t.Fatalf("touch from a second store: %+v, %v", got, err)
	}
	db = e.reopen(t)
	// Use never moves it past the absolute expiry.
	if got, err := db.TouchSession(bg, "h1", t0.Add(150*time.Minute), time.Hour); err != nil || !got.ExpiresAt.Equal(t0.Add(3*time.Hour)) {
		t.Fatalf("touch near the absolute expiry: %+v, %v", got, err)
	}
	if _, err := db.TouchSession(bg, "h1", t0.Add(3*time.Hour), time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch at the absolute expiry: %v, want ErrNotFound", err)
	}
	if _, err := db.TouchSession(bg, "nope", t0, time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch of an unknown session: %v, want ErrNotFound", err)
	}

	// Idle expiry: unused for longer than its window, it is gone.
	idle := store.Session{IDHash: "h2", CSRF: "c2", CreatedAt: t0, ExpiresAt: t0.Add(time.Minute), AbsoluteAt: t0.Add(time.Hour)}
	live := store.Session{IDHash: "h3", CSRF: "c3", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour), AbsoluteAt: t0.Add(time.Hour)}
	for _, s := range []store.Session{idle, live} {
		if err := db.CreateSession(bg, s); err != nil {
			t.Fatalf("create: %v", err)
		}
	}
	if _, err := db.TouchSession(bg, "h2", t0.Add(2*time.Minute), time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch after the idle expiry: %v, want ErrNotFound", err)
	}

	// A logout on one replica ends it on every other.
	if err := e.open(t).DeleteSession(bg, "h3"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if err := db.DeleteSession(bg, "h3"); err != nil {
		t.Fatalf("delete again: %v", err)
	}
	if _, err := db.TouchSession(bg, "h3", t0, time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch after delete: %v, want ErrNotFound", err)
	}

	// Purge drops the expired rows, and only those: at +90 min h2 (idle)
	// and h3 (absolute, 1 h), at +4 h h1 too.
	if err := db.CreateSession(bg, live); err != nil {
		t.Fatalf("create: %v", err)
	}
	if n, err := db.PurgeSessions(bg, t0.Add(90*time.Minute)); err != nil || n != 2 {
		t.Fatalf("purge at +90m: %d, %v; want 2 (h2, h3)", n, err)
	}
	if _, err := db.TouchSession(bg, "h1", t0.Add(90*time.Minute), time.Minute); err != nil {
		t.Fatalf("h1 was purged with the expired ones: %v", err)
	}
	if n, err := db.PurgeSessions(bg, t0.Add(4*time.Hour)); err != nil || n != 1 {
		t.Fatalf("purge at +4h: %d, %v; want 1 (h1)", n, err)
	}
}
