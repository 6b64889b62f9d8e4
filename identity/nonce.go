package identity

import (
	"container/heap"
	"container/list"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// ErrThrottled matches (errors.Is) a *ThrottledError. It does not match
// ErrUnauthenticated: the request is genuine, its key is only sending too
// fast, and a server answers 429 rather than 401.
var ErrThrottled = errors.New("identity: key throttled")

// ThrottledError refuses a validly signed request whose key has used up its
// rate (WithKeyRate). The nonce is not recorded, so the request is not
// spent: the daemon signs its retry afresh anyway.
type ThrottledError struct {
	KeyID string
	// RetryAfter is when the key may send again: the time its bucket takes
	// to hold one request, rounded up to whole seconds (at least one).
	RetryAfter time.Duration
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("identity: key %q sends faster than its limit; retry in %v", e.KeyID, e.RetryAfter)
}

// Is makes a ThrottledError match ErrThrottled.
func (e *ThrottledError) Is(target error) bool { return target == ErrThrottled }

// nonceWindows is the replay cache and the per-key throttle: one window per
// key id, each remembering that key's (nonce, timestamp) pairs until the
// timestamp can no longer pass the skew check, and holding that key's token
// bucket. Only requests whose signature verified reach it, so only keys that
// are enrolled (or being enrolled, with a valid one-shot token) have windows.
//
// Bounds, so that no key's traffic can displace another's:
//   - a window holds at most perKey pairs; a full one drops its own oldest
//     pair (with no ledger behind the cache, that key then refuses every
//     timestamp at or before the dropped one: its accepted window narrows
//     from the past, nobody else's does);
//   - at most maxKeys windows and capacity pairs in all are kept. Past
//     either, whole windows go, least recently used first: windows whose
//     pairs have all expired are dropped for free as the cache goes, and a
//     live one only when a great many keys are busy at once. A flooding key
//     is the most recently used, so it is the last to go.
//
// With a durable ledger (every accepted nonce is recorded there before the
// request is acted on), a dropped pair or window is only a lost shortcut:
// the ledger still refuses its replay. Without one, a live window that is
// dropped leaves a floor for keys that have no window: timestamps at or
// before its newest are refused until they leave the skew window.
type nonceWindows struct {
	mu       sync.Mutex
	perKey   int
	maxKeys  int
	capacity int
	skew     int64
	durable  bool
	// rate (requests a second) and burst make each key's token bucket;
	// rate 0 throttles nothing.
	rate, burst float64

	keys    map[string]*keyWindow
	lru     list.List // of *keyWindow, most recently used first
	entries int
	// forgotten is the floor a new window starts with (no ledger only).
	forgotten    int64
	hasForgotten bool
}

// keyWindow is one key's share of nonceWindows.
type keyWindow struct {
	id   string
	seen map[string]struct{}
	byTS nonceHeap
	// floor: timestamps at or below it are refused, because one that old
	// was dropped from this window and its replay could not be recognised.
	floor    int64
	hasFloor bool
	// newest is the newest timestamp ever held: once it has expired, so
	// has everything the window remembers.
	newest int64
	// tokens is the bucket's content at filled.
	tokens float64
	filled time.Time
	elem   *list.Element
}

func newNonceWindows(perKey, maxKeys, capacity int, skew int64, durable bool, rate float64, burst int) *nonceWindows {
	c := &nonceWindows{
		perKey: min(perKey, capacity), maxKeys: maxKeys, capacity: capacity, skew: skew, durable: durable,
		keys: make(map[string]*keyWindow),
	}
	if rate > 0 && !math.IsInf(rate, 1) && burst >= 1 {
		c.rate, c.burst = rate, float64(burst)
	}
	c.lru.Init()
	return c
}

// remember records the nonce, or returns ErrReplay if it cannot prove the
// pair is new, or a *ThrottledError if the key has used up its rate. A
// refused replay costs the key no token. now is the verifier's clock.
func (c *nonceWindows) remember(keyID, nonce string, ts int64, now time.Time) error {
	nowS := now.Unix()
	oldest := nowS - c.skew // a timestamp before this fails the skew check
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropStale(now, oldest)
	w := c.keys[keyID]
	if w == nil {
		w = c.newWindow(keyID, now, oldest)
	} else {
		c.lru.MoveToFront(w.elem)
	}
	c.expire(w, oldest)
	if w.hasFloor && ts <= w.floor {
		return fmt.Errorf("timestamp %d is at or before %d, the oldest this key's full replay window can vouch for: %w", ts, w.floor, ErrReplay)
	}
	if _, dup := w.seen[nonce]; dup {
		return fmt.Errorf("nonce %q already used: %w", nonce, ErrReplay)
	}
	if err := c.take(w, now); err != nil {
		return err
	}
	for len(w.byTS) >= c.perKey {
		c.dropOldest(w)
	}
	for c.entries >= c.capacity {
		if b := c.lru.Back().Value.(*keyWindow); b != w {
			c.dropWindow(b, oldest)
		} else {
			c.dropOldest(w) // w is the only window
		}
	}
	w.seen[nonce] = struct{}{}
	heap.Push(&w.byTS, nonceEntry{ts: ts, nonce: nonce})
	c.entries++
	w.newest = max(w.newest, ts)
	return nil
}

// refund gives back the token of a request the ledger then refused as a
// replay, so that replaying a key's captured requests cannot throttle it.
func (c *nonceWindows) refund(keyID string) {
	if c.rate == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if w := c.keys[keyID]; w != nil {
		w.tokens = min(w.tokens+1, c.burst)
	}
}

// take spends one of w's tokens, refilled at rate since the last time.
func (c *nonceWindows) take(w *keyWindow, now time.Time) error {
	if c.rate == 0 {
		return nil
	}
	c.refill(w, now)
	if w.tokens < 1 {
		secs := max(math.Ceil((1-w.tokens)/c.rate), 1)
		return &ThrottledError{KeyID: w.id, RetryAfter: time.Duration(secs) * time.Second}
	}
	w.tokens--
	return nil
}

func (c *nonceWindows) refill(w *keyWindow, now time.Time) {
	if d := now.Sub(w.filled); d > 0 {
		w.tokens = min(c.burst, w.tokens+d.Seconds()*c.rate)
		w.filled = now
	}
}

// newWindow makes w's window, making room under maxKeys first.
func (c *nonceWindows) newWindow(keyID string, now time.Time, oldest int64) *keyWindow {
	for len(c.keys) >= c.maxKeys {
		c.dropWindow(c.lru.Back().Value.(*keyWindow), oldest)
	}
	w := &keyWindow{id: keyID, seen: make(map[string]struct{}), tokens: c.burst, filled: now, newest: math.MinInt64}
	if c.hasForgotten && c.forgotten >= oldest {
		w.floor, w.hasFloor = c.forgotten, true
	}
	w.elem = c.lru.PushFront(w)
	c.keys[keyID] = w
	return w
}

// dropStale drops up to two least recently used windows that remember
// nothing live and whose bucket is full again: forgetting them changes
// nothing. Two per call outpaces the one window a call can add.
func (c *nonceWindows) dropStale(now time.Time, oldest int64) {
	for range 2 {
		e := c.lru.Back()
		if e == nil {
			return
		}
		w := e.Value.(*keyWindow)
		if w.newest >= oldest || (w.hasFloor && w.floor >= oldest) {
			return
		}
		if c.rate > 0 {
			c.refill(w, now)
			if w.tokens < c.burst {
				return
			}
		}
		c.dropWindow(w, oldest)
	}
}

// dropWindow forgets w. Without a ledger, what it still held becomes the
// floor of windows made from now on.
func (c *nonceWindows) dropWindow(w *keyWindow, oldest int64) {
	if !c.durable {
		live := w.newest
		if w.hasFloor {
			live = max(live, w.floor)
		}
		if live >= oldest && (!c.hasForgotten || live > c.forgotten) {
			c.forgotten, c.hasForgotten = live, true
		}
	}
	c.entries -= len(w.byTS)
	c.lru.Remove(w.elem)
	delete(c.keys, w.id)
}

// dropOldest drops w's oldest pair to make room; without a ledger, w
// refuses that timestamp from now on.
func (c *nonceWindows) dropOldest(w *keyWindow) {
	e := heap.Pop(&w.byTS).(nonceEntry)
	delete(w.seen, e.nonce)
	c.entries--
	if !c.durable && (!w.hasFloor || e.ts > w.floor) {
		w.floor, w.hasFloor = e.ts, true
	}
}

// expire drops w's pairs stamped before oldest: their replays fail the
// skew check.
func (c *nonceWindows) expire(w *keyWindow, oldest int64) {
	for len(w.byTS) > 0 && w.byTS[0].ts < oldest {
		e := heap.Pop(&w.byTS).(nonceEntry)
		delete(w.seen, e.nonce)
		c.entries--
	}
}

// stats reports the windows held, the pairs in all, and the most one
// window holds, for tests of the bounds.
func (c *nonceWindows) stats() (windows, entries, largest int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.keys {
		largest = max(largest, len(w.byTS))
	}
	return len(c.keys), c.entries, largest
}

type nonceEntry struct {
	ts    int64
	nonce string
}

// nonceHeap is a min-heap on timestamp.
type nonceHeap []nonceEntry

func (h nonceHeap) Len() int           { return len(h) }
func (h nonceHeap) Less(i, j int) bool { return h[i].ts < h[j].ts }
func (h nonceHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nonceHeap) Push(x any)        { *h = append(*h, x.(nonceEntry)) }
func (h *nonceHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nonceEntry{}
	*h = old[:len(old)-1]
	return e
}
