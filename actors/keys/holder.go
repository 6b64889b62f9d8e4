package keys

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"nymph/identity"
)

// errBusy reports that a rotation is already under way.
var errBusy = errors.New("a key rotation is already under way")

// Holder is the daemon's current signing key. Every request is signed
// through it (it is the uplink client's signer), and a rotation replaces the
// key in one atomic step, so a request is signed wholly by the old key or
// wholly by the new one. It is safe for concurrent use.
type Holder struct {
	cur atomic.Pointer[identity.Key]

	mu sync.Mutex
	// settled is closed when the rotation under way ends; nil when none is.
	settled chan struct{}
}

// NewHolder returns a holder signing with k.
func NewHolder(k *identity.Key) *Holder {
	h := &Holder{}
	h.cur.Store(k)
	return h
}

// Key is the key requests are signed with now.
func (h *Holder) Key() *identity.Key { return h.cur.Load() }

// SignRequest signs req with the current key.
func (h *Holder) SignRequest(req *http.Request, body []byte, now time.Time) error {
	return h.cur.Load().SignRequest(req, body, now)
}

// Replaced waits until no rotation is under way (or ctx ends) and reports
// whether the key with id keyID is no longer the current one. A request
// refused because the control plane retired its key a moment before the
// daemon switched learns here that signing it again will do.
func (h *Holder) Replaced(ctx context.Context, keyID string) bool {
	h.mu.Lock()
	settled := h.settled
	h.mu.Unlock()
	if settled != nil {
		select {
		case <-settled:
		case <-ctx.Done():
			return false
		}
	}
	return h.cur.Load().ID() != keyID
}

// Rotating reports whether a rotation is under way.
func (h *Holder) Rotating() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.settled != nil
}

// begin marks a rotation as under way and returns the outgoing key.
func (h *Holder) begin() (*identity.Key, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled != nil {
		return nil, errBusy
	}
	h.settled = make(chan struct{})
	return h.cur.Load(), nil
}

// end closes the rotation; a non-nil next becomes the current key first.
func (h *Holder) end(next *identity.Key) {
	if next != nil {
		h.cur.Store(next)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.settled != nil {
		close(h.settled)
		h.settled = nil
	}
}
