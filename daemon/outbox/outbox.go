// Package outbox owns the daemon's durable results: run acks, exec result
// callbacks and events (setup and update outcomes, and run output that could
// not be posted live), and the job journal (journal.go) that accounts for
// each job from before it is spawned until its result is stored here.
//
// A result is posted at once; it is written to a file under the workdir
// only when that first post fails or is still on the way after a short
// grace (StoreAfter), and the file is removed once the control plane
// accepted it. Until one of the two holds it, the job's journal entry
// stands for the result: a daemon killed in that window (a millisecond or
// so, normally) has the next start report the job as interrupted, which is
// what a kill an instant before the job ended reports too. A post that
// fails for a reason worth retrying (transport error, timeout, 5xx, 429,
// 401/403) is retried with jittered exponential backoff, and results left
// over by a previous daemon process are posted when the outbox opens again.
//
// Each result has a key ("exec:<id>", "ack:<id>", "event:<kind>:<id>"). From
// the daemon's view a key is posted exactly once: a second submission of a
// key already seen is dropped. The control plane treats a repeated result as
// a no-op, so a retry after an answer that was lost on the way back is
// harmless.
//
// A stored result or a journal that cannot be read (a crash mid-write, a
// full disk, a hand edit) is logged with its name and set aside as
// <name>.corrupt-<unix>; it never stops the daemon from starting.
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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"nymph/atomicfile"
	"nymph/backoff"
	"nymph/daemon/uplink"
	"nymph/gopool"
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
	// storeAfter is how long a first post may take before its result is
	// written to disk.
	storeAfter time.Duration

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	seen    map[string]struct{}
	order   []string
	pending int
	// idle is closed whenever pending drops to zero (Flush waits on it).
	idle   chan struct{}
	closed bool
	// jr is the job journal.
	jr *journal
	// pool runs each delivery (WithGoroutines; nil: a goroutine each).
	pool *gopool.Pool
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

// WithGoroutines runs each delivery on a goroutine of pool rather than on
// a goroutine of its own.
func WithGoroutines(pool *gopool.Pool) Option {
	return func(o *Outbox) { o.pool = pool }
}

// WithRand replaces the jitter source (a uniform value in [0,1)).
func WithRand(r func() float64) Option {
	return func(o *Outbox) { o.rand = r }
}

// WithStoreAfter sets how long a result's first post may be on the way
// before the result is written to disk (default StoreAfter).
func WithStoreAfter(d time.Duration) Option {
	return func(o *Outbox) { o.storeAfter = d }
}

// StoreAfter is how long a first post may be on the way before its result
// is written to disk: far above a post's round trip to a control plane
// that keeps up (about a millisecond), so the disk is spared the write
// (a file, two fsyncs, a rename) on every result, and short enough that a
// control plane that is slow or away costs at most that long in memory.
const StoreAfter = 50 * time.Millisecond

// seenCap bounds the memory of keys already submitted.
const seenCap = 1 << 16

// Open creates dir (and its journal) if needed, and starts posting any
// results a previous process left there. Recover then reports the jobs it
// left without one.
func Open(dir string, post Poster, logger zerolog.Logger, opts ...Option) (*Outbox, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o := &Outbox{
		dir: dir, post: post, log: logger.With().Str("component", "outbox").Logger(),
		min: time.Second, max: 60 * time.Second, rand: rand.Float64,
		sem: make(chan struct{}, 8), storeAfter: StoreAfter, ctx: ctx, cancel: cancel,
		seen: make(map[string]struct{}),
	}
	for _, opt := range opts {
		opt(o)
	}
	o.jr = newJournal(filepath.Join(dir, JournalFile), o.log)
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
		rec, err := readRecord(full)
		if err != nil {
			o.setAside(full, err, "corrupt stored result set aside; it is not posted")
			continue
		}
		o.remember(rec.Key)
		o.log.Info().Str("key", rec.Key).Msg("resuming a result stored by a previous run")
		o.start(rec, full)
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

// Event stores and posts one event: an outcome, or output a run could not
// post itself. Its key is its kind, id and, for a log event, its seq, so a
// second copy of the same event is dropped.
func (o *Outbox) Event(e *messages.Event) error {
	body, err := messages.Marshal(e)
	if err != nil {
		return err
	}
	return o.Submit(EventKey(e), uplink.PathEvent, body)
}

// EventKey is the outbox key of an event.
func EventKey(e *messages.Event) string {
	key := "event:" + e.Kind + ":" + e.InvocationID
	if e.Kind == messages.EventInvocationLog {
		var d messages.LogData
		if messages.Unmarshal(e.Data, &d) == nil {
			key += ":" + strconv.FormatUint(d.Seq, 10)
		}
	}
	return key
}

// Submit posts body to path under key in the background, and stores it
// on disk if that post fails or takes longer than the store grace. A key
// already submitted is dropped. It returns an error only once the outbox
// is closed; a result that cannot be stored is still posted, from memory,
// and logged.
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
	o.start(record{Key: key, Path: path, Body: body, At: messages.Epoch(time.Now().Unix())}, "")
	return nil
}

// Pending is how many results are not posted yet.
func (o *Outbox) Pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.pending
}

// Flush waits until every result submitted so far (and every one resumed
// from disk) is posted or refused for good, or ctx ends. The outbox goes on
// accepting results.
func (o *Outbox) Flush(ctx context.Context) error {
	o.mu.Lock()
	if o.pending == 0 {
		o.mu.Unlock()
		return nil
	}
	idle := o.idle
	o.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("outbox: %d result(s) not posted yet: %w", o.Pending(), ctx.Err())
	}
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
	var err error
	select {
	case <-done:
		o.cancel()
	case <-ctx.Done():
		left := o.Pending() // counted before the cancelled posts give up
		o.cancel()
		<-done
		err = fmt.Errorf("outbox: %d result(s) left on disk: %w", left, ctx.Err())
	}
	if cerr := o.jr.close(); cerr != nil && err == nil {
		err = fmt.Errorf("outbox: %w", cerr)
	}
	return err
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

// start posts rec in the background. file is where rec is stored already
// ("": not stored yet).
func (o *Outbox) start(rec record, file string) {
	o.mu.Lock()
	if o.pending == 0 {
		o.idle = make(chan struct{})
	}
	o.pending++
	o.mu.Unlock()
	o.wg.Add(1)
	o.pool.Go(func() { o.deliver(rec, file) })
}

// deliver posts one result until it is accepted, refused for good, or the
// outbox is cancelled; then it removes the stored file, if any. A result
// not stored yet is stored once its first post fails, or once that post
// has been on the way for storeAfter; a result accepted before that is
// never written. A cancelled delivery leaves the file for the next run.
func (o *Outbox) deliver(rec record, file string) {
	defer func() {
		o.mu.Lock()
		o.pending--
		if o.pending == 0 {
			close(o.idle)
		}
		o.mu.Unlock()
		o.wg.Done()
	}()
	log := o.log.With().Str("key", rec.Key).Logger()
	var (
		once   sync.Once
		timer  *time.Timer
		stored = file != ""
	)
	// store writes rec once, from the timer or from this goroutine,
	// whichever is first; a second call waits for the first to finish.
	store := func() {
		once.Do(func() {
			if stored {
				return
			}
			f := filepath.Join(o.dir, fileName(rec.Key))
			if err := writeAtomic(f, rec); err != nil {
				log.Error().Err(err).Msg("result not stored on disk; posting from memory")
				return
			}
			file, stored = f, true
			// Stored: the job is accounted for without its journal entry.
			o.endJob(rec.Key)
		})
	}
	if !stored {
		timer = time.AfterFunc(o.storeAfter, store)
	}
	wait := backoff.Backoff{Min: o.min, Max: o.max, Rand: o.rand}
	for attempt := 1; ; attempt++ {
		err := o.attempt(rec)
		if attempt == 1 && timer != nil && timer.Stop() && err == nil {
			// Accepted before the grace ran out: never stored, and the
			// journal entry stood for it until now.
			o.endJob(rec.Key)
			return
		}
		// From here on the result is (being) stored, or could not be.
		store()
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
	if !stored {
		// Never stored: the journal entry stood for it until now.
		o.endJob(rec.Key)
		return
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Error().Err(err).Msg("remove stored result")
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

// readRecord reads one stored result; a record that does not decode, or
// lacks its key or path, is corrupt.
func readRecord(path string) (record, error) {
	var rec record
	data, err := os.ReadFile(path)
	if err != nil {
		return rec, err
	}
	if err := messages.Unmarshal(data, &rec); err != nil {
		return rec, err
	}
	if rec.Key == "" || rec.Path == "" {
		return rec, errors.New("stored result without its key or path")
	}
	return rec, nil
}

func writeAtomic(path string, rec record) error {
	data, err := messages.Marshal(&rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o600)
}
