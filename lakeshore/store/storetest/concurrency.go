package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// race runs fn(i) for i in [0, n) at once and returns their errors joined.
func race(n int, fn func(i int) error) error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = fn(i)
		}()
	}
	close(start)
	wg.Wait()
	return errors.Join(errs...)
}

// checkSeqs fails unless the worker's commands are numbered 1..n without a
// gap or a repeat, and its last_seq is n.
func checkSeqs(t *testing.T, s store.Store, workerID string) []store.Command {
	t.Helper()
	cmds, err := s.ListCommands(bg, workerID)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		if c.Seq != int64(i+1) {
			t.Fatalf("worker %s: command %d has seq %d: %+v", workerID, i, c.Seq, cmds)
		}
	}
	w, err := s.Worker(bg, "", workerID)
	if err != nil {
		t.Fatal(err)
	}
	if w.LastSeq != int64(len(cmds)) {
		t.Fatalf("worker %s: last seq %d with %d commands", workerID, w.LastSeq, len(cmds))
	}
	return cmds
}

func testConcurrentHelloCreatesOneWorker(t *testing.T, e *env) {
	stores := e.racers(t, 4)
	ids := make([]string, 8)
	created := make([]bool, 8)
	err := race(8, func(i int) error {
		w, c, err := stores[i%len(stores)].Hello(bg, store.Hello{NewID: fmt.Sprintf("w%02d", i), Namespace: "default",
			MachineID: "m", Label: "l", Now: t0})
		ids[i], created[i] = w.ID, c
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range ids {
		if created[i] {
			n++
		}
		if ids[i] != ids[0] {
			t.Fatalf("one identity, several workers: %v", ids)
		}
	}
	if n != 1 {
		t.Fatalf("%d hellos created the worker", n)
	}
	if list, err := e.store(t).ListWorkers(bg, "default"); err != nil || len(list) != 1 {
		t.Fatalf("workers %+v %v", list, err)
	}
}

func testConcurrentEnqueueNumbersConsecutively(t *testing.T, e *env) {
	stores := e.racers(t, 4)
	w := hello(t, stores[0], "w1", "m", "l")
	const each = 10
	err := race(len(stores), func(i int) error {
		for j := range each {
			if _, err := stores[i].Enqueue(bg, store.NewCommand{ID: fmt.Sprintf("c%d-%d", i, j), WorkerID: w.ID, Kind: "reset_backoff", Now: t0}, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cmds := checkSeqs(t, stores[0], w.ID); len(cmds) != each*len(stores) {
		t.Fatalf("%d commands", len(cmds))
	}
}

func testConcurrentClaimsTakeEachInvocationOnce(t *testing.T, e *env) {
	stores := e.racers(t, 4)
	const invocations = 40
	var workers []string
	for i := range 4 {
		workers = append(workers, hello(t, stores[0], fmt.Sprintf("w%d", i), fmt.Sprintf("m%d", i), "l").ID)
	}
	for i := range invocations {
		newInvocation(t, stores[0], fmt.Sprintf("i%02d", i), "default", "", t0)
	}
	var (
		mu      sync.Mutex
		claimed = map[string]string{} // invocation -> worker
	)
	// Each worker claims through its own replica while another replica
	// enqueues on it: claims and enqueues share its sequence.
	err := race(2*len(workers), func(i int) error {
		wid := workers[i%len(workers)]
		s := stores[i%len(stores)]
		if i >= len(workers) {
			s = stores[(i+1)%len(stores)]
			for j := range 5 {
				if _, err := s.Enqueue(bg, store.NewCommand{ID: fmt.Sprintf("x-%s-%d", wid, j), WorkerID: wid, Kind: "reset_backoff", Now: t0}, nil); err != nil {
					return err
				}
			}
			return nil
		}
		n := 0
		for {
			got, err := s.ClaimInvocations(bg, store.Claim{WorkerID: wid, Limit: 3, Now: t0,
				NewID: func() string { n++; return fmt.Sprintf("run-%s-%d", wid, n) }})
			if err != nil {
				return err
			}
			if len(got) == 0 {
				return nil
			}
			mu.Lock()
			for _, inv := range got {
				if prev, ok := claimed[inv.ID]; ok {
					mu.Unlock()
					return fmt.Errorf("%s claimed by %s and %s", inv.ID, prev, wid)
				}
				claimed[inv.ID] = wid
			}
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != invocations {
		t.Fatalf("%d of %d invocations claimed", len(claimed), invocations)
	}
	runs := 0
	for _, wid := range workers {
		for _, c := range checkSeqs(t, stores[0], wid) {
			if c.Kind != store.KindRun {
				continue
			}
			runs++
		}
	}
	if runs != invocations {
		t.Fatalf("%d run commands for %d invocations", runs, invocations)
	}
	for id, wid := range claimed {
		inv, err := stores[0].Invocation(bg, "", id)
		if err != nil || inv.State != operatorapi.InvocationRunning || inv.WorkerID != wid {
			t.Fatalf("%s claimed by %s reads %+v %v", id, wid, inv, err)
		}
	}
}

func testConcurrentLegacyTakesDeliverOnce(t *testing.T, e *env) {
	stores := e.racers(t, 4)
	w := hello(t, stores[0], "w1", "m", "l")
	const total = 40
	for i := range total {
		enqueue(t, stores[0], w.ID, fmt.Sprintf("c%02d", i), "reset_backoff")
	}
	var (
		mu        sync.Mutex
		delivered = map[string]int{}
	)
	err := race(len(stores), func(i int) error {
		for {
			got, err := stores[i].Take(bg, w.ID, 0, 3, true, t0)
			if err != nil {
				return err
			}
			if len(got) == 0 {
				return nil
			}
			for j := 1; j < len(got); j++ {
				if got[j].Seq <= got[j-1].Seq {
					return fmt.Errorf("batch out of order: %v", ids(got))
				}
			}
			mu.Lock()
			for _, c := range got {
				delivered[c.ID]++
			}
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(delivered) != total {
		t.Fatalf("%d of %d commands delivered", len(delivered), total)
	}
	for id, n := range delivered {
		if n != 1 {
			t.Fatalf("%s delivered %d times without a cursor", id, n)
		}
	}
	if wk, _ := stores[0].Worker(bg, "", w.ID); wk.AckedSeq != total || wk.DeliveredSeq != total {
		t.Fatalf("delivered %d, acked %d", wk.DeliveredSeq, wk.AckedSeq)
	}
}

func testConcurrentCursorAcks(t *testing.T, e *env) {
	stores := e.racers(t, 3)
	w := hello(t, stores[0], "w1", "m", "l")
	const total = 30
	// One replica enqueues while two others serve polls of the daemon (an
	// abandoned poll and its successor, say), each acknowledging by cursor
	// what it was handed.
	err := race(3, func(i int) error {
		s := stores[i%len(stores)]
		if i == 0 {
			for j := range total {
				if _, err := s.Enqueue(bg, store.NewCommand{ID: fmt.Sprintf("c%02d", j), WorkerID: w.ID, Kind: "reset_backoff", Now: t0}, nil); err != nil {
					return err
				}
			}
			return nil
		}
		cursor := int64(0)
		for cursor < total {
			wk, err := s.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: &cursor, Now: t0})
			if err != nil {
				return err
			}
			if wk.AckedSeq < cursor {
				return fmt.Errorf("cursor %d acknowledged only through %d", cursor, wk.AckedSeq)
			}
			got, err := s.Take(bg, w.ID, max(cursor, wk.AckedSeq), 4, false, t0)
			if err != nil {
				return err
			}
			for _, c := range got {
				if c.Seq <= wk.AckedSeq {
					return fmt.Errorf("acknowledged command %s (seq %d <= %d) delivered again", c.ID, c.Seq, wk.AckedSeq)
				}
				cursor = max(cursor, c.Seq)
			}
			if len(got) == 0 {
				cursor = max(cursor, wk.AckedSeq)
			}
		}
		_, err := s.RecordPoll(bg, store.Poll{WorkerID: w.ID, Cursor: &cursor, Now: t0})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cmds := checkSeqs(t, stores[0], w.ID)
	for _, c := range cmds {
		if c.AckedAt == nil || c.DeliveredAt == nil {
			t.Fatalf("%s after every cursor: %+v", c.ID, c)
		}
	}
	if wk, _ := stores[0].Worker(bg, "", w.ID); wk.AckedSeq != total || wk.DeliveredSeq != total {
		t.Fatalf("delivered %d, acked %d", wk.DeliveredSeq, wk.AckedSeq)
	}
	if again, _ := stores[0].Take(bg, w.ID, 0, 100, false, t0); len(again) != 0 {
		t.Fatalf("acknowledged commands delivered again: %v", ids(again))
	}
}

func testCancelRacingDelivery(t *testing.T, e *env) {
	stores := e.racers(t, 2)
	w := hello(t, stores[0], "w1", "m", "l")
	const rounds = 20
	cancelledN := 0
	for r := range rounds {
		id := fmt.Sprintf("i%02d", r)
		newInvocation(t, stores[0], id, "default", "", t0)
		got := claimer(t, stores[0], w.ID, fmt.Sprintf("run%02d-", r), t0)(1)
		if len(got) != 1 {
			t.Fatalf("round %d: claimed %+v", r, got)
		}
		var (
			took      []store.Command
			cancelled bool
		)
		err := race(2, func(i int) error {
			var err error
			if i == 0 {
				took, err = stores[0].Take(bg, w.ID, 0, 10, true, t0)
			} else {
				_, cancelled, err = stores[1%len(stores)].CancelInvocation(bg, "default", id, nil, t0)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		delivered := slices.ContainsFunc(took, func(c store.Command) bool { return c.ID == got[0].CommandID })
		if cancelled == delivered {
			t.Fatalf("round %d: cancelled %v, delivered %v: exactly one must win", r, cancelled, delivered)
		}
		inv, err := stores[0].Invocation(bg, "", id)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: operatorapi.InvocationCancelled, false: operatorapi.InvocationRunning}[cancelled]; inv.State != want {
			t.Fatalf("round %d: %s, want %s", r, inv.State, want)
		}
		if cancelled {
			cancelledN++
		} else if _, applied, err := stores[0].FinishInvocation(bg, store.Finish{ID: id, State: operatorapi.InvocationSucceeded,
			From: []string{operatorapi.InvocationRunning}, Now: t0}); err != nil || !applied {
			t.Fatalf("round %d: finish: %v %v", r, applied, err)
		}
	}
	t.Logf("%d of %d cancels won the race", cancelledN, rounds)
}

func testConcurrentRotationsFromOneKey(t *testing.T, e *env) {
	stores := e.racers(t, 4)
	w := hello(t, stores[0], "w1", "m", "l")
	key := func(id string) store.Key {
		return store.Key{ID: id, WorkerID: w.ID, Namespace: "default", PublicKey: []byte(id), CreatedAt: t0}
	}
	if err := stores[0].AddKey(bg, key("k0")); err != nil {
		t.Fatal(err)
	}
	const n = 8
	errs := make([]error, n)
	_ = race(n, func(i int) error {
		errs[i] = stores[i%len(stores)].RotateKey(bg, "k0", key(fmt.Sprintf("r%d", i)))
		return nil
	})
	winner := ""
	for i, err := range errs {
		switch {
		case err == nil && winner != "":
			t.Fatalf("two rotations from k0 succeeded: %s and r%d", winner, i)
		case err == nil:
			winner = fmt.Sprintf("r%d", i)
		case !errors.Is(err, store.ErrKeyNotCurrent):
			t.Fatalf("rotation r%d: %v", i, err)
		}
	}
	if winner == "" {
		t.Fatal("no rotation succeeded")
	}
	if k, err := stores[0].Key(bg, "k0"); err != nil || k.ReplacedBy != winner {
		t.Fatalf("k0 after the race: %+v %v", k, err)
	}
	if k, err := stores[0].CurrentKey(bg, w.ID); err != nil || k.ID != winner {
		t.Fatalf("current after the race: %+v %v", k, err)
	}

	// Enrollments racing for one worker leave exactly one current key.
	_ = race(n, func(i int) error {
		errs[i] = stores[i%len(stores)].AddKey(bg, key(fmt.Sprintf("a%d", i)))
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ks, err := stores[0].WorkerKeys(bg, w.ID)
	if err != nil {
		t.Fatal(err)
	}
	current := 0
	for _, k := range ks {
		if k.RevokedAt == nil {
			current++
		}
	}
	if len(ks) != n+2 || current != 1 {
		t.Fatalf("%d keys, %d current: %+v", len(ks), current, ks)
	}
}
