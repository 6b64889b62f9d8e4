package identity

import (
	"container/heap"
	"fmt"
	"sync"
)

// nonceCache remembers (key id, nonce) pairs until their timestamp can no
// longer pass the skew check. See Verifier for the eviction rule.
type nonceCache struct {
	mu       sync.Mutex
	capacity int
	window   int64
	seen     map[string]struct{}
	byTS     nonceHeap
	// floor: timestamps at or below it are refused, because an entry that
	// old was evicted and its replay could no longer be recognised.
	floor    int64
	hasFloor bool
}

func newNonceCache(capacity int, window int64) *nonceCache {
	return &nonceCache{capacity: capacity, window: window, seen: make(map[string]struct{})}
}

// remember records the nonce, or returns ErrReplay if it cannot prove the
// pair is new. now is the verifier's clock in unix seconds.
func (c *nonceCache) remember(keyID, nonce string, ts, now int64) error {
	key := keyID + "\n" + nonce
	c.mu.Lock()
	defer c.mu.Unlock()
	// An entry stamped before now-window fails the skew check on replay, so
	// it is no longer needed.
	for len(c.byTS) > 0 && c.byTS[0].ts < now-c.window {
		e := heap.Pop(&c.byTS).(nonceEntry)
		delete(c.seen, e.key)
	}
	if c.hasFloor && ts <= c.floor {
		return fmt.Errorf("timestamp %d is at or before %d, the oldest the full replay cache can vouch for: %w", ts, c.floor, ErrReplay)
	}
	if _, dup := c.seen[key]; dup {
		return fmt.Errorf("nonce %q already used: %w", nonce, ErrReplay)
	}
	for len(c.byTS) >= c.capacity {
		e := heap.Pop(&c.byTS).(nonceEntry)
		delete(c.seen, e.key)
		if !c.hasFloor || e.ts > c.floor {
			c.floor, c.hasFloor = e.ts, true
		}
	}
	c.seen[key] = struct{}{}
	heap.Push(&c.byTS, nonceEntry{ts: ts, key: key})
	return nil
}

func (c *nonceCache) size() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

type nonceEntry struct {
	ts  int64
	key string
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
