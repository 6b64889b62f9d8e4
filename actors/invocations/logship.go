package invocations

import (
	"bytes"
	"context"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"nymph/backoff"
	"nymph/daemon/uplink"
	"nymph/messages"
)

// EventPoster posts one event now (the uplink client).
type EventPoster interface {
	PostEvent(ctx context.Context, e *messages.Event) error
}

// EventStore keeps an event on disk and posts it when it can (the outbox).
type EventStore interface {
	Event(e *messages.Event) error
}

// LogSettings tune how a run's output is shipped. Zero fields take the
// defaults.
type LogSettings struct {
	// FlushEvery is how often what has accumulated is posted (200 ms).
	FlushEvery time.Duration
	// FlushBytes is how much output is posted without waiting for the
	// next tick (64 KiB).
	FlushBytes int
	// MaxPiece is the most data one event carries (1 MiB): while a post is
	// on its way, what follows gathers in pieces this large, so that a
	// run that writes fast is carried in few posts.
	MaxPiece int
	// MaxBuffered bounds the output one run holds while it cannot be
	// posted (16 MiB, as for an exec's streamed output); past it the oldest
	// pieces are dropped and the next event says how many bytes were
	// lost.
	MaxBuffered int
	// PostTimeout bounds one post (10 s).
	PostTimeout time.Duration
	// RetryMin and RetryMax are the backoff between failed posts (200 ms,
	// 10 s; the project's jittered doubling).
	RetryMin, RetryMax time.Duration
}

// Defaults of LogSettings.
const (
	defaultLogFlushEvery  = 200 * time.Millisecond
	defaultLogFlushBytes  = 64 << 10
	defaultLogMaxPiece    = messages.MaxLogPiece
	defaultLogMaxBuffered = 16 << 20
	defaultLogPostTimeout = 10 * time.Second
	defaultLogRetryMin    = 200 * time.Millisecond
	defaultLogRetryMax    = 10 * time.Second
	// maxLogPieces bounds the pieces held, whatever their size: output
	// that alternates between the streams a byte at a time must not make
	// millions of them.
	maxLogPieces = 4096
)

func (s LogSettings) withDefaults() LogSettings {
	if s.FlushEvery <= 0 {
		s.FlushEvery = defaultLogFlushEvery
	}
	if s.FlushBytes <= 0 {
		s.FlushBytes = defaultLogFlushBytes
	}
	if s.MaxPiece <= 0 {
		s.MaxPiece = defaultLogMaxPiece
	}
	if s.MaxBuffered <= 0 {
		s.MaxBuffered = defaultLogMaxBuffered
	}
	s.MaxBuffered = max(s.MaxBuffered, s.MaxPiece)
	if s.PostTimeout <= 0 {
		s.PostTimeout = defaultLogPostTimeout
	}
	if s.RetryMin <= 0 {
		s.RetryMin = defaultLogRetryMin
	}
	if s.RetryMax <= 0 {
		s.RetryMax = defaultLogRetryMax
	}
	return s
}

// piece is one stretch of one stream: the data of one invocation.log event.
type piece struct {
	stream  string
	seq     uint64
	data    []byte
	dropped uint64
	at      time.Time
	// sealed pieces take no more data: the last one may grow until the
	// poster takes it.
	sealed bool
}

// logShipper posts one run's stdout and stderr to the control plane as
// invocation.log events while the run goes on: what the runner writes is
// cut into pieces (one stream each, at most MaxPiece, on UTF-8
// boundaries), posted in order every FlushEvery or as soon as FlushBytes
// are waiting. A failed post keeps the pieces and is retried with backoff;
// it never fails the run, and writes never block the runner: past
// MaxBuffered the oldest output is dropped, and the loss is reported. What
// is still unposted when the run ends goes to the outbox, which keeps it on
// disk until the control plane takes it. A control plane that refuses the
// output (4xx) gets no more of it.
type logShipper struct {
	id       string
	post     EventPoster
	leftover EventStore
	workerID func() string
	set      LogSettings
	log      zerolog.Logger

	mu       sync.Mutex
	pieces   []*piece
	buffered int
	seq      uint64
	// dropped counts lost bytes not yet reported by an event.
	dropped    uint64
	lostTotal  uint64
	carry      map[string][]byte
	inflight   bool
	refused    bool
	closed     bool
	wake, stop chan struct{}
	done       chan struct{}
}

func (d *Deps) newLogShipper(invocationID string) *logShipper {
	if d.Events == nil {
		return nil
	}
	s := &logShipper{
		id: invocationID, post: d.Events, leftover: d.Leftovers, workerID: d.WorkerID,
		set: d.Logs.withDefaults(), log: d.Log.With().Str("invocation_id", invocationID).Logger(),
		carry: map[string][]byte{}, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go s.run()
	return s
}

// streamWriter is one stream of the run, as an io.Writer for the runner.
type streamWriter struct {
	s      *logShipper
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.s.write(w.stream, p)
	return len(p), nil
}

// writer returns the io.Writer of one stream.
func (s *logShipper) writer(stream string) streamWriter { return streamWriter{s: s, stream: stream} }

func (s *logShipper) write(stream string, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused || s.closed || len(p) == 0 {
		return
	}
	if c := s.carry[stream]; len(c) > 0 {
		p = append(append(make([]byte, 0, len(c)+len(p)), c...), p...)
	}
	// A character cut by a read waits for its other bytes, so every event
	// of UTF-8 output is UTF-8.
	cut := len(p) - incompleteTail(p)
	s.carry[stream] = bytes.Clone(p[cut:])
	s.add(stream, p[:cut])
}

// add appends data to the stream's open piece, starting new ones as needed;
// mu is held.
func (s *logShipper) add(stream string, p []byte) {
	for len(p) > 0 {
		var last *piece
		if n := len(s.pieces); n > 0 {
			last = s.pieces[n-1]
		}
		if last == nil || last.sealed || last.stream != stream || len(last.data) >= s.set.MaxPiece {
			s.seq++
			last = &piece{stream: stream, seq: s.seq, dropped: s.dropped, at: time.Now()}
			s.dropped = 0
			s.pieces = append(s.pieces, last)
		}
		n := cutPoint(p, s.set.MaxPiece-len(last.data))
		last.data = append(last.data, p[:n]...)
		s.buffered += n
		p = p[n:]
	}
	if s.buffered >= s.set.FlushBytes {
		s.kick()
	}
	s.trim()
}

// trim drops the oldest pieces the poster does not hold while over the
// bounds; the next piece reports their bytes as dropped. mu is held.
func (s *logShipper) trim() {
	for s.buffered > s.set.MaxBuffered || len(s.pieces) > maxLogPieces {
		i := 0
		if s.inflight {
			i = 1
		}
		if i >= len(s.pieces)-1 {
			return // only what is in flight and the open piece are left
		}
		p := s.pieces[i]
		s.pieces = append(s.pieces[:i], s.pieces[i+1:]...)
		s.buffered -= len(p.data)
		lost := uint64(len(p.data)) + p.dropped
		s.pieces[i].dropped += lost
		s.lostTotal += uint64(len(p.data))
	}
}

func (s *logShipper) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run posts until Close.
func (s *logShipper) run() {
	defer close(s.done)
	tick := time.NewTicker(s.set.FlushEvery)
	defer tick.Stop()
	retry := backoff.New(s.set.RetryMin, s.set.RetryMax)
	var retryAt time.Time
	for {
		select {
		case <-s.stop:
			s.final(!retryAt.IsZero())
			return
		case <-tick.C:
		case <-s.wake:
		}
		if !retryAt.IsZero() && time.Now().Before(retryAt) {
			continue
		}
		if err := s.drain(); err != nil {
			delay := retry.Next()
			retryAt = time.Now().Add(delay)
			s.log.Warn().Err(err).Dur("retry_in", delay).Int("buffered", s.bufferedBytes()).
				Msg("run output post failed; kept for the next attempt")
			continue
		}
		retry.Reset()
		retryAt = time.Time{}
	}
}

func (s *logShipper) bufferedBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buffered
}

// drain posts the pending pieces in order. It returns the error of a post
// worth retrying; a refusal ends the shipping of this run's output.
func (s *logShipper) drain() error {
	for {
		ev := s.takeHead()
		if ev == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.set.PostTimeout)
		err := s.post.PostEvent(ctx, ev)
		cancel()
		s.mu.Lock()
		s.inflight = false
		switch {
		case err == nil:
			s.popHead()
		case !uplink.Retryable(err):
			s.refused = true
			lost := s.buffered
			s.pieces, s.buffered = nil, 0
			s.mu.Unlock()
			s.log.Warn().Err(err).Int("bytes", lost).Msg("the control plane refused this run's output; the rest of it is not sent")
			return nil
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// takeHead seals the oldest piece and returns its event, or nil when there
// is none.
func (s *logShipper) takeHead() *messages.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused || len(s.pieces) == 0 {
		return nil
	}
	p := s.pieces[0]
	p.sealed = true
	s.inflight = true
	return s.event(p)
}

// popHead removes the piece just posted; mu is held.
func (s *logShipper) popHead() {
	if len(s.pieces) == 0 {
		return
	}
	s.buffered -= len(s.pieces[0].data)
	s.pieces[0] = nil
	s.pieces = s.pieces[1:]
}

// event builds the event of a sealed piece; mu is held.
func (s *logShipper) event(p *piece) *messages.Event {
	wid := ""
	if s.workerID != nil {
		wid = s.workerID()
	}
	ev, err := messages.NewEvent(s.id, messages.EventInvocationLog, wid,
		&messages.LogData{Stream: p.stream, Seq: p.seq, Data: messages.Bytes(p.data), Dropped: p.dropped}, p.at)
	if err != nil {
		// A struct of strings, numbers and bytes always encodes.
		panic(err)
	}
	return ev
}

// Close posts what is left, or hands it to the outbox, and returns once the
// output is on its way: before the run's ack, so that whoever follows the
// output has all of it by the time the run is over.
func (s *logShipper) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	// The run is over: a character still cut goes as it is.
	for _, stream := range []string{messages.StreamStdout, messages.StreamStderr} {
		if c := s.carry[stream]; len(c) > 0 {
			s.add(stream, c)
			delete(s.carry, stream)
		}
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
}

// final makes one more attempt, unless posts are failing already, and hands
// what is still left to the outbox.
func (s *logShipper) final(failing bool) {
	if !failing {
		if err := s.drain(); err == nil {
			s.reportLost()
			return
		}
	}
	s.mu.Lock()
	left := make([]*messages.Event, 0, len(s.pieces))
	bytes := s.buffered
	if !s.refused {
		for _, p := range s.pieces {
			left = append(left, s.event(p))
		}
	}
	s.pieces, s.buffered = nil, 0
	s.mu.Unlock()
	if len(left) > 0 {
		if s.leftover == nil {
			s.log.Error().Int("bytes", bytes).Msg("run output could not be posted and there is no outbox; dropped")
		} else {
			for _, ev := range left {
				if err := s.leftover.Event(ev); err != nil {
					s.log.Error().Err(err).Msg("run output not stored for a later post")
				}
			}
			s.log.Warn().Int("events", len(left)).Int("bytes", bytes).Msg("run output handed to the outbox; it is posted once the control plane answers")
		}
	}
	s.reportLost()
}

func (s *logShipper) reportLost() {
	s.mu.Lock()
	lost := s.lostTotal
	s.mu.Unlock()
	if lost > 0 {
		s.log.Error().Uint64("bytes", lost).Msg("run output dropped while the control plane could not be reached (the oldest first)")
	}
}

// incompleteTail is how many bytes at the end of b start a UTF-8 character
// whose other bytes have not arrived; 0 when b ends on a boundary (or is not
// UTF-8 there).
func incompleteTail(b []byte) int {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < utf8.RuneSelf {
			return 0
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-i:]) {
				return 0
			}
			return i
		}
	}
	return 0
}

// cutPoint is where to cut p to take at most room bytes: room itself unless
// that splits a character, else the start of that character (unless it
// starts the piece).
func cutPoint(p []byte, room int) int {
	if len(p) <= room {
		return len(p)
	}
	for i := room; i > room-utf8.UTFMax && i > 0; i-- {
		if utf8.RuneStart(p[i]) {
			return i
		}
	}
	return room
}
