package controlplane

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"nymph/batch"

	"nymph/lakeshore/store"
)

// Replay protection on the store (see identity.Verifier): every nonce the
// Verifier accepts is committed to the store's nonces table before the
// request is acted on, so a signed request captured and replayed after a
// restart, a crash, or to another replica is refused.
const (
	// nonceBatch bounds the nonces one transaction records (two INSERT
	// statements).
	nonceBatch = 512
	// nonceCommitTimeout bounds one group commit; its requests fail with
	// it rather than hang on a store that does not answer.
	nonceCommitTimeout = 10 * time.Second
	// DefaultNoncePurgeInterval is how often the expired nonces are
	// dropped from the store.
	DefaultNoncePurgeInterval = time.Minute
)

// Defaults of the per-key throttle (Config.KeyRequestRate and
// KeyRequestBurst). A daemon signs a poll every 20 s when idle; while jobs
// run, each adds its result or ack, an event or a chunk every 200 ms while
// it prints (more while it prints fast, one post in flight per job), and a
// poll per batch of commands. The busiest daemon seen here, the chaos soak
// (116 jobs a second, 48 at once), sends a few hundred a second. A key
// sustaining more than 1,000 a second, or 5,000 at once, is not a daemon
// at work.
const (
	DefaultKeyRequestRate  = 1000
	DefaultKeyRequestBurst = 5000
)

// nonceLedger is the Verifier's identity.NonceLedger on the store, with
// group commit: a nonce waits in a queue while the transaction before it
// runs, and everything queued then goes in the next one (up to nonceBatch),
// so many concurrent signed requests cost a few transactions, not one
// each. One goroutine commits while there is a queue and ends when it is
// empty.
type nonceLedger struct {
	st store.Nonces
	q  *batch.Queue[*nonceWait]

	// commits counts transactions and recorded the nonces they held.
	commits, recorded atomic.Int64
}

// nonceWait is one request's nonce waiting for its commit.
type nonceWait struct {
	use   store.NonceUse
	fresh bool
	err   error
	done  chan struct{}
}

func newNonceLedger(st store.Nonces, maxBatch int) *nonceLedger {
	l := &nonceLedger{st: st}
	l.q = batch.New(maxBatch, l.commit)
	return l
}

// UseNonce implements identity.NonceLedger: it returns once the nonce is
// committed, or when ctx ends (the nonce may still be recorded then, and
// the request is refused either way).
func (l *nonceLedger) UseNonce(ctx context.Context, keyID, nonce string, expires time.Time) (bool, error) {
	w := &nonceWait{use: store.NonceUse{KeyID: keyID, Nonce: nonce, Expires: expires}, done: make(chan struct{})}
	l.q.Add(w)
	select {
	case <-w.done:
		return w.fresh, w.err
	case <-ctx.Done():
		return false, fmt.Errorf("record nonce: %w", ctx.Err())
	}
}

func (l *nonceLedger) commit(waits []*nonceWait) {
	uses := make([]store.NonceUse, len(waits))
	for i, w := range waits {
		uses[i] = w.use
	}
	ctx, cancel := context.WithTimeout(context.Background(), nonceCommitTimeout)
	fresh, err := l.st.UseNonces(ctx, uses)
	cancel()
	l.commits.Add(1)
	l.recorded.Add(int64(len(waits)))
	for i, w := range waits {
		if err != nil {
			w.err = err
		} else {
			w.fresh = fresh[i]
		}
		close(w.done)
	}
}

// startNoncePurge drops the expired nonces from the store every interval,
// off the request path. Every replica does it; it is idempotent.
func (s *Server) startNoncePurge(interval time.Duration) {
	s.every(interval, max(interval, 10*time.Second), func(ctx context.Context) {
		n, err := s.st.PurgeNonces(ctx, s.now())
		switch {
		case err != nil:
			s.log.Warn().Err(err).Msg("purge expired nonces")
		case n > 0:
			s.log.Debug().Int64("nonces", n).Msg("expired nonces purged")
		}
	})
}

// startSessionPurge drops expired dashboard sessions every interval, as
// startNoncePurge drops nonces.
func (s *Server) startSessionPurge(interval time.Duration) {
	s.every(interval, max(interval, 10*time.Second), func(ctx context.Context) {
		n, err := s.st.PurgeSessions(ctx, s.now())
		switch {
		case err != nil:
			s.log.Warn().Err(err).Msg("purge expired dashboard sessions")
		case n > 0:
			s.log.Debug().Int64("sessions", n).Msg("expired dashboard sessions purged")
		}
	})
}
