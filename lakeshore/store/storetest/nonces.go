package storetest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

func use(key, nonce string, expires time.Time) store.NonceUse {
	return store.NonceUse{KeyID: key, Nonce: nonce, Expires: expires}
}

// mustUse records uses and checks which were new.
func mustUse(t *testing.T, s store.Store, uses []store.NonceUse, want ...bool) {
	t.Helper()
	fresh, err := s.UseNonces(bg, uses)
	if err != nil {
		t.Fatalf("use nonces: %v", err)
	}
	if fmt.Sprint(fresh) != fmt.Sprint(want) {
		t.Fatalf("fresh %v, want %v", fresh, want)
	}
}

func testNoncesAreUsedOnce(t *testing.T, e *env) {
	db := e.store(t)
	exp := t0.Add(5 * time.Minute)
	mustUse(t, db, nil)
	// In one batch: a pair listed twice is new once; another key may use
	// the same nonce.
	mustUse(t, db, []store.NonceUse{use("k1", "n1", exp), use("k1", "n1", exp), use("k2", "n1", exp)}, true, false, true)
	mustUse(t, db, []store.NonceUse{use("k1", "n1", exp)}, false)
	// Another store on the same database sees it (a second replica), and
	// so does the database reopened (a restart).
	mustUse(t, e.open(t), []store.NonceUse{use("k1", "n1", exp)}, false)
	db = e.reopen(t)
	mustUse(t, db, []store.NonceUse{use("k2", "n1", exp), use("k3", "n1", exp)}, false, true)

	// A batch larger than one statement, old and new pairs mixed, each
	// answered at its place.
	var big []store.NonceUse
	var want []bool
	for i := range 1000 {
		if i%7 == 0 {
			big = append(big, use("k1", "n1", exp))
			want = append(want, false)
			continue
		}
		big = append(big, use(fmt.Sprint("bulk-", i%3), fmt.Sprint("n", i), exp))
		want = append(want, true)
	}
	mustUse(t, db, big, want...)
	mustUse(t, db, big[1:3], false, false)

	// Purged: what expired by now, not what is still live.
	late := exp.Add(time.Second)
	mustUse(t, db, []store.NonceUse{use("k9", "live", late.Add(time.Hour))}, true)
	n, err := db.PurgeNonces(bg, late)
	if err != nil {
		t.Fatal(err)
	}
	expired := int64(3) // k1, k2 and k3's n1
	for _, w := range want {
		if w {
			expired++
		}
	}
	if n != expired {
		t.Fatalf("purged %d pairs, want %d", n, expired)
	}
	mustUse(t, db, []store.NonceUse{use("k9", "live", late.Add(time.Hour)), use("k1", "n1", late.Add(time.Hour))}, false, true)
	if n, err := db.PurgeNonces(bg, late); err != nil || n != 0 {
		t.Fatalf("purge again: %d %v", n, err)
	}
}

// Batches racing on as many replicas as the backend has, overlapping and
// each in its own order: every pair is new to exactly one of them.
func testConcurrentNonceBatches(t *testing.T, e *env) {
	const racers, pairs, batch, rounds = 8, 200, 64, 4
	exp := t0.Add(5 * time.Minute)
	stores := e.racers(t, racers)
	wins := make([]int, pairs)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for r := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for range rounds {
				idx := rng.Perm(pairs)[:batch]
				uses := make([]store.NonceUse, batch)
				for j, i := range idx {
					uses[j] = use(fmt.Sprint("key-", i%5), fmt.Sprint("nonce-", i), exp)
				}
				fresh, err := stores[r].UseNonces(bg, uses)
				if err != nil {
					t.Errorf("racer %d: %v", r, err)
					return
				}
				mu.Lock()
				for j, i := range idx {
					if fresh[j] {
						wins[i]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Pairs no racer drew are recorded now; each drawn one was won once.
	var all []store.NonceUse
	var drawn []bool
	for i := range pairs {
		all = append(all, use(fmt.Sprint("key-", i%5), fmt.Sprint("nonce-", i), exp))
		drawn = append(drawn, wins[i] > 0)
		if wins[i] > 1 {
			t.Errorf("pair %d was new to %d racers", i, wins[i])
		}
	}
	fresh, err := e.store(t).UseNonces(bg, all)
	if err != nil {
		t.Fatal(err)
	}
	for i := range fresh {
		if fresh[i] == drawn[i] {
			t.Errorf("pair %d: won %d times, new afterwards %v", i, wins[i], fresh[i])
		}
	}
}
