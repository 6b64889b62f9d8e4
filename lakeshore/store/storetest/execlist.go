package storetest

import (
	"testing"
	"time"

	"nymph/lakeshore/store"
)

// ListExecs: newest first, one worker's or the namespace's, at most the
// limit, with their results and without their output.
func testListExecsNewestFirst(t *testing.T, e *env) {
	db := e.store(t)
	a := hello(t, db, "aaaaaaaaaaaaaaaaaaaaaaaa", "m1", "a")
	b := hello(t, db, "bbbbbbbbbbbbbbbbbbbbbbbb", "m2", "b")
	for i, x := range []struct{ id, worker string }{{"e1", a.ID}, {"e2", b.ID}, {"e3", a.ID}} {
		if _, err := db.Enqueue(bg, store.NewCommand{ID: "c-" + x.id, WorkerID: x.worker, Kind: "exec", Body: []byte{0x80},
			Now: t0.Add(time.Duration(i) * time.Second)}, &store.NewExec{ID: x.id, Namespace: "default", Command: "echo " + x.id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.FinishExec(bg, "e1", []byte{0x81}, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	ids := func(f store.ExecFilter) []string {
		t.Helper()
		xs, err := db.ListExecs(bg, f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		out := []string{}
		for _, x := range xs {
			out = append(out, x.ID)
			if x.ID == "e1" && (string(x.Result) != "\x81" || x.FinishedAt == nil || x.Command != "echo e1") {
				t.Fatalf("e1 listed as %+v", x)
			}
		}
		return out
	}
	for _, tc := range []struct {
		f    store.ExecFilter
		want []string
	}{
		{store.ExecFilter{Namespace: "default", Limit: 10}, []string{"e3", "e2", "e1"}},
		{store.ExecFilter{Namespace: "default", WorkerID: a.ID, Limit: 10}, []string{"e3", "e1"}},
		{store.ExecFilter{Namespace: "default", Limit: 1}, []string{"e3"}},
		{store.ExecFilter{Namespace: "other", Limit: 10}, []string{}},
		{store.ExecFilter{Namespace: "default", WorkerID: "nobody", Limit: 10}, []string{}},
	} {
		if got := ids(tc.f); !equal(got, tc.want) {
			t.Errorf("list %+v: %v, want %v", tc.f, got, tc.want)
		}
	}
}
