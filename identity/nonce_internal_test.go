package identity

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// at is a verifier clock reading n seconds after an arbitrary instant.
func at(n int64) time.Time { return time.Unix(1_700_000_000+n, 0) }

const base = 1_700_000_000

func windows(perKey, maxKeys, capacity int, durable bool) *nonceWindows {
	return newNonceWindows(perKey, maxKeys, capacity, 300, durable, 0, 0)
}

func TestNonceWindowExpires(t *testing.T) {
	c := windows(100, 10, 1000, false)
	for i := range int64(10) {
		if err := c.remember("k", fmt.Sprint(i), base+i, at(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, n, _ := c.stats(); n != 10 {
		t.Fatalf("%d pairs", n)
	}
	// At now+305 the pairs stamped +0..+4 can no longer pass the skew
	// check; the next insert for the key drops them.
	if err := c.remember("k", "new", base+305, at(305)); err != nil {
		t.Fatal(err)
	}
	if _, n, _ := c.stats(); n != 6 {
		t.Fatalf("%d pairs after expiry, want 6", n)
	}
	if err := c.remember("k", "9", base+9, at(305)); !errors.Is(err, ErrReplay) {
		t.Fatalf("unexpired nonce: %v", err)
	}
}

func TestNonceWindowsAreScopedByKey(t *testing.T) {
	c := windows(100, 10, 1000, false)
	if err := c.remember("a", "n", base, at(0)); err != nil {
		t.Fatal(err)
	}
	if err := c.remember("b", "n", base, at(0)); err != nil {
		t.Fatalf("same nonce, other key: %v", err)
	}
	if err := c.remember("a", "n", base, at(0)); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay: %v", err)
	}
}

// A full window drops its own oldest pair, and only its own key pays for
// it: without a ledger that key refuses what is at or before the dropped
// timestamp; every other key is untouched.
func TestFullKeyWindowNarrowsOnlyItsOwnKey(t *testing.T) {
	c := windows(3, 10, 1000, false)
	if err := c.remember("victim", "v1", base, at(0)); err != nil {
		t.Fatal(err)
	}
	for i := range int64(50) {
		if err := c.remember("flood", fmt.Sprint(i), base+100+i, at(0)); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if _, _, largest := c.stats(); largest > 3 {
			t.Fatalf("a window holds %d pairs, over 3", largest)
		}
	}
	// Everything at or before the newest dropped timestamp (+146) is
	// refused for the flooding key.
	if err := c.remember("flood", "late", base+146, at(0)); !errors.Is(err, ErrReplay) {
		t.Fatalf("at the floor: %v", err)
	}
	if err := c.remember("flood", "fresh", base+147, at(0)); err != nil {
		t.Fatalf("above the floor: %v", err)
	}
	// The victim's window is intact: its replay is still caught, and its
	// new requests, stamped now, go through.
	if err := c.remember("victim", "v1", base, at(0)); !errors.Is(err, ErrReplay) {
		t.Fatalf("victim's replay: %v", err)
	}
	if err := c.remember("victim", "v2", base, at(0)); err != nil {
		t.Fatalf("victim's next request: %v", err)
	}
}

// With a durable ledger behind the cache a full window just forgets: the
// ledger refuses the replay of what was dropped, so no floor is needed.
func TestFullKeyWindowWithLedgerKeepsNoFloor(t *testing.T) {
	c := windows(3, 10, 1000, true)
	for i := range int64(10) {
		if err := c.remember("k", fmt.Sprint(i), base+290, at(0)); err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
	}
	if err := c.remember("k", "now", base, at(0)); err != nil {
		t.Fatalf("a request stamped now after the flood: %v", err)
	}
	if _, n, largest := c.stats(); n != 3 || largest != 3 {
		t.Fatalf("%d pairs, largest window %d; want 3, 3", n, largest)
	}
}

func TestWindowCountIsBounded(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprint("durable=", durable), func(t *testing.T) {
			c := windows(100, 4, 1000, durable)
			for i := range 20 {
				if err := c.remember(fmt.Sprint("k", i), "n", base+int64(i), at(0)); err != nil {
					t.Fatalf("key %d: %v", i, err)
				}
				if w, _, _ := c.stats(); w > 4 {
					t.Fatalf("%d windows, over 4", w)
				}
			}
			// The newest keys kept their windows.
			if err := c.remember("k19", "n", base+19, at(0)); !errors.Is(err, ErrReplay) {
				t.Fatalf("replay to a kept window: %v", err)
			}
			// A dropped window's key: without a ledger it cannot be vouched
			// for at or before the newest timestamp a dropped window held
			// (+15); with one, the ledger does that.
			err := c.remember("k0", "n", base, at(0))
			if durable && err != nil {
				t.Fatalf("with a ledger: %v", err)
			}
			if !durable && !errors.Is(err, ErrReplay) {
				t.Fatalf("replay to a dropped window without a ledger: %v", err)
			}
			if err := c.remember("k0", "later", base+100, at(0)); err != nil {
				t.Fatalf("after the forgotten floor: %v", err)
			}
		})
	}
}

func TestTotalPairsAreBounded(t *testing.T) {
	c := windows(10, 100, 25, true)
	for k := range 10 {
		for i := range 10 {
			if err := c.remember(fmt.Sprint("k", k), fmt.Sprint(i), base, at(0)); err != nil {
				t.Fatal(err)
			}
			if _, n, _ := c.stats(); n > 25 {
				t.Fatalf("%d pairs, over 25", n)
			}
		}
	}
	// The least recently used windows went, not the one being written.
	if err := c.remember("k9", "0", base, at(0)); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay to the busiest window: %v", err)
	}
}

// Windows whose every pair has expired are dropped as the cache goes, so
// keys heard once do not pile up.
func TestStaleWindowsAreDropped(t *testing.T) {
	c := windows(100, 1000, 1000, false)
	for i := range 50 {
		if err := c.remember(fmt.Sprint("k", i), "n", base, at(0)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		if err := c.remember("busy", fmt.Sprint(i), base+400, at(400)); err != nil {
			t.Fatal(err)
		}
	}
	if w, n, _ := c.stats(); w != 1 || n != 30 {
		t.Fatalf("%d windows, %d pairs; want only the busy key's 30", w, n)
	}
	// Forgetting them let no replay through: their timestamps fail the
	// skew check now, and the floor stayed where it was.
	if err := c.remember("k0", "m", base+400, at(400)); err != nil {
		t.Fatalf("a dropped key's next request: %v", err)
	}
}

func TestKeyRateThrottlesOneKey(t *testing.T) {
	c := newNonceWindows(1000, 100, 10_000, 300, true, 2, 5)
	now := at(0)
	for i := range 5 {
		if err := c.remember("flood", fmt.Sprint(i), base, now); err != nil {
			t.Fatalf("within the burst, %d: %v", i, err)
		}
	}
	err := c.remember("flood", "over", base, now)
	var te *ThrottledError
	if !errors.As(err, &te) || !errors.Is(err, ErrThrottled) || errors.Is(err, ErrUnauthenticated) || te.RetryAfter != time.Second || te.KeyID != "flood" {
		t.Fatalf("past the burst: %v (%+v)", err, te)
	}
	// The throttled nonce was not spent.
	if err := c.remember("flood", "over", base, now.Add(500*time.Millisecond)); err != nil {
		t.Fatalf("the same nonce once a token is back: %v", err)
	}
	// Another key has a bucket of its own.
	for i := range 5 {
		if err := c.remember("other", fmt.Sprint(i), base, now); err != nil {
			t.Fatalf("another key, %d: %v", i, err)
		}
	}
	// A replay costs no token, so replaying a key's captured requests
	// cannot throttle it...
	for range 100 {
		if err := c.remember("slow", "captured", base, now); err != nil && !errors.Is(err, ErrReplay) {
			t.Fatal(err)
		}
	}
	// ...nor can one the ledger refuses, once refunded.
	for i := range 100 {
		if err := c.remember("slow", fmt.Sprint("x", i), base, now); err != nil {
			t.Fatalf("ledger-refused replay %d: %v", i, err)
		}
		c.refund("slow")
	}
	if err := c.remember("slow", "genuine", base, now); err != nil {
		t.Fatalf("the key after its replays: %v", err)
	}
	// Spend the rest: an empty bucket refilled at 2 a second holds one
	// request again within a second.
	for i := range 4 {
		_ = c.remember("slow", fmt.Sprint("y", i), base, now)
	}
	if err := c.remember("slow", "z", base, now); !errors.As(err, &te) || te.RetryAfter != time.Second {
		t.Fatalf("an empty bucket: %v", err)
	}
}

// floodKeys are the enrolled keys for the flood test's verifier.
type floodKeys map[string]ed25519.PublicKey

func (f floodKeys) LookupKey(_ context.Context, id string) (ed25519.PublicKey, bool, error) {
	if pub, ok := f[id]; ok {
		return pub, false, nil
	}
	return nil, false, ErrUnknownKey
}

// signedAt returns a poll signed by k at ts.
func signedAt(k *Key, ts time.Time) (*http.Request, error) {
	req := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/v1/daemon/poll"}, Header: http.Header{}}
	return req, k.SignRequest(req, nil, ts)
}

func mustSignAt(t testing.TB, k *Key, ts time.Time) *http.Request {
	t.Helper()
	req, err := signedAt(k, ts)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// The flood of issue 11: 100,100 validly signed requests from one key, all
// stamped 290 s ahead, used to evict every other key's nonces from the
// one shared cache of 100,000, whose floor then refused them all. Now the
// flood fills only its own key's window, and the bounds hold throughout.
// Under the race detector, where Ed25519 is ten times slower, the flood
// and the bounds are a tenth as large: the same proportions.
func TestFloodFromOneKeyLeavesOtherKeysAlone(t *testing.T) {
	total, perKey, capacity := 100_100, DefaultKeyWindow, DefaultNonceCapacity
	if raceDetector {
		total, perKey, capacity = 10_010, DefaultKeyWindow/10, 10_000
	}
	flood, victim := mustSeedKey(t, 1), mustSeedKey(t, 2)
	v := NewVerifier(floodKeys{flood.ID(): flood.PublicKey(), victim.ID(): victim.PublicKey()},
		WithKeyWindow(perKey), WithNonceCapacity(capacity))
	now := at(0)
	ctx := context.Background()
	before := mustSignAt(t, victim, now)
	if _, err := v.Verify(ctx, before, nil, now); err != nil {
		t.Fatal(err)
	}

	var next, accepted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, runtime.GOMAXPROCS(0))
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				req, err := signedAt(flood, now.Add(290*time.Second))
				if err == nil {
					_, err = v.Verify(ctx, req, nil, now)
				}
				switch {
				case err == nil:
					accepted.Add(1)
				case !errors.Is(err, ErrReplay):
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("flood: %v", err)
	}
	windows, entries, largest := v.nonces.stats()
	t.Logf("flood: %d of %d accepted; %d windows, %d pairs, largest %d", accepted.Load(), total, windows, entries, largest)
	if accepted.Load() < int64(perKey) || largest > perKey || entries > perKey+1 || windows != 2 {
		t.Fatalf("bounds: %d accepted, %d windows, %d pairs, largest %d (window %d)", accepted.Load(), windows, entries, largest, perKey)
	}
	// The other key's next request, stamped now, is accepted, and its
	// earlier one is still known.
	if _, err := v.Verify(ctx, mustSignAt(t, victim, now), nil, now); err != nil {
		t.Fatalf("the other key after the flood: %v", err)
	}
	if _, err := v.Verify(ctx, before, nil, now); !errors.Is(err, ErrReplay) {
		t.Fatalf("the other key's earlier request replayed: %v", err)
	}
}

func mustSeedKey(t testing.TB, b byte) *Key {
	k, err := NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func FuzzParseKeyFile(f *testing.F) {
	k, err := NewKeyFromSeed(make([]byte, 32))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(k.marshal())
	f.Add([]byte("-----BEGIN NYMPH ED25519 PRIVATE KEY-----\n\n-----END NYMPH ED25519 PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := parseKeyFile(data)
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		again, err := parseKeyFile(got.marshal())
		if err != nil || again.ID() != got.ID() {
			t.Fatalf("round trip: %v", err)
		}
	})
}
