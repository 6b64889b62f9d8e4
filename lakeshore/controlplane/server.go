package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nymph/lakeshore/blobs"
	"nymph/lakeshore/dashboard"

	"github.com/rs/zerolog"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/releases"
	"nymph/lakeshore/store"
)

// Config configures a Server.
type Config struct {
	// Addr is where `serve` listens; it is only used to derive PublicURL
	// when that is empty and no listener says better.
	Addr string
	// DataDir, an existing directory, holds the generated admin token
	// (admin-token). Only needed without AdminToken.
	DataDir string
	// PublicURL is how daemons reach this server (e.g. "https://cp:7700"); it
	// prefixes the stdout_url of streamed execs.
	PublicURL string
	// AdminToken guards the operator routes. Empty means: the one kept in
	// DataDir/admin-token, generated on first start.
	AdminToken string
	// DaemonToken is an optional shared bootstrap bearer for daemons, beside
	// the tokens minted through the operator API.
	DaemonToken string
	// Logger receives every log line.
	Logger zerolog.Logger
	// Store holds the state (required). Close closes it; if New fails, it
	// is still the caller's to close.
	Store store.Store
	// Payloads is the directory a lone control plane keeps payload blobs
	// in; nil means none, and the payload routes say so.
	Payloads *PayloadStore
	// Releases keeps the published binaries; nil means none, and the
	// release routes say so.
	Releases *releases.Store
	// Blobs, when set, is a blob store the replicas share (a bucket):
	// payloads are kept in it under "payloads/" and releases under
	// "releases/", and Payloads and Releases are not used. Presigned
	// payload URLs are then the bucket's own.
	Blobs blobs.Store
	// BlobsPublicURL, with Blobs, is a public URL of the bucket prefix
	// (a CDN or an R2 public domain): release downloads are handed out
	// under it instead of through this control plane's release route,
	// which redirects to a short-lived presigned URL.
	BlobsPublicURL string
	// PayloadRetention is how long a payload is kept after the job that
	// holds it finished (or after its upload, when no job holds it);
	// zero means DefaultPayloadRetention, negative keeps them forever.
	PayloadRetention time.Duration
	// PayloadURLTTL is how long a presigned payload URL stays valid; zero
	// means operatorapi.PayloadTTL.
	PayloadURLTTL time.Duration
	// PayloadSweepInterval is how often expired payloads are deleted;
	// zero means a tenth of the retention, at most ten minutes.
	PayloadSweepInterval time.Duration
	// Notifier carries wake-ups to and from the other replicas sharing
	// Store; nil keeps them in this process (one control plane). Signature
	// nonces are recorded in Store either way, so a request replayed to
	// another replica, or after a restart, is refused.
	Notifier Notifier
	// Now is the clock; nil means time.Now. Stale derivation, deadlines and
	// timestamps all read it.
	Now func() time.Time
	// StaleAfter is how long a worker may go unseen before it reads back
	// stale; zero means operatorapi.StaleAfter. Tests shorten it.
	StaleAfter time.Duration
	// LostAfter is how long a worker may go unseen before its running execs
	// and invocations are resolved as lost; zero means DefaultLostAfter, or
	// StaleAfter when that is longer. It may not be shorter than
	// StaleAfter: a worker is not even stale before that.
	LostAfter time.Duration
	// RequireSignatures turns away unsigned daemon requests: hellos without
	// a signature or an enrollment token, and bearer-only requests on the
	// signature-guarded routes and the exec callbacks
	// (LAKESHORE_REQUIRE_DAEMON_SIGNATURES=1).
	RequireSignatures bool
	// KeyRotationMaxAge, when positive, queues rotate_key for a daemon whose
	// key is older, and is advertised as hello's key_rotation_max_age_s.
	KeyRotationMaxAge time.Duration
	// KeyRequestRate is how many signed requests a second one daemon key
	// may sustain and KeyRequestBurst how many it may send at once; a key
	// past them is answered 429 with Retry-After, and no other key is
	// slowed. Zero takes DefaultKeyRequestRate and DefaultKeyRequestBurst;
	// a negative rate throttles nothing.
	KeyRequestRate  float64
	KeyRequestBurst int
	// NoncePurgeInterval is how often expired nonces are dropped from
	// Store; zero means DefaultNoncePurgeInterval. Tests shorten it.
	NoncePurgeInterval time.Duration
	// TLSCertFile and TLSKeyFile (PEM), both or neither, make Serve speak
	// HTTPS.
	TLSCertFile string
	TLSKeyFile  string
	// Limits bound slow clients (deadlines.go); zero fields are defaults.
	Limits Limits
	// MaxConnsPerIP caps the connections Serve keeps open at once from
	// one remote address; 0 is no cap.
	MaxConnsPerIP int
	// DashboardRefresh is how often a live dashboard page re-reads the
	// fleet; zero means dashboard.DefaultRefresh.
	DashboardRefresh time.Duration
	// MetricsToken, when set, serves GET /metrics on the main listener to
	// that bearer (or the admin token); unset, /metrics there is a 404
	// saying how to serve it (metrics.go).
	MetricsToken string
	// MetricsAddr, when set, is a listener of its own that New binds (and
	// fails to start without) and Serve serves GET /metrics on,
	// unauthenticated: for a scraper on a network the operator trusts.
	MetricsAddr string
	// MetricsListener, instead of MetricsAddr, is that listener bound by
	// the caller (serve binds it before it opens anything); Close closes
	// it.
	MetricsListener net.Listener
	// OpenProvider opens the launcher of a registered provider; nil
	// leaves the control plane unable to launch (the provider routes say
	// so). Its launchers keep their files under DataDir/providers.
	OpenProvider OpenProvider
}

// Caps on how long one request may wait for something to happen.
const (
	maxPollWait = 20 * time.Second
	maxExecWait = 20 * time.Second
	pollBatch   = 64
	outputPage  = 1 << 20
)

// Server is the control plane.
type Server struct {
	log               zerolog.Logger
	st                store.Store
	now               func() time.Time
	staleAfter        time.Duration
	lostAfter         time.Duration
	adminToken        string
	adminTokenCreated bool
	daemonToken       string
	publicURL         atomic.Pointer[string]
	addr              string
	wake              *hub
	presence          *presence
	handedOver        *deliveredExecs
	waiting           waitingExecs
	handoffs          *handoffs
	caches            *caches
	handler           http.Handler
	rel               releaseState
	launchers         *launcherCache
	payloads          *payloads
	ident             *identityState
	nonces            *nonceLedger
	tls               *tls.Config
	limits            Limits
	maxConnsPerIP     int
	metrics           *metrics
	metricsHTTP       http.Handler
	metricsToken      string
	metricsLn         net.Listener
	metricsOnce       sync.Once

	// Tests shorten these; the protocol fixes them at 20 s.
	pollCap time.Duration
	waitCap time.Duration
	// parked, when set, is told each time a long-poll is about to block on
	// its wake-up key, so tests can act at exactly that point.
	parked func(key string)
	// parkings counts the polls that parked their connection
	// (parked.go), for tests.
	parkings atomic.Int64

	closing   chan struct{}
	closeOnce sync.Once
	inflight  gate
	closeErr  error
	storeOnce sync.Once
	// stopNotifier ends the exchange of wake-ups with other replicas.
	stopNotifier func()
}

// gate counts requests in flight and, once closed, admits no more, so Close
// can wait for the store's last user before closing it.
type gate struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when closed and n reaches 0
}

func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.n++
	return true
}

func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.closed && g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// close stops admitting and returns a channel closed once nobody is inside.
func (g *gate) close() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	ch := make(chan struct{})
	if g.n == 0 {
		close(ch)
	} else {
		g.idle = ch
	}
	return ch
}

// New opens the admin token and builds the routes over the stores cfg
// hands it.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("controlplane: Store is required")
	}
	s := &Server{
		log:         cfg.Logger,
		st:          cfg.Store,
		now:         cfg.Now,
		staleAfter:  cfg.StaleAfter,
		lostAfter:   cfg.LostAfter,
		daemonToken: cfg.DaemonToken,
		addr:        cfg.Addr,
		wake:        newHub(),
		rel:         newReleaseState(cfg),
		launchers:   &launcherCache{open: cfg.OpenProvider},
		pollCap:     maxPollWait,
		waitCap:     maxExecWait,
		closing:     make(chan struct{}),
	}
	var err error
	if s.limits, err = cfg.Limits.withDefaults(); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	// A lone control plane hears of every change; replicas once they
	// listen to each other.
	s.caches = newCaches(cfg.Notifier == nil)
	if cfg.DataDir != "" {
		s.launchers.dir = filepath.Join(cfg.DataDir, "providers")
	}
	s.presence = newPresence(&s.caches.live)
	s.handedOver = newDeliveredExecs(maxDeliveredExecs)
	s.handoffs = newHandoffs()
	if s.maxConnsPerIP = cfg.MaxConnsPerIP; s.maxConnsPerIP < 0 {
		return nil, fmt.Errorf("controlplane: MaxConnsPerIP %d: must not be negative", cfg.MaxConnsPerIP)
	}
	if s.staleAfter <= 0 {
		s.staleAfter = operatorapi.StaleAfter
	}
	switch {
	case s.lostAfter <= 0:
		s.lostAfter = max(DefaultLostAfter, s.staleAfter)
	case s.lostAfter < s.staleAfter:
		return nil, fmt.Errorf("controlplane: LostAfter %v is shorter than StaleAfter %v", s.lostAfter, s.staleAfter)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if cfg.PublicURL != "" {
		u := strings.TrimRight(cfg.PublicURL, "/")
		s.publicURL.Store(&u)
	}
	if cfg.DataDir == "" && cfg.AdminToken == "" {
		return nil, errors.New("controlplane: DataDir is required")
	}
	s.adminToken, s.adminTokenCreated, err = loadAdminToken(cfg.DataDir, cfg.AdminToken)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if s.tls, err = loadTLS(cfg.TLSCertFile, cfg.TLSKeyFile); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	// Every accepted nonce is committed to the store, group-committed, so
	// neither a restart nor another replica lets its replay through.
	s.nonces = newNonceLedger(s.st, nonceBatch)
	rate, burst := cfg.KeyRequestRate, cfg.KeyRequestBurst
	if rate == 0 {
		rate = DefaultKeyRequestRate
	}
	if burst <= 0 {
		burst = DefaultKeyRequestBurst
	}
	s.ident = newIdentityState(s.st, s.caches, cfg.RequireSignatures, cfg.KeyRotationMaxAge,
		identity.WithNonceLedger(s.nonces), identity.WithKeyRate(rate, burst))
	if cfg.Blobs == nil {
		if err := cfg.Payloads.migrateLegacy(s.log); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	if s.payloads, err = openPayloads(cfg, payloadURLKey(s.adminToken), s.now); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	s.metrics = newMetrics(s, cfg.Notifier != nil && isSentListener(cfg.Notifier))
	s.metricsHTTP, s.metricsToken = s.metricsHandler(), cfg.MetricsToken
	if o, ok := s.st.(opObservable); ok {
		o.ObserveOps(s.metrics.observeOp)
	}
	mux := s.routes()
	// The dashboard drives the operator API through mux itself, and its
	// pages are mounted beside it.
	dash, err := dashboard.New(dashboard.Config{
		API: mux, Token: s.adminToken, Sessions: s.st, Secure: s.tls != nil, Now: s.now, Done: s.closing,
		Refresh: cfg.DashboardRefresh, Logger: s.log.With().Str("component", "dashboard").Logger(),
	})
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	dash.Mount(mux)
	if s.metricsLn = cfg.MetricsListener; s.metricsLn == nil {
		if s.metricsLn, err = listenMetrics(cfg.MetricsAddr); err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
	}
	s.handler = s.middleware(mux)
	// Before the sweeper, whose first broadcast may come at once.
	if cfg.Notifier != nil {
		s.stopNotifier = s.startNotifier(cfg.Notifier)
	}
	s.startSweeper()
	s.startPresenceFlush()
	purge := cfg.NoncePurgeInterval
	if purge <= 0 {
		purge = DefaultNoncePurgeInterval
	}
	s.startNoncePurge(purge)
	s.startSessionPurge(purge)
	s.startPayloadRetention(cfg.PayloadSweepInterval)
	return s, nil
}

// AdminToken is the token the operator routes accept.
func (s *Server) AdminToken() string { return s.adminToken }

// AdminTokenCreated reports whether New generated the admin token just now
// (so `serve` prints it once).
func (s *Server) AdminTokenCreated() bool { return s.adminTokenCreated }

// Handler serves every route.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve serves on ln until ctx is cancelled, then shuts down gracefully:
// long-polls answer at once, other requests get a few seconds to finish.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.publicURL.Load() == nil {
		u := s.scheme() + "://" + advertisedAddr(ln.Addr(), s.addr)
		s.publicURL.CompareAndSwap(nil, &u)
	}
	if s.maxConnsPerIP > 0 {
		ln = newPerIPListener(ln, s.maxConnsPerIP, s.log)
	}
	// No ReadTimeout or WriteTimeout: they would bound a whole request
	// and its answer, long-polls and followed logs included. The body and
	// each write get deadlines of their own (bound).
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: s.limits.HeaderTimeout,
		IdleTimeout:       s.limits.IdleTimeout,
		ErrorLog:          log.New(s.log.With().Str("component", "http").Logger(), "", 0),
	}
	if s.tls != nil {
		// TLS here rather than in ServeTLS: the parking lot must be
		// above it (parked.go). With "h2" offered, Serve sets up HTTP/2
		// as ServeTLS would.
		cfg := s.tls.Clone()
		cfg.NextProtos = []string{"h2", "http/1.1"}
		srv.TLSConfig = cfg
		ln = tls.NewListener(ln, cfg)
	}
	if s.metricsLn != nil {
		s.metricsOnce.Do(func() { go s.serveMetrics(ctx) })
	}
	lot := s.parkOn(srv, ln)
	defer lot.Close()
	done := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		s.stopWaiting()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The parked connections end beside net/http's own: those
		// idle at once, the others once answered.
		drained := make(chan struct{})
		go func() {
			lot.drain(sctx)
			close(drained)
		}()
		err := srv.Shutdown(sctx)
		<-drained
		done <- err
	}()
	s.log.Info().Str("addr", ln.Addr().String()).Str("public_url", s.currentPublicURL("")).Msg("control plane listening")
	err := srv.Serve(lot)
	if errors.Is(err, http.ErrServerClosed) {
		if serr := <-done; serr != nil {
			return fmt.Errorf("controlplane: shutdown: %w", serr)
		}
		return nil
	}
	s.stopWaiting()
	return fmt.Errorf("controlplane: serve: %w", err)
}

// every runs fn every interval, off the request path, until the server
// closes; each run gets timeout and holds an in-flight slot, so Close
// never closes the store under it.
func (s *Server) every(interval, timeout time.Duration, fn func(ctx context.Context)) {
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-s.closing:
				return
			case <-t.C:
			}
			if !s.inflight.enter() {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			fn(ctx)
			cancel()
			s.inflight.leave()
		}
	}()
}

// Close ends every long-poll, waits for in-flight requests and closes the
// store.
func (s *Server) Close() error {
	s.stopWaiting()
	s.storeOnce.Do(func() {
		select {
		case <-s.inflight.close():
		case <-time.After(10 * time.Second):
			s.log.Warn().Msg("closing the store with requests still in flight")
		}
		// What the last polls noted is written before the store closes.
		s.flushPresence(context.Background(), s.log)
		if s.stopNotifier != nil {
			s.stopNotifier()
		}
		if s.metricsLn != nil {
			// Closed already if Serve served it.
			_ = s.metricsLn.Close()
		}
		s.closeErr = s.st.Close()
	})
	return s.closeErr
}

func (s *Server) stopWaiting() { s.closeOnce.Do(func() { close(s.closing) }) }

// currentPublicURL is the configured public URL, else the listener's, else
// what the caller reached us as.
func (s *Server) currentPublicURL(host string) string {
	if u := s.publicURL.Load(); u != nil {
		return *u
	}
	if host != "" {
		return s.scheme() + "://" + host
	}
	return s.scheme() + "://" + s.addr
}

// advertisedAddr replaces an unspecified listen IP by loopback, which is the
// best guess without a configured public URL.
func advertisedAddr(a net.Addr, fallback string) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return fallback
	}
	host := tcp.IP.String()
	if tcp.IP == nil || tcp.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, fmt.Sprint(tcp.Port))
}

// statusWriter remembers the status for the request log.
type statusWriter struct {
	http.ResponseWriter
	status int
	start  time.Time
	// parked: the handler parked its connection (parked.go), which logs
	// the request once answered.
	parked bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer, so
// a handler can flush a first answer before it waits for the rest.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// middleware puts the request under its deadlines, counts in-flight
// requests, logs each one, and turns a panic into a logged 500 — a last
// resort: every route validates its input first.
func (s *Server) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, start: time.Now()}
		ew, bounded := s.bound(sw, r)
		defer bounded()
		if !s.inflight.enter() {
			writeJSON(ew, http.StatusServiceUnavailable, operatorapi.Error{Error: "the control plane is shutting down"})
			return
		}
		defer s.inflight.leave()
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error().Str("method", r.Method).Str("route", r.Pattern).
					Str("panic", fmt.Sprint(p)).Str("stack", string(debug.Stack())).Msg("handler panicked")
				if sw.status == 0 {
					writeJSON(ew, http.StatusInternalServerError, operatorapi.Error{Error: "internal error"})
				}
			}
			if !sw.parked {
				s.logRequest(r.Method, r.Pattern, sw.status, sw.start)
			}
		}()
		next.ServeHTTP(ew, r)
	})
}

// logRequest is the request log line.
func (s *Server) logRequest(method, route string, status int, start time.Time) {
	ev := s.log.Debug()
	if status >= 500 {
		ev = s.log.Warn()
	}
	took := time.Since(start)
	s.metrics.observeRequest(route, status, took)
	ev.Str("method", method).Str("route", route).Int("status", status).
		Dur("took", took).Msg("request")
}
