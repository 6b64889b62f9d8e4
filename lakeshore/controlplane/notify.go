package controlplane

import (
	"context"
	"strings"
	"sync"
	"time"

	"nymph/backoff"
)

// Notifier carries wake-ups between control-plane replicas that share one
// store. Without one (Config.Notifier nil) wake-ups stay in this process,
// which is all a single control plane needs: a long-poll parked here is
// only ever woken by a change made here.
//
// With several replicas, a daemon may long-poll on replica A while an
// operator queues its command through replica B; B publishes the worker's
// key and A, listening, wakes the poll. The same goes for exec output and
// invocation results.
type Notifier interface {
	// Publish tells the other replicas that key changed. It is called after
	// the change is committed to the store.
	Publish(ctx context.Context, key string) error
	// Listen calls deliver with each key another replica publishes, until
	// ctx is done or the connection behind it fails. Once listening, it
	// first calls deliver("") — "anything may have changed" — since keys
	// published while nobody listened are lost.
	Listen(ctx context.Context, deliver func(key string)) error
}

// How long one publish may take, and the backoff of a failed listener (a
// listen that lasted longer than the maximum starts it over).
const (
	publishTimeout = 5 * time.Second
	listenRetryMin = 100 * time.Millisecond
	listenRetryMax = 5 * time.Second
)

// delivered acts on a key another replica published: its caches and
// memos first, then the long-polls waiting on it. "" comes first on every
// new listen: the caches go live, empty.
func (s *Server) delivered(key string) {
	if key == "" {
		s.caches.setLive(true)
	}
	s.apply(key)
	s.wake.deliver(wakeKey(key))
}

// startNotifier makes every broadcast reach the other replicas through n
// and delivers theirs to this process's waiters, until the returned stop is
// called.
func (s *Server) startNotifier(n Notifier) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	publish := func(key string) {
		pctx, pcancel := context.WithTimeout(ctx, publishTimeout)
		defer pcancel()
		// A lost publish costs the other replicas' waiters at most their
		// wait cap; the change itself is committed.
		if err := n.Publish(pctx, key); err != nil && ctx.Err() == nil {
			s.log.Warn().Err(err).Str("key", key).Msg("wake-up not published to the other replicas")
		}
	}
	// inFlight counts the publishes not waited for; stop waits for them,
	// and none starts once it has (stopped, under mu).
	var (
		inFlight sync.WaitGroup
		mu       sync.Mutex
		stopped  bool
	)
	s.wake.publish = func(key string) {
		if !wakeOnly(key) {
			publish(key)
			return
		}
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		inFlight.Add(1)
		mu.Unlock()
		go func() {
			defer inFlight.Done()
			publish(key)
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		retry := backoff.New(listenRetryMin, listenRetryMax)
		for {
			began := time.Now()
			var err error
			if sl, ok := n.(sentListener); ok {
				err = sl.ListenSent(ctx, func(key string, sent time.Time) {
					s.metrics.observeLag(sent)
					s.delivered(key)
				})
			} else {
				err = n.Listen(ctx, s.delivered)
			}
			// Not listening: what the others change goes unheard.
			s.caches.setLive(false)
			if ctx.Err() != nil {
				return
			}
			if time.Since(began) > listenRetryMax {
				retry.Reset()
			}
			d := retry.Next()
			s.log.Warn().Err(err).Dur("retry_in", d).Msg("listening for the other replicas' wake-ups failed")
			if !backoff.Sleep(ctx, d) {
				return
			}
		}
	}()
	return func() {
		cancel()
		mu.Lock()
		stopped = true
		mu.Unlock()
		inFlight.Wait()
		<-done
	}
}

// wakeOnly says whether key only wakes waiters (an exec's, an
// invocation's, a log's) and changes nothing the other replicas keep, so
// its publish is not waited for: nothing the caller does next depends on
// its having arrived, and a waiter woken a little later reads the same
// change. The poll that hands an exec to its daemon publishes one before
// it answers, and the daemon's result another: neither answer waits for
// PostgreSQL. A worker's key ("w:") and the announcements ("t:", "k:",
// "v:") are out before their caller goes on, so that the next request on
// any replica finds its caches and memos dropped.
func wakeOnly(key string) bool {
	kind, _, _ := strings.Cut(key, ":")
	return kind == "e" || kind == "x" || kind == "i" || kind == "l"
}
