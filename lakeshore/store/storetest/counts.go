package storetest

import (
	"sort"
	"strconv"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

// testCounts: the metrics' counts group workers by state and last seen,
// and undelivered commands by kind and poll queue, with the queued
// invocations beside them; what is delivered or claimed counts no more.
func testCounts(t *testing.T, e *env) {
	s := e.store(t)
	a := hello(t, s, "wa", "ma", "a")
	b := hello(t, s, "wb", "mb", "b")
	if _, err := s.RecordPoll(bg, store.Poll{WorkerID: b.ID, Queue: "gpu", Now: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	enqueue(t, s, a.ID, "ca1", "exec")
	enqueue(t, s, a.ID, "ca2", "exec")
	enqueue(t, s, b.ID, "cb1", "exec")
	enqueue(t, s, b.ID, "cb2", "reset_backoff")
	newInvocation(t, s, "i1", "gpu", "", t0)
	newInvocation(t, s, "i2", "cpu", "", t0)

	workers, err := s.CountWorkers(bg, t0.Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	byBefore := map[bool]int64{}
	for _, c := range workers {
		n += c.N
		byBefore[c.SeenBefore] += c.N
	}
	if n != 2 || byBefore[true] != 1 || byBefore[false] != 1 {
		t.Fatalf("worker counts %+v: want a seen before the cut, b after", workers)
	}

	queued := func() []string {
		t.Helper()
		qs, err := s.CountQueued(bg)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, q := range qs {
			out = append(out, q.Kind+"/"+q.Queue+"="+strconv.FormatInt(q.N, 10))
		}
		sort.Strings(out)
		return out
	}
	want := []string{"exec/=2", "exec/gpu=1", "invocation/cpu=1", "invocation/gpu=1", "reset_backoff/gpu=1"}
	if got := queued(); !equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if _, err := s.Take(bg, a.ID, 0, 10, false, t0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CancelInvocation(bg, "default", "i2", []byte(`{}`), t0); err != nil {
		t.Fatal(err)
	}
	want = []string{"exec/gpu=1", "invocation/gpu=1", "reset_backoff/gpu=1"}
	if got := queued(); !equal(got, want) {
		t.Fatalf("after a take and a cancel: queued %v, want %v", got, want)
	}
}
