package controlplane

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// Limits bound how long a slow or stalled client can hold a connection.
// The server is meant to face the internet, where holding many connections
// open at a trickle costs an attacker almost nothing; every phase of a
// request therefore has a deadline:
//
//   - the request line and headers (and the TLS handshake): HeaderTimeout;
//   - a kept-alive connection waiting for its next request: IdleTimeout;
//   - a request body: BodyGrace to start with, extended by one second for
//     every BodyMinRate bytes received (so after the grace the body must
//     average at least BodyMinRate), and never beyond BodyTimeout in all
//     (UploadTimeout on the upload routes: release publish, payload put);
//   - each write of an answer: WriteTimeout for the client to take it.
//
// Long-polls are not cut: they wait with the body already read (or none
// sent) and nothing being written, and no deadline runs then. A zero
// field takes its default (DefaultLimits).
type Limits struct {
	HeaderTimeout time.Duration
	IdleTimeout   time.Duration
	BodyGrace     time.Duration
	// BodyMinRate is in bytes per second.
	BodyMinRate   int64
	BodyTimeout   time.Duration
	UploadTimeout time.Duration
	WriteTimeout  time.Duration
}

// DefaultLimits are what `lakeshore serve` uses unless told otherwise.
// The body floor is far below any real link (64 kbit/s is eight times
// faster), and the budgets leave room for the largest body a route takes:
// the 128 MiB an ack may carry fits 5 minutes at 440 KiB/s, a 100 MiB
// payload an hour at 28 KiB/s.
func DefaultLimits() Limits {
	return Limits{
		HeaderTimeout: 10 * time.Second,
		IdleTimeout:   120 * time.Second,
		BodyGrace:     10 * time.Second,
		BodyMinRate:   1024,
		BodyTimeout:   5 * time.Minute,
		UploadTimeout: time.Hour,
		WriteTimeout:  60 * time.Second,
	}
}

// DefaultMaxConnsPerIP is `lakeshore serve --max-conns-per-ip` by default:
// generous, because every daemon behind one NAT shares its address and
// holds a long-poll plus, now and then, a result post.
const DefaultMaxConnsPerIP = 1024

// withDefaults fills the zero fields and refuses negative ones.
func (l Limits) withDefaults() (Limits, error) {
	d := DefaultLimits()
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"HeaderTimeout", &l.HeaderTimeout, d.HeaderTimeout},
		{"IdleTimeout", &l.IdleTimeout, d.IdleTimeout},
		{"BodyGrace", &l.BodyGrace, d.BodyGrace},
		{"BodyTimeout", &l.BodyTimeout, d.BodyTimeout},
		{"UploadTimeout", &l.UploadTimeout, d.UploadTimeout},
		{"WriteTimeout", &l.WriteTimeout, d.WriteTimeout},
	} {
		switch {
		case *f.v < 0:
			return l, fmt.Errorf("%s %v: must not be negative", f.name, *f.v)
		case *f.v == 0:
			*f.v = f.def
		}
	}
	switch {
	case l.BodyMinRate < 0:
		return l, fmt.Errorf("BodyMinRate %d: must not be negative", l.BodyMinRate)
	case l.BodyMinRate == 0:
		l.BodyMinRate = d.BodyMinRate
	}
	return l, nil
}

// slowBodyError is what reading a body returns once it was cut for its
// deadline, saying which bound cut it. It is an os.ErrDeadlineExceeded.
type slowBodyError struct {
	msg string
}

func (e *slowBodyError) Error() string { return e.msg }

func (e *slowBodyError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// rateBody is a request body under its deadline. The connection's read
// deadline is moved forward as bytes arrive (through
// http.ResponseController, which reaches the connection under HTTP/1 and
// the stream under HTTP/2); the clock starts at the first Read, so time
// the handler spends before it reads (authorizing, say) is not the
// client's.
type rateBody struct {
	body io.ReadCloser
	rc   *http.ResponseController
	lim  *Limits
	// budget is lim.BodyTimeout, or lim.UploadTimeout on the upload routes
	// (set before the handler reads).
	budget time.Duration

	// The handler's goroutine alone reads the body; only cut is read
	// from elsewhere (an HTTP/2 handler may write while it reads).
	started bool
	start   time.Time
	n       int64
	set     time.Time // the deadline last set
	// done: the body ended (EOF or an error). Under HTTP/1 the server then
	// reads the connection in the background to notice a client leaving,
	// and a deadline set now would cut that read and cancel the request.
	done bool
	cut  atomic.Pointer[slowBodyError]
}

// deadline is when the next byte must have arrived: the grace plus one
// second per BodyMinRate bytes so far, within the budget.
func (b *rateBody) deadline() time.Time {
	earned := time.Duration(float64(b.n) / float64(b.lim.BodyMinRate) * float64(time.Second))
	if earned < 0 || earned > b.budget { // the float overflowed, or past the cap anyway
		earned = b.budget
	}
	return b.start.Add(min(b.lim.BodyGrace+earned, b.budget))
}

func (b *rateBody) Read(p []byte) (int, error) {
	if cut := b.cut.Load(); cut != nil {
		return 0, cut
	}
	if b.done {
		return b.body.Read(p)
	}
	if !b.started {
		b.started, b.start = true, time.Now()
		b.setDeadline(b.deadline())
	}
	n, err := b.body.Read(p)
	b.n += int64(n)
	switch {
	case err == nil:
		// The deadline only moves forward, and by steps: a tenth of the
		// grace (at most a second) of slack spares a deadline change (a
		// message to the HTTP/2 serve loop) per read. The budget's end is
		// set as soon as it is reached.
		d := b.deadline()
		if d.Sub(b.set) >= min(time.Second, b.lim.BodyGrace/10) || (d.After(b.set) && d.Equal(b.start.Add(b.budget))) {
			b.setDeadline(d)
		}
	case errors.Is(err, os.ErrDeadlineExceeded):
		took := time.Since(b.start).Round(time.Millisecond)
		cut := &slowBodyError{msg: fmt.Sprintf("request body cut off: %d bytes in %v, slower than %d bytes/s after a %v grace", b.n, took, b.lim.BodyMinRate, b.lim.BodyGrace)}
		if b.set.Equal(b.start.Add(b.budget)) {
			cut.msg = fmt.Sprintf("request body cut off: not complete after %v, the most this route allows (%d bytes arrived)", b.budget, b.n)
		}
		b.cut.Store(cut)
		return n, cut
	default:
		b.done = true
	}
	return n, err
}

func (b *rateBody) setDeadline(d time.Time) {
	b.set = d
	_ = b.rc.SetReadDeadline(d)
}

func (b *rateBody) Close() error { return b.body.Close() }

// wasCut reports whether the body was cut for its deadline.
func (b *rateBody) wasCut() bool { return b.cut.Load() != nil }

// edgeWriter puts a deadline on every write of an answer and turns the
// answer to a request whose body was cut into a 408, whatever the handler
// made of its read error (nothing is stored from a cut body: every route
// refuses a body it could not read whole).
type edgeWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	h2      bool
	body    *rateBody // nil for a request without a body
	req     *http.Request
	wrote   bool
}

// bound arms the deadlines of one request: it replaces r.Body with one
// under its deadline and returns the writer the handler is to use, and
// the function to call once the handler is done.
func (s *Server) bound(w http.ResponseWriter, r *http.Request) (*edgeWriter, func()) {
	rc := http.NewResponseController(w)
	ew := &edgeWriter{ResponseWriter: w, rc: rc, timeout: s.limits.WriteTimeout, h2: r.ProtoMajor >= 2}
	if !ew.h2 {
		// A kept-alive connection still carries the deadline of its
		// previous answer's last write.
		_ = rc.SetWriteDeadline(time.Time{})
	}
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		// Until the handler reads, the grace alone bounds the body: a
		// handler that answers without reading it (a refusal) leaves the
		// HTTP/1 server to drain it before it can reuse the connection.
		_ = rc.SetReadDeadline(time.Now().Add(s.limits.BodyGrace))
		ew.body = &rateBody{body: r.Body, rc: rc, lim: &s.limits, budget: s.limits.BodyTimeout}
		ew.req, r.Body = r, ew.body
	}
	return ew, func() {
		// What the handler wrote may still sit in a buffer, flushed once
		// it returns: that flush is bounded too.
		_ = rc.SetWriteDeadline(time.Now().Add(ew.timeout))
	}
}

// upload gives the body of the routes that take large uploads (release
// publish, payload put) UploadTimeout rather than BodyTimeout. The rate
// floor still holds.
func (s *Server) upload(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if b, ok := r.Body.(*rateBody); ok {
			b.budget = s.limits.UploadTimeout
		}
		next(w, r)
	}
}

func (w *edgeWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		if w.body != nil {
			if w.body.wasCut() {
				code = http.StatusRequestTimeout
				if !w.h2 {
					w.Header().Set("Connection", "close")
				}
			}
			// The HTTP/1 server looks at the request's body as it writes
			// the header: its own body type tells it how much is left
			// unread, and a large remainder (a refusal before reading)
			// closes the connection at once instead of draining it. The
			// handler is done reading once it answers.
			w.req.Body = w.body.body
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *edgeWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.armWrite()
	n, err := w.ResponseWriter.Write(p)
	w.disarmWrite()
	return n, err
}

// FlushError is what http.ResponseController.Flush calls, so a flush is
// bounded like a write.
func (w *edgeWriter) FlushError() error {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.armWrite()
	err := http.NewResponseController(w.ResponseWriter).Flush()
	w.disarmWrite()
	return err
}

// Unwrap lets http.ResponseController reach the connection for what this
// writer does not do itself.
func (w *edgeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *edgeWriter) armWrite() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) }

// disarmWrite clears the deadline after a write under HTTP/2, whose
// deadline is a timer that resets the stream when it fires, written to or
// not: a long-poll or a followed log quiet for longer would be cut.
// Under HTTP/1 a deadline only bounds a write in progress, and the next
// write moves it.
func (w *edgeWriter) disarmWrite() {
	if w.h2 {
		_ = w.rc.SetWriteDeadline(time.Time{})
	}
}
