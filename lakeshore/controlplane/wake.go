package controlplane

import (
	"strings"
	"sync"
	"time"
)

// hub hands out wake-up channels by key ("w:<worker>", "e:<exec>",
// "x:<exec>"; see execKey and execStateKey). A
// broadcast closes the key's current channel, waking every subscriber at
// once; the next subscriber gets a fresh one. Entries live only while
// someone holds a subscription, so idle keys cost nothing.
type hub struct {
	mu sync.Mutex
	m  map[string]*waiters
	// publish, when set (before serving), also carries each broadcast to
	// the other replicas sharing the store.
	publish func(key string)
}

type waiters struct {
	ch   chan struct{}
	refs int
}

func newHub() *hub { return &hub{m: map[string]*waiters{}} }

// subscribe returns a channel closed by the next broadcast on key, and a
// release to call once the caller stops waiting on it.
func (h *hub) subscribe(key string) (<-chan struct{}, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.m[key]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		h.m[key] = w
	}
	w.refs++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			w.refs--
			if w.refs == 0 && h.m[key] == w {
				delete(h.m, key)
			}
		})
	}
}

// broadcast wakes everyone subscribed to key, here and on the other
// replicas.
func (h *hub) broadcast(key string) {
	h.deliver(key)
	if h.publish != nil {
		h.publish(key)
	}
}

// publishOnly tells the other replicas that key changed, waking nobody
// here (announcements: see caches).
func (h *hub) publishOnly(key string) {
	if h.publish != nil {
		h.publish(key)
	}
}

// deliver wakes this process's subscribers of key, or of every key when key
// is empty.
func (h *hub) deliver(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if key == "" {
		for k, w := range h.m {
			close(w.ch)
			delete(h.m, k)
		}
		return
	}
	h.wakeLocked(key)
	if id, ok := strings.CutPrefix(key, execKeyPrefix); ok {
		// News is a change too.
		h.wakeLocked(execStateKey(id))
	}
}

func (h *hub) wakeLocked(key string) {
	if w := h.m[key]; w != nil {
		close(w.ch)
		delete(h.m, key)
	}
}

// size is the number of keys with subscribers, for tests.
func (h *hub) size() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}

// workerKeyPrefix starts a worker's key: what its long-polls park on.
const workerKeyPrefix = "w:"

func workerKey(id string) string { return workerKeyPrefix + id }

// execKeyPrefix starts an exec's news key.
const execKeyPrefix = "e:"

// execKey is woken by an exec's news: output, or its end. Every broadcast
// on it also wakes execStateKey.
func execKey(id string) string { return execKeyPrefix + id }

// execStateKey is woken by any change of an exec, news or not (its
// delivery to the daemon). A wait for news alone parks on execKey, so that
// a delivery does not make it read the exec for nothing.
func execStateKey(id string) string { return "x:" + id }

// How a long-poll's park ended.
type parkEnd int

const (
	parkWoken parkEnd = iota // something under the key changed: read again
	parkOver                 // the wait ran out or the server is closing: answer what is there
	parkGone                 // the client left: answer nothing
)

// park blocks a long-poll on key's woken channel until one of the parkEnd
// cases, then releases the subscription. gone closes when the client left:
// its request's context, or the socket of a parked poll stirring.
func (s *Server) park(key string, woken <-chan struct{}, release func(), timeout <-chan time.Time, gone <-chan struct{}) parkEnd {
	defer release()
	if strings.HasPrefix(key, workerKeyPrefix) {
		s.metrics.pollsHeld.Inc()
		defer s.metrics.pollsHeld.Dec()
	}
	if s.parked != nil {
		s.parked(key)
	}
	select {
	case <-woken:
		return parkWoken
	case <-timeout:
		return parkOver
	case <-s.closing:
		return parkOver
	case <-gone:
		return parkGone
	}
}
