package execs

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"nymph/messages"
)

// Streaming defaults, used when the LogSink leaves a value at zero.
const (
	defaultFlushBytes   = 64 << 10
	defaultFlushEvery   = 200 * time.Millisecond
	defaultChunkTimeout = 10 * time.Second
	// maxBuffered bounds what a failing chunk endpoint can make the daemon
	// hold; past it the oldest bytes are dropped.
	maxBuffered = 16 << 20
	// finalAttempts is how often the last bytes are tried at the end.
	finalAttempts = 3
)

// shipper posts an exec's output to its LogSink: it accumulates what the
// readers send and flushes on flush_bytes or every flush_ms. A failed post
// keeps the bytes for the next flush and never fails the exec.
type shipper struct {
	post       func(ctx context.Context, data []byte) error
	flushBytes int
	flushEvery time.Duration
	timeout    time.Duration
	log        zerolog.Logger

	buf        []byte
	lastFailed time.Time
	dropped    int
}

func newShipper(s *Shell, sink *messages.LogSink, log zerolog.Logger) *shipper {
	sh := &shipper{
		flushBytes: int(min(sink.FlushBytes, maxBuffered)),
		flushEvery: time.Duration(min(sink.FlushMs, 3_600_000)) * time.Millisecond,
		timeout:    s.ChunkTimeout,
		log:        log,
	}
	url := sink.StdoutURL
	sh.post = func(ctx context.Context, data []byte) error { return s.Server.PostChunk(ctx, url, data) }
	if sh.flushBytes <= 0 {
		sh.flushBytes = defaultFlushBytes
	}
	if sh.flushEvery <= 0 {
		sh.flushEvery = defaultFlushEvery
	}
	if sh.timeout <= 0 {
		sh.timeout = defaultChunkTimeout
	}
	return sh
}

// run ships until in is closed, then makes a few last attempts.
func (s *shipper) run(in <-chan []byte) {
	tick := time.NewTicker(s.flushEvery)
	defer tick.Stop()
	for {
		select {
		case b, ok := <-in:
			if !ok {
				s.final()
				return
			}
			s.add(b)
			// After a failure, size alone does not trigger a retry before
			// the next tick: a dead endpoint is not hammered per read.
			if len(s.buf) >= s.flushBytes && time.Since(s.lastFailed) >= s.flushEvery {
				s.flush()
			}
		case <-tick.C:
			if len(s.buf) > 0 {
				s.flush()
			}
		}
	}
}

func (s *shipper) add(b []byte) {
	s.buf = append(s.buf, b...)
	if over := len(s.buf) - maxBuffered; over > 0 {
		s.buf = append(s.buf[:0], s.buf[over:]...)
		s.dropped += over
	}
}

func (s *shipper) flush() bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	if err := s.post(ctx, s.buf); err != nil {
		s.lastFailed = time.Now()
		s.log.Warn().Err(err).Int("buffered", len(s.buf)).Msg("log chunk post failed; kept for the next flush")
		return false
	}
	s.buf = nil
	return true
}

func (s *shipper) final() {
	for attempt := 0; len(s.buf) > 0 && attempt < finalAttempts; attempt++ {
		if attempt > 0 {
			time.Sleep(s.flushEvery)
		}
		if s.flush() {
			break
		}
	}
	if len(s.buf) > 0 {
		s.log.Error().Int("bytes", len(s.buf)).Msg("log chunk could not be delivered; dropped")
	}
	if s.dropped > 0 {
		s.log.Error().Int("bytes", s.dropped).Msg("log output dropped while the chunk endpoint was failing")
	}
}
