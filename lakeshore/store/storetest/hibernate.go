package storetest

import (
	"testing"
	"time"

	"nymph/lakeshore/store"
	"nymph/messages"
)

// enqueueHibernate queues a hibernate with a real body, deadline until,
// at now; until not after now is a wake.
func enqueueHibernate(t *testing.T, s store.Store, worker, id string, until, now time.Time) store.Command {
	t.Helper()
	cmd, err := messages.EncodeCommand(id, messages.KindHibernate, &messages.Hibernate{UntilEpochS: messages.Epoch(until.Unix())})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Enqueue(bg, store.NewCommand{ID: id, WorkerID: worker, Kind: store.KindHibernate, Body: cmd.Body, Now: now, HibernateUntil: &until}, nil)
	if err != nil {
		t.Fatalf("enqueue hibernate %s: %v", id, err)
	}
	return c
}

func hibernatingUntil(t *testing.T, s store.Store, worker string) *time.Time {
	t.Helper()
	wk, err := s.Worker(bg, "", worker)
	if err != nil {
		t.Fatal(err)
	}
	return wk.HibernatingUntil
}

// Queued hibernates are served in turn: the worker shows the deadline it
// is serving, not the last one queued, and the next one once delivered.
func testHibernationInForce(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	a, b := t0.Add(time.Hour), t0.Add(3*time.Hour)
	enqueueHibernate(t, db, w.ID, "ha", a, t0)
	if got := hibernatingUntil(t, db, w.ID); got == nil || !got.Equal(a) {
		t.Fatalf("a hibernate queued for an awake worker: until %v, want %v", got, a)
	}
	if got, err := db.Take(bg, w.ID, 0, 10, false, t0); err != nil || !equal(ids(got), []string{"ha"}) {
		t.Fatalf("take: %v %v", ids(got), err)
	}
	enqueueHibernate(t, db, w.ID, "hb", b, t0.Add(time.Minute))
	if got := hibernatingUntil(t, db, w.ID); got == nil || !got.Equal(a) {
		t.Fatalf("while the first is served: until %v, want the one in force %v", got, a)
	}
	// The first ends: the daemon polls with its cursor and gets the second.
	cur := int64(1)
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: &cur, Now: a}); err != nil {
		t.Fatal(err)
	}
	if got := hibernatingUntil(t, db, w.ID); got != nil {
		t.Fatalf("between the two: until %v", got)
	}
	if got, err := db.Take(bg, w.ID, cur, 10, false, a); err != nil || !equal(ids(got), []string{"hb"}) {
		t.Fatalf("second take: %v %v", ids(got), err)
	}
	if got := hibernatingUntil(t, db, w.ID); got == nil || !got.Equal(b) {
		t.Fatalf("the second in force: until %v, want %v", got, b)
	}
}

// A wake withdraws the hibernates not yet delivered, is what WakePending
// finds (a hibernate queued for later is not), and once delivered leaves
// the worker awake.
func testWakeWithdrawsQueuedHibernates(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	a := t0.Add(time.Hour)
	enqueueHibernate(t, db, w.ID, "ha", a, t0)
	if _, err := db.Take(bg, w.ID, 0, 10, false, t0); err != nil {
		t.Fatal(err)
	}
	cur := int64(1) // the watch poll acknowledges the hibernate in force
	if _, err := db.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: &cur, Now: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Minute)
	enqueueHibernate(t, db, w.ID, "hb", t0.Add(5*time.Hour), now)
	enqueue(t, db, w.ID, "r1", "reset_backoff")
	if ok, err := db.WakePending(bg, w.ID, cur); err != nil || ok {
		t.Fatalf("a hibernate queued for later is no wake: %v %v", ok, err)
	}
	if wake := enqueueHibernate(t, db, w.ID, "wake", now.Truncate(time.Second), now); wake.Ends == nil || !wake.Ends.Equal(a) {
		t.Fatalf("the wake ends %v, want the hibernation in force %v", wake.Ends, a)
	}
	if ok, err := db.WakePending(bg, w.ID, cur); err != nil || !ok {
		t.Fatalf("the wake not found: %v %v", ok, err)
	}
	if got := hibernatingUntil(t, db, w.ID); got == nil || !got.Equal(a) {
		t.Fatalf("until the wake is delivered the worker sleeps: %v", got)
	}
	got, err := db.Take(bg, w.ID, cur, 10, false, now)
	if err != nil || !equal(ids(got), []string{"r1", "wake"}) {
		t.Fatalf("after the wake: %v %v (the queued hibernate must be withdrawn)", ids(got), err)
	}
	if got := hibernatingUntil(t, db, w.ID); got != nil {
		t.Fatalf("woken, still hibernating until %v", got)
	}
	if ok, err := db.WakePending(bg, w.ID, got[len(got)-1].Seq); err != nil || ok {
		t.Fatalf("past the wake: %v %v", ok, err)
	}
	all, err := db.ListCommands(bg, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.ID == "hb" {
			t.Fatalf("withdrawn hibernate still listed: %+v", c)
		}
	}
}

// A hibernate queued for a daemon that has not polled yet shows at once;
// a wake that withdraws it, undelivered, leaves the worker awake.
func testWakeOfAnUndeliveredHibernate(t *testing.T, e *env) {
	db := e.store(t)
	w := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "gpu")
	enqueueHibernate(t, db, w.ID, "ha", t0.Add(72*time.Hour), t0)
	if got := hibernatingUntil(t, db, w.ID); got == nil {
		t.Fatal("a hibernate queued for an awake worker does not show")
	}
	now := t0.Add(time.Minute)
	if wake := enqueueHibernate(t, db, w.ID, "wake", now, now); wake.Ends != nil {
		t.Fatalf("a wake of a worker that was never delivered a hibernate ends %v", wake.Ends)
	}
	if got := hibernatingUntil(t, db, w.ID); got != nil && got.After(now) {
		t.Fatalf("after the wake withdrew the only hibernate: until %v", got)
	}
	// A second hibernate after the wake shows again.
	later := now.Add(90 * time.Minute)
	enqueueHibernate(t, db, w.ID, "hb", later, now)
	if got := hibernatingUntil(t, db, w.ID); got == nil || !got.Equal(later) {
		t.Fatalf("a new hibernate after the wake: until %v, want %v", got, later)
	}
}
