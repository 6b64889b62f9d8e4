package controlplane

import (
	"strings"
	"sync"
	"sync/atomic"

	"nymph/lakeshore/store"
)

// Caches of the rows every daemon request reads: its token, its signing
// key, whether its worker has a key (which turns bearers away), and its
// namespace's target version. An idle fleet of 10,000 daemons sends ~500
// polls a second; read through, each would cost the store three or four
// reads.
//
// A row is cached once read and dropped when it changes: here at once by
// the route that changes it, on the other replicas when that route's
// announcement reaches them through the Notifier (the same LISTEN that
// wakes their long-polls, milliseconds behind), so a revoked token or key
// is refused on every replica well within a second. While a replica is
// not listening (before its first Listen, after a failed one) it can miss
// announcements, so its caches are off (every request reads the store)
// until it listens again, and then start empty.
//
// Announcement keys: "t:<token id>", "k:<worker id>" (a key of the worker
// changed: added, rotated, revoked, moved to or from it), "v:<namespace>"
// (its target version).
const maxCached = 1 << 18

type caches struct {
	// live: announcements reach this process (always, for a lone
	// control plane).
	live atomic.Bool

	mu sync.Mutex
	// epoch counts the drops: a row read from the store is cached only if
	// no drop of that row came between the read and the put (the row may
	// have changed after it was read). dropped holds the epoch of each
	// row's last drop, by announcement key; floor is the epoch of the
	// last drop of everything (clear, or dropped grown too large). Drops
	// of other rows do not stop a put: while a fleet boots, every hello
	// drops its own worker's keys, and one shared epoch left no key or
	// token read of the whole fleet cached.
	epoch   uint64
	floor   uint64
	dropped map[string]uint64
	// tokens by hash of their secret, tokenHash from id to hash.
	tokens    map[string]store.Token
	tokenHash map[string]string
	// keys by id; workerKeys indexes them by worker.
	keys       map[string]store.Key
	workerKeys map[string][]string
	// hasKey: whether the worker has a current key.
	hasKey map[string]bool
	// target versions by namespace (nil: none set).
	target map[string]*string
}

func newCaches(live bool) *caches {
	c := &caches{}
	c.clear()
	c.live.Store(live)
	return c
}

// mark returns the epoch to hand to a put of a row about to be read.
func (c *caches) mark() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// fresh reports, with c.mu held, whether a row read at epoch may be
// cached: nothing dropped it, or everything, since.
func (c *caches) fresh(epoch uint64, key string) bool {
	return c.live.Load() && epoch >= c.floor && c.dropped[key] <= epoch
}

// drop records, with c.mu held, a drop of the row under key.
func (c *caches) drop(key string) {
	c.epoch++
	if len(c.dropped) >= maxCached {
		c.dropped, c.floor = map[string]uint64{}, c.epoch
	}
	c.dropped[key] = c.epoch
}

func (c *caches) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.floor = c.epoch
	c.dropped = map[string]uint64{}
	c.tokens = map[string]store.Token{}
	c.tokenHash = map[string]string{}
	c.keys = map[string]store.Key{}
	c.workerKeys = map[string][]string{}
	c.hasKey = map[string]bool{}
	c.target = map[string]*string{}
}

// setLive turns the caches on or off; either way they start empty.
func (c *caches) setLive(live bool) {
	c.live.Store(live)
	c.clear()
}

func (c *caches) token(hash string) (store.Token, bool) {
	if !c.live.Load() {
		return store.Token{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.tokens[hash]
	return t, ok
}

// putToken caches a daemon token that is bound to a worker or a fleet's,
// not revoked. An unbound token is not cached: a hello on any replica may
// bind it.
func (c *caches) putToken(t store.Token, epoch uint64) {
	if t.RevokedAt != nil || t.Kind != store.TokenDaemon || (t.WorkerID == "" && !t.Fleet) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh(epoch, tokenAnnouncement(t.ID)) {
		return
	}
	if len(c.tokens) >= maxCached {
		c.tokens, c.tokenHash = map[string]store.Token{}, map[string]string{}
	}
	c.tokens[t.Hash] = t
	c.tokenHash[t.ID] = t.Hash
}

func (c *caches) dropToken(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(tokenAnnouncement(id))
	if h, ok := c.tokenHash[id]; ok {
		delete(c.tokens, h)
		delete(c.tokenHash, id)
	}
}

func (c *caches) key(id string) (store.Key, bool) {
	if !c.live.Load() {
		return store.Key{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[id]
	return k, ok
}

func (c *caches) putKey(k store.Key, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh(epoch, keysAnnouncement(k.WorkerID)) {
		return
	}
	if len(c.keys) >= maxCached {
		c.keys, c.workerKeys = map[string]store.Key{}, map[string][]string{}
	}
	if _, ok := c.keys[k.ID]; !ok {
		c.workerKeys[k.WorkerID] = append(c.workerKeys[k.WorkerID], k.ID)
	}
	c.keys[k.ID] = k
}

// workerHasKey reports, when known, whether the worker has a current key.
func (c *caches) workerHasKey(workerID string) (has, known bool) {
	if !c.live.Load() {
		return false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	has, known = c.hasKey[workerID]
	return has, known
}

func (c *caches) putWorkerHasKey(workerID string, has bool, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh(epoch, keysAnnouncement(workerID)) {
		return
	}
	if len(c.hasKey) >= maxCached {
		c.hasKey = map[string]bool{}
	}
	c.hasKey[workerID] = has
}

// dropWorkerKeys forgets every key of the worker, and whether it has one.
func (c *caches) dropWorkerKeys(workerID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(keysAnnouncement(workerID))
	for _, id := range c.workerKeys[workerID] {
		delete(c.keys, id)
	}
	delete(c.workerKeys, workerID)
	delete(c.hasKey, workerID)
}

func (c *caches) targetVersion(ns string) (*string, bool) {
	if !c.live.Load() {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.target[ns]
	return v, ok
}

func (c *caches) putTargetVersion(ns string, v *string, epoch uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh(epoch, targetAnnouncement(ns)) {
		return
	}
	if len(c.target) >= maxCached {
		c.target = map[string]*string{}
	}
	c.target[ns] = v
}

func (c *caches) dropTargetVersion(ns string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(targetAnnouncement(ns))
	delete(c.target, ns)
}

// apply acts on an announcement, or on a wake-up key ("w:<worker>": the
// worker's memo), wherever it comes from; "" means anything may have
// changed.
func (s *Server) apply(key string) {
	kind, id, _ := strings.Cut(key, ":")
	switch kind {
	case "":
		s.caches.clear()
		s.presence.invalidateAll()
	case "w":
		// Whatever changed the worker may have changed its keys too
		// (a hello enrolls, a removal takes them away).
		s.presence.invalidate(id)
		s.caches.dropWorkerKeys(id)
	case "q":
		s.presence.queued(id)
	case "c":
		s.presence.claimable(id)
	case "t":
		s.caches.dropToken(id)
	case "k":
		s.caches.dropWorkerKeys(id)
	case "v":
		s.caches.dropTargetVersion(id)
	}
}

// announce drops what changed from this process's caches and tells the
// other replicas to drop it from theirs. Call it after the change is
// committed.
func (s *Server) announce(key string) {
	s.apply(key)
	s.wake.publishOnly(key)
}

// changed says a worker's row changed, here and on the other replicas:
// its memo and cached keys go. Its parked poll here is not woken: it
// finds the change at its next look, and a poll of a daemon process that
// just said hello again may be the old process's, whose answer nobody
// reads.
func (s *Server) changed(workerID string) {
	s.announce(workerKey(workerID))
}

// forget says a worker's row is gone: its parked poll answers at once
// (404: the daemon says hello again).
func (s *Server) forget(workerID string) {
	s.apply(workerKey(workerID))
	s.presence.drop(workerID)
	s.wake.broadcast(workerKey(workerID))
}

// due says, here and on the other replicas, that the worker has work:
// a command queued for it (queued) or an invocation it may now claim
// (claim). Its memo holds but for that, and its parked poll wakes. The
// other replicas hear the narrow "q:"/"c:" key, not the worker's "w:",
// which would throw their whole memo of it away and cost the woken poll a
// full look.
func (s *Server) due(workerID string, claim bool) {
	if !claim {
		s.presence.queued(workerID)
		s.announceQueued(workerID)
		return
	}
	s.presence.claimable(workerID)
	s.wake.deliver(workerKey(workerID))
	s.wake.publishOnly("c:" + workerID)
}

// announceQueued is due's wake for a queued command, for a caller that has
// marked the memo itself (an exec handed to a parked poll).
func (s *Server) announceQueued(workerID string) {
	s.wake.deliver(workerKey(workerID))
	s.wake.publishOnly("q:" + workerID)
}

// wakeKey is the waiter key a delivered announcement wakes: a due one
// wakes its worker's poll.
func wakeKey(key string) string {
	kind, id, _ := strings.Cut(key, ":")
	if kind == "q" || kind == "c" {
		return workerKey(id)
	}
	return key
}

func tokenAnnouncement(id string) string      { return "t:" + id }
func keysAnnouncement(workerID string) string { return "k:" + workerID }
func targetAnnouncement(ns string) string     { return "v:" + ns }
