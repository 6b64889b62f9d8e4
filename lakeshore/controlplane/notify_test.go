package controlplane

import (
	"context"
	"sync"
	"testing"
	"time"

	"nymph/test/wait"
)

// heldNotifier holds every Publish until release is closed, noting the
// keys it was given.
type heldNotifier struct {
	release chan struct{}
	mu      sync.Mutex
	keys    []string
}

func (n *heldNotifier) Publish(ctx context.Context, key string) error {
	n.mu.Lock()
	n.keys = append(n.keys, key)
	n.mu.Unlock()
	select {
	case <-n.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *heldNotifier) Listen(ctx context.Context, deliver func(string)) error {
	deliver("")
	<-ctx.Done()
	return ctx.Err()
}

func (n *heldNotifier) published(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range n.keys {
		if k == key {
			return true
		}
	}
	return false
}

// TestWakeUpsAreNotWaitedFor: a key that only wakes waiters elsewhere (an
// exec's, an invocation's, a log's) is published without holding up its
// caller, so a poll handing over an exec answers without waiting for the
// database; a worker's key is out before its caller goes on, as the other
// replicas' memos and caches depend on it.
func TestWakeUpsAreNotWaitedFor(t *testing.T) {
	n := &heldNotifier{release: make(chan struct{})}
	e := newEnv(t, func(c *Config) { c.Notifier = n })
	for _, k := range []string{execKey("x"), execStateKey("x"), invocationKey("i"), logKey("l")} {
		e.srv.wake.broadcast(k) // returns although Publish is held
		wait.For(t, 10*time.Second, "the publish of "+k, func() bool { return n.published(k) })
	}
	returned := make(chan struct{})
	go func() {
		e.srv.wake.broadcast(workerKey("w"))
		close(returned)
	}()
	wait.For(t, 10*time.Second, "the publish of the worker's key", func() bool { return n.published(workerKey("w")) })
	select {
	case <-returned:
		t.Fatal("the worker's key was broadcast before its publish returned")
	default:
	}
	close(n.release)
	<-returned
}
