package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"nymph/lakeshore/operatorapi"
)

// Parking: a long-poll that has to wait, over HTTP/1.1, takes its
// connection from net/http (a hijack) and lets the handler return, so
// that while it waits the connection goroutine, its stack, its buffered
// reader and writer and the request are gone; what is left is the
// connection, the pollState, a timer and two goroutines with the smallest
// stacks, one parked on the wake-up channel, one on the socket. The
// answer is written by hand, exactly what the
// handler would have written, and the connection goes back to the
// http.Server through the listener it accepts from (parkingLot), so the
// daemon's keep-alive connection goes on serving its next poll.
//
// What net/http did for a waiting handler is done here in its place:
//
//   - It noticed a daemon that went away (its background read), which the
//     daemon's poller does on purpose whenever a run ends. A parked poll
//     waits on its socket too, without reading from it, and ends when it
//     closes: its connection and per-address slot do not linger until a
//     wake or the timeout. It also looks at the socket right before it
//     claims or takes anything: a legacy daemon (a null cursor)
//     acknowledges a command by receiving it, so one taken for a closed
//     connection would be lost. Closed, the poll takes nothing and is
//     dropped; the command waits for the daemon's next poll. Bytes from a
//     daemon still waiting for its answer (a pipelined request, or under
//     TLS maybe its close_notify) also stop it taking: it answers what it
//     has, and the connection closes after that answer.
//   - It kept an idle connection for IdleTimeout before the next request:
//     the answered connection is handed back once the daemon's next
//     request starts arriving, so ReadHeaderTimeout runs from there.
//   - Shutdown ended its connections: a parked poll answers at once when
//     the server closes (stopWaiting), with Connection: close, and Serve
//     closes what is still parked once Shutdown is done.
//
// Under HTTP/2 (no hijack), with a client that asked to close, or on a
// Handler served by another http.Server, the poll waits in its handler.

// parkingLot is the listener Serve's http.Server accepts from: the
// connections of the listener under it, and those parked polls hand back.
// It is above TLS, so a connection handed back is the *tls.Conn it was
// (net/http sets r.TLS from it), and above the per-address cap, so a
// connection is counted once however often it is handed back.
type parkingLot struct {
	net.Listener
	idleTimeout time.Duration
	back        chan net.Conn
	in          chan accepted
	pumpOnce    sync.Once
	done        chan struct{}
	closeOnce   sync.Once
	closeErr    error

	mu     sync.Mutex
	polls  map[*parkedPoll]struct{}
	empty  chan struct{} // closed once polls is empty, when draining
	drains bool
}

type accepted struct {
	c   net.Conn
	err error
}

// lotKey keys the parkingLot in a connection's context: set only for
// connections a poll may park (parkable).
type lotKey struct{}

func newParkingLot(ln net.Listener, idleTimeout time.Duration) *parkingLot {
	return &parkingLot{Listener: ln, idleTimeout: idleTimeout, back: make(chan net.Conn), in: make(chan accepted),
		done: make(chan struct{}), polls: map[*parkedPoll]struct{}{}}
}

// parkOn makes hs serve from a parkingLot over ln, which it returns: the
// listener to serve.
func (s *Server) parkOn(hs *http.Server, ln net.Listener) *parkingLot {
	lot := newParkingLot(ln, s.limits.IdleTimeout)
	next := hs.ConnContext
	hs.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if next != nil {
			ctx = next(ctx, c)
		}
		if parkable(c) {
			ctx = context.WithValue(ctx, lotKey{}, lot)
		}
		return ctx
	}
	return lot
}

// parkingFor is where a request's poll may park its connection; nil when
// it may not.
func parkingFor(r *http.Request) *parkingLot {
	lot, _ := r.Context().Value(lotKey{}).(*parkingLot)
	return lot
}

// Accept returns the next connection handed back or accepted below,
// whichever comes first.
func (l *parkingLot) Accept() (net.Conn, error) {
	// One goroutine accepts below, so that Accept can also wait for
	// the connections handed back.
	l.pumpOnce.Do(func() { go l.pump() })
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.in:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *parkingLot) pump() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.in <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
	}
}

// Close closes the listener below; connections handed back from now on
// are closed.
func (l *parkingLot) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.Listener.Close()
	})
	return l.closeErr
}

// handBack gives an answered connection back to the http.Server; false
// when it no longer accepts.
func (l *parkingLot) handBack(c net.Conn) bool {
	select {
	case l.back <- c:
		return true
	case <-l.done:
		return false
	}
}

// add registers a parked poll; false once the lot drains.
func (l *parkingLot) add(pp *parkedPoll) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drains {
		return false
	}
	l.polls[pp] = struct{}{}
	return true
}

func (l *parkingLot) remove(pp *parkedPoll) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.polls, pp)
	if len(l.polls) == 0 && l.empty != nil {
		close(l.empty)
		l.empty = nil
	}
}

// drain, once the server closed (its parked polls answer at once), closes
// the connections kept idle for a next request, waits until ctx is done
// for the polls still answering, and then closes theirs too.
func (l *parkingLot) drain(ctx context.Context) {
	l.mu.Lock()
	l.drains = true
	empty := make(chan struct{})
	if len(l.polls) == 0 {
		close(empty)
	} else {
		l.empty = empty
	}
	for pp := range l.polls {
		if pp.idle.Load() {
			_ = pp.conn.Close()
		}
	}
	l.mu.Unlock()
	select {
	case <-empty:
		return
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for pp := range l.polls {
		_ = pp.conn.Close()
	}
}

// parkedPoll is a poll waiting on a connection of its own.
type parkedPoll struct {
	conn net.Conn
	raw  syscall.RawConn
	ps   *pollState
	lot  *parkingLot
	// header is what the handler had set on its writer before it parked
	// (nil for none), for the answer.
	header http.Header
	// For the request log line.
	method, route string
	start         time.Time
	// chatty: the daemon sent bytes while it waited for this answer,
	// so the connection closes after it.
	chatty bool
	// answered: the answer is written.
	answered bool
	// idle: answered, waiting for the daemon's next request.
	idle atomic.Bool
	// stirred is closed once the socket watch (watchSocket) ended, sock
	// then saying what it found.
	stirred chan struct{}
	sock    socketState
	// left: the in-flight slot the poll held is given back.
	left bool
}

// parkable reports whether a connection's socket can be looked at without
// reading from it, which a parked poll needs.
func parkable(c net.Conn) bool { return rawConnOf(c) != nil }

// rawConnOf is the socket under c (under TLS and the per-address cap), or
// nil.
func rawConnOf(c net.Conn) syscall.RawConn {
	for {
		switch x := c.(type) {
		case *tls.Conn:
			c = x.NetConn()
			continue
		case *countedConn:
			c = x.NetConn()
			continue
		}
		break
	}
	sc, ok := c.(syscall.Conn)
	if !ok || !canPeek {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// parkConn takes the connection of a poll about to park from net/http and
// parks the poll on it, subscribed to woken; false, with nothing changed,
// when it cannot.
func (s *Server) parkConn(lot *parkingLot, w http.ResponseWriter, r *http.Request, ps *pollState, woken <-chan struct{}, release func()) bool {
	if r.ProtoMajor != 1 || r.ProtoMinor < 1 || r.Close {
		return false
	}
	// The wait goes on once the handler returned: it holds a slot of
	// its own, so Close does not close the store under it.
	if !s.inflight.enter() {
		return false
	}
	pp := &parkedPoll{ps: ps, lot: lot, method: r.Method, route: r.Pattern, start: time.Now()}
	if h := w.Header(); len(h) > 0 {
		pp.header = h.Clone()
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.inflight.leave()
		return false
	}
	pp.conn, pp.raw = conn, rawConnOf(conn)
	// What net/http read past the request: the daemon did not wait for
	// this answer.
	pp.chatty = brw.Reader.Buffered() > 0
	if sw := statusWriterOf(w); sw != nil {
		sw.parked = true
		pp.start = sw.start
	}
	switch {
	case r.Context().Err() != nil:
		// The daemon went away as the poll parked (net/http's
		// background read saw it): answer nothing.
		release()
		ps.timer.Stop()
		_ = conn.Close()
		s.inflight.leave()
		return true
	case !lot.add(pp):
		// Serve is done and drains: the poll answers at once, as
		// every poll does once the server closes.
		release()
		ps.timer.Stop()
		s.answerParked(context.Background(), pp)
		return true
	}
	s.parkings.Add(1)
	go s.waitParked(pp, woken, release)
	return true
}

// statusWriterOf finds the middleware's statusWriter under w.
func statusWriterOf(w http.ResponseWriter) *statusWriter {
	for {
		switch x := w.(type) {
		case *statusWriter:
			return x
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return nil
		}
	}
}

// waitParked is a parked poll's wait: the handler's, but for the watch on
// the socket (net/http's background read did it: a daemon that goes away
// is noticed at once, its connection closed and its per-address slot
// given back) and the answer written by hand.
func (s *Server) waitParked(pp *parkedPoll, woken <-chan struct{}, release func()) {
	defer s.recoverParked(pp)
	// Nothing cancels a parked poll's store calls but their own bounds:
	// the request's context is gone with the request.
	ctx := context.Background()
	ps := pp.ps
	watchSocket(pp)
	for !pp.chatty {
		var offer *handoff
		if !ps.legacy && !ps.watch {
			offer = s.handoffs.offer(ps.view.id, ps.after)
		}
		end := s.park(workerKey(ps.view.id), woken, release, ps.timer.C, pp.stirred)
		handed := false
		if offer != nil && s.handoffs.withdraw(ps.view.id, offer) {
			<-offer.done
			if handed = len(offer.cmds) > 0; handed {
				ps.cmds, ps.err, ps.deliveredGen, ps.takenAt = offer.cmds, nil, offer.gen, offer.takenAt
			}
		}
		if end == parkOver {
			break
		}
		var st socketState
		if end == parkWoken {
			// Right before it may take: a legacy daemon's command
			// taken for a closed connection would be lost.
			st = peekSocket(pp.raw)
		} else {
			st = pp.sock // stirred: the watch is over
		}
		switch st {
		case socketGone:
			ps.logger().Debug().Msg("poll abandoned by the daemon while parked; nothing taken")
			s.dropParked(pp)
			return
		case socketData:
			pp.chatty = true
			continue
		}
		if end == parkGone {
			// Stirred, but nothing to read: not a socket to trust.
			pp.chatty = true
			continue
		}
		if handed {
			break
		}
		var due bool
		if woken, release, due = s.lookPoll(ctx, ps); due {
			break
		}
	}
	if pp.chatty {
		release()
	}
	ps.timer.Stop()
	s.answerParked(ctx, pp)
}

// watchSocket waits, in a goroutine of its own with the smallest stack,
// until pp's socket has something to read, is closed or passes its read
// deadline, notes which in pp.sock and closes pp.stirred. While the poll
// waits that is the daemon going away (or talking out of turn); once it
// is answered, the daemon's next request arriving.
func watchSocket(pp *parkedPoll) {
	pp.stirred = make(chan struct{})
	go func() {
		pp.sock = waitReadable(pp.raw)
		close(pp.stirred)
	}()
}

// answerParked writes a parked poll's answer and hands its connection
// back, or closes it.
func (s *Server) answerParked(ctx context.Context, pp *parkedPoll) {
	pw := &parkedWriter{header: pp.header}
	s.endPoll(ctx, pw, pp.ps)
	s.leaveParked(pp)
	if pw.status == 0 {
		s.dropParked(pp)
		return
	}
	keep := !pp.chatty && !s.isClosing()
	if err := s.writeParked(pp, pw, keep); err != nil || !keep {
		if err != nil {
			pp.ps.logger().Debug().Err(err).Msg("poll answer not delivered: the connection failed")
		}
		s.dropParked(pp)
		return
	}
	s.handBackParked(pp)
}

// writeParked writes what pw holds as an HTTP/1.1 response, bounded by
// WriteTimeout like any answer, and logs the request.
func (s *Server) writeParked(pp *parkedPoll, pw *parkedWriter, keep bool) error {
	pp.answered = true
	_ = pp.conn.SetWriteDeadline(time.Now().Add(s.limits.WriteTimeout))
	_, err := pp.conn.Write(pw.response(keep))
	_ = pp.conn.SetWriteDeadline(time.Time{})
	s.logRequest(pp.method, pp.route, pw.status, pp.start)
	return err
}

// handBackParked waits, as net/http does for a kept-alive connection, up
// to IdleTimeout for the daemon's next request to start arriving (the
// socket watch goes on), and then hands the connection back to the
// http.Server.
func (s *Server) handBackParked(pp *parkedPoll) {
	pp.idle.Store(true)
	if s.isClosing() || pp.stirred == nil {
		s.dropParked(pp)
		return
	}
	_ = pp.conn.SetReadDeadline(time.Now().Add(pp.lot.idleTimeout))
	<-pp.stirred
	_ = pp.conn.SetReadDeadline(time.Time{})
	if pp.sock != socketData {
		s.dropParked(pp)
		return
	}
	pp.lot.remove(pp)
	if !pp.lot.handBack(pp.conn) {
		_ = pp.conn.Close()
	}
}

// leaveParked gives back the poll's in-flight slot, once.
func (s *Server) leaveParked(pp *parkedPoll) {
	if !pp.left {
		pp.left = true
		s.inflight.leave()
	}
}

// dropParked closes the poll's connection and forgets it.
func (s *Server) dropParked(pp *parkedPoll) {
	s.leaveParked(pp)
	_ = pp.conn.Close()
	pp.lot.remove(pp)
}

// recoverParked is the middleware's last resort for a parked poll: a
// panic is logged and answered 500, and the connection closed.
func (s *Server) recoverParked(pp *parkedPoll) {
	p := recover()
	if p == nil {
		return
	}
	s.log.Error().Str("method", pp.method).Str("route", pp.route).
		Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).Msg("handler panicked")
	if !pp.answered {
		pw := &parkedWriter{}
		writeJSON(pw, http.StatusInternalServerError, operatorapi.Error{Error: "internal error"})
		_ = s.writeParked(pp, pw, false)
	}
	s.dropParked(pp)
}

func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// parkedWriter collects a parked poll's answer.
type parkedWriter struct {
	header http.Header
	status int
	body   []byte
}

func (w *parkedWriter) Header() http.Header {
	if w.header == nil {
		w.header = http.Header{}
	}
	return w.header
}

func (w *parkedWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *parkedWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.body = append(w.body, p...)
	return len(p), nil
}

// response is the answer as net/http would have put it on the wire: the
// status line, the headers with Date and Content-Length, the body.
func (w *parkedWriter) response(keep bool) []byte {
	h := w.Header()
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	h.Set("Content-Length", strconv.Itoa(len(w.body)))
	if !keep {
		h.Set("Connection", "close")
	}
	b := make([]byte, 0, 160+len(w.body))
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(w.status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(w.status)...)
	b = append(b, "\r\n"...)
	buf := appendWriter{b}
	_ = h.Write(&buf)
	b = append(buf.b, "\r\n"...)
	return append(b, w.body...)
}

// appendWriter is an io.Writer appending to a slice.
type appendWriter struct{ b []byte }

func (a *appendWriter) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
}

// What a look at a parked connection's socket found.
type socketState int

const (
	socketQuiet socketState = iota // nothing to read: the daemon waits
	socketData                     // bytes to read
	socketGone                     // closed or failed
)
