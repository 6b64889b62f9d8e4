// Package outbox owns the daemon's durable results: run acks and exec result
// callbacks. A result is written to a file under the workdir while its first
// post is on the way, and removed once the control plane accepted it; a post that fails
// for a reason worth retrying (transport error, timeout, 5xx, 429, 401/403)
// is retried with jittered exponential backoff, and results left over by a
// previous daemon process are posted when the outbox opens again.
//
// Each result has a key ("exec:<id>", "ack:<id>"). From the daemon's view a
// key is posted exactly once: a second submission of a key already seen is
// dropped. The control plane treats a repeated result as a no-op, so a retry
// after an answer that was lost on the way back is harmless.
package outbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"nymph/atomicfile"
	"nymph/backoff"
	"nymph/daemon/uplink"
	"nymph/messages"
)

// Poster posts an encoded msgpack body to a server path.
type Poster interface {
	PostEncoded(ctx context.Context, path string, body []byte) error
}

// record is the on-disk form of one result.
type record struct {
	Key  string         `msgpack:"key"`
	Path string         `msgpack:"path"`
	Body messages.Bytes `msgpack:"body"`
	At   messages.Epoch `msgpack:"at"`
}

// Outbox posts results durably. It is safe for concurrent use.
type Outbox struct {
	dir      string
	post     Poster
	log      zerolog.Logger
	min, max time.Duration
	rand     func() float64
	sem      chan struct{}

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	seen    map[string]struct{}
	order   []string
	pending int
	closed  bool
}

// Option configures an Outbox.
type Option func(*Outbox)

// WithBackoff sets the first and the largest retry delay (default 1 s, 60 s).
func WithBackoff(min, max time.Duration) Option {
	return func(o *Outbox) { o.min, o.max = min, max }
}

// WithConcurrency bounds simultaneous posts (default 8).
func WithConcurrency(n int) Option {
	return func(o *Outbox) { o.sem = make(chan struct{}, max(n, 1)) }
}

// WithRand replaces the jitter source (a uniform value in [0,1)).
func WithRand(r func() float64) Option {
	return func(o *Outbox) { o.rand = r }
}

// seenCap bounds the memory of keys already submitted.
const seenCap = 1 << 16

// Open creates dir if needed, and starts posting any results a previous
// process left there.
func Open(dir string, post Poster, logger zerolog.Logger, opts ...Option) (*Outbox, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &Outbox{
		dir: dir, post: post, log: logger.With().Str("component", "outbox").Logger(),
		min: time.Second, max: 60 * time.Second, rand: rand.Float64,
		sem: make(chan struct{}, 8), ctx: ctx, cancel: cancel,
		seen: make(map[string]struct{}),
	}
	for _, opt := range opts {
		opt(o)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("outbox: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		full := filepath.Join(dir, name)
		// Dot-files are atomicfile's torn temporaries; .tmp ones an older
		// daemon's.
		if strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(full)
			continue
		}
		if !strings.HasSuffix(name, ".msgpack") {
			continue
		}
		data, err := os.ReadFile(full)
		var rec record
		if err == nil {
			err = messages.Unmarshal(data, &rec)
		}
		if err != nil || rec.Key == "" || rec.Path == "" {
			o.log.Error().Err(err).Str("file", full).Msg("unreadable stored result dropped")
			_ = os.Remove(full)
			continue
		}
		o.remember(rec.Key)
		o.log.Info().Str("key", rec.Key).Msg("resuming a result stored by a previous run")
		stored := make(chan string, 1)
		stored <- full
		o.start(rec, stored)
	}
	return o, nil
}

// ExecResult stores and posts one exec's result.
func (o *Outbox) ExecResult(execID string, r *messages.ExecResult) error {
	body, err := messages.Marshal(r)
	if err != nil {
		return err
	}
	return o.Submit("exec:"+execID, uplink.ExecResultPath(execID), body)
}

// Ack stores and posts one run's ack.
func (o *Outbox) Ack(a *messages.Ack) error {
	body, err := messages.Marshal(a)
	if err != nil {
		return err
	}
	return o.Submit("ack:"+a.InvocationID, uplink.PathAck, body)
}

// Submit stores body for path under key and posts it in the background. A
// key already submitted is dropped. When the file cannot be written the
// result is still posted, from memory only, and the error is returned.
func (o *Outbox) Submit(key, path string, body []byte) error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return errors.New("outbox: closed")
	}
	if _, dup := o.seen[key]; dup {
		o.mu.Unlock()
		o.log.Warn().Str("key", key).Msg("result already submitted; duplicate dropped")
		return nil
	}
	o.remember(key)
	o.mu.Unlock()

	rec := record{Key: key, Path: path, Body: body, At: messages.Epoch(time.Now().Unix())}
	file := filepath.Join(o.dir, fileName(key))
	// The post does not wait for the disk: it starts now, and the file is
	// removed once both are done. A crash before the file is complete
	// loses what a crash an instant before the result existed would.
	stored := make(chan string, 1)
	o.start(rec, stored)
	werr := writeAtomic(file, rec)
	if werr != nil {
		o.log.Error().Err(werr).Str("key", key).Msg("result not stored on disk; posting from memory")
		file = ""
	}
	stored <- file
	return werr
}

// Pending is how many results are not posted yet.
func (o *Outbox) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pending
}

// Close stops accepting results and waits until every pending one is posted
// or ctx ends; what is still pending then stays on disk for the next run.
func (o *Outbox) Close(ctx context.Context) error {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	done := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		o.cancel()
		return nil
	case <-ctx.Done():
		o.cancel()
		<-done
		return fmt.Errorf("outbox: %d result(s) left on disk: %w", o.Pending(), ctx.Err())
	}
}

func (o *Outbox) remember(key string) {
	if _, ok := o.seen[key]; ok {
		return
	}
	o.seen[key] = struct{}{}
	o.order = append(o.order, key)
	if len(o.order) > seenCap {
		delete(o.seen, o.order[0])
		o.order = o.order[1:]
	}
}

// start posts rec in the background. stored yields the file that holds
// rec once it is written ("" when it could not be).
func (o *Outbox) start(rec record, stored <-chan string) {
	o.mu.Lock()
	o.pending++
	o.mu.Unlock()
	o.wg.Add(1)
	go o.deliver(rec, stored)
}

// deliver posts one result until it is accepted, refused for good, or the
// outbox is cancelled; then it removes the stored file, if any, once it is
// written. A cancelled delivery leaves the file for the next run.
func (o *Outbox) deliver(rec record, stored <-chan string) {
	defer func() {
		o.mu.Lock()
		o.pending--
		o.mu.Unlock()
		o.wg.Done()
	}()
	log := o.log.With().Str("key", rec.Key).Logger()
	wait := backoff.Backoff{Min: o.min, Max: o.max, Rand: o.rand}
	for attempt := 1; ; attempt++ {
		err := o.attempt(rec)
		if err == nil {
			break
		}
		if o.ctx.Err() != nil {
			return
		}
		if !retryable(err) {
			log.Error().Err(err).Msg("result refused by the control plane; dropped")
			break
		}
		delay := wait.Next()
		log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", delay).Msg("result post failed; will retry")
		if !backoff.Sleep(o.ctx, delay) {
			return
		}
	}
	if file := <-stored; file != "" {
		if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Error().Err(err).Msg("remove stored result")
		}
	}
}

func (o *Outbox) attempt(rec record) error {
	select {
	case o.sem <- struct{}{}:
	case <-o.ctx.Done():
		return o.ctx.Err()
	}
	defer func() { <-o.sem }()
	return o.post.PostEncoded(o.ctx, rec.Path, rec.Body)
}

// retryable widens uplink.Retryable with 401 and 403: a result must not be
// lost to a token or a clock that is being fixed; and with a cancellation,
// which deliver has checked is not the outbox's own: net/http can fail a
// post with the context.Canceled of another request on the same
// connection, and such a post is no refusal.
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) {
		return true
	}
	var se *uplink.StatusError
	if errors.As(err, &se) && (se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden) {
		return true
	}
	return uplink.Retryable(err)
}

func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16]) + ".msgpack"
}

func writeAtomic(path string, rec record) error {
	data, err := messages.Marshal(&rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}
