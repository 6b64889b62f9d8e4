package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/opclient"
	"nymph/lakeshore/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Defaults of Config's zero fields.
const (
	DefaultIdleTimeout = 2 * time.Hour
	DefaultMaxAge      = 12 * time.Hour
	DefaultRefresh     = 2 * time.Second
	DefaultLoginBurst  = 10
	DefaultLoginWindow = time.Minute
)

// cookieName names the session cookie.
const cookieName = "lakeshore_session"

// maxForm bounds a form body: a command, a few fields.
const maxForm = 64 << 10

// Sessions is what the dashboard keeps in the store.
type Sessions interface {
	CreateSession(ctx context.Context, s store.Session) error
	TouchSession(ctx context.Context, idHash string, now time.Time, idle time.Duration) (store.Session, error)
	DeleteSession(ctx context.Context, idHash string) error
}

// Config configures a Dashboard.
type Config struct {
	// API serves the operator API (the /v1 routes); the dashboard calls it
	// in-process with Token, the admin token, which is also what the login
	// form takes.
	API   http.Handler
	Token string
	// Namespace is the one the pages show; "" is the default namespace.
	Namespace string
	Sessions  Sessions
	// Secure marks the cookie Secure: the control plane serves TLS.
	Secure bool
	Logger zerolog.Logger
	// Now is the clock of session expiry; nil is time.Now.
	Now func() time.Time
	// IdleTimeout ends a session unused that long, MaxAge any session
	// that old.
	IdleTimeout, MaxAge time.Duration
	// Refresh is how often a live page re-reads what it shows.
	Refresh time.Duration
	// LoginBurst login attempts are allowed per remote address in each
	// LoginWindow.
	LoginBurst  int
	LoginWindow time.Duration
	// Done ends every live stream (the control plane is shutting down).
	Done <-chan struct{}
}

// Dashboard serves the pages.
type Dashboard struct {
	cfg    Config
	api    *opclient.Client
	log    zerolog.Logger
	pages  *pages
	logins *limiter
	assets http.Handler
}

// New builds a Dashboard over cfg.
func New(cfg Config) (*Dashboard, error) {
	if cfg.API == nil || cfg.Token == "" || cfg.Sessions == nil {
		return nil, errors.New("dashboard: API, Token and Sessions are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.LoginBurst <= 0 {
		cfg.LoginBurst = DefaultLoginBurst
	}
	if cfg.LoginWindow <= 0 {
		cfg.LoginWindow = DefaultLoginWindow
	}
	// The URL only shapes the requests; inProcess answers them all.
	api, err := opclient.New("http://in-process", cfg.Token, opclient.Options{
		Namespace: cfg.Namespace, HTTPClient: &http.Client{Transport: inProcess{cfg.API}},
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	p, err := parsePages()
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	sub, err := fs.Sub(assetFS, "assets")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return &Dashboard{cfg: cfg, api: api, log: cfg.Logger, pages: p,
		logins: newLimiter(cfg.LoginBurst, cfg.LoginWindow, cfg.Now),
		assets: http.StripPrefix("/assets/", http.FileServerFS(sub))}, nil
}

// Mount registers the pages on mux, beside the routes already there
// (the operator API's /v1 routes and the probes keep their patterns).
func (d *Dashboard) Mount(mux *http.ServeMux) {
	for pattern, h := range map[string]http.HandlerFunc{
		"GET /{$}":                    d.handleRoot,
		"GET /login":                  d.handleLoginForm,
		"POST /login":                 d.handleLogin,
		"POST /logout":                d.authed(d.handleLogout),
		"GET /fleet":                  d.authed(d.handleFleet),
		"GET /fleet/live":             d.authedStream(d.handleFleetLive),
		"GET /daemons/{id}":           d.authed(d.handleDaemon),
		"POST /daemons/{id}/{action}": d.authed(d.handleAction),
		"GET /execs":                  d.authed(d.handleExecs),
		"GET /execs/{id}":             d.authed(d.handleExec),
		"GET /execs/{id}/live":        d.authedStream(d.handleExecLive),
		"GET /invocations":            d.authed(d.handleInvocations),
		"GET /invocations/{id}":       d.authed(d.handleInvocation),
		"GET /invocations/{id}/live":  d.authedStream(d.handleInvocationLive),
		"GET /assets/":                d.handleAsset,
	} {
		mux.HandleFunc(pattern, h)
	}
}

func (d *Dashboard) handleAsset(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-cache")
	d.assets.ServeHTTP(w, r)
}

func (d *Dashboard) handleRoot(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}

// sessionHandler is a page handler given the request's session.
type sessionHandler func(w http.ResponseWriter, r *http.Request, s store.Session)

// authed admits a request with a live session (sending any other to the
// login page) and, for a POST, a valid CSRF token and origin.
func (d *Dashboard) authed(next sessionHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		s, err := d.session(r)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				d.log.Error().Err(err).Msg("read session")
				d.fail(w, http.StatusServiceUnavailable, "The session store did not answer; try again.")
				return
			}
			if r.Method == http.MethodGet {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			d.renderLogin(w, http.StatusUnauthorized, "Your session has ended: log in again.")
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if err := r.ParseForm(); err != nil {
				d.failS(w, s, http.StatusBadRequest, "The form could not be read.")
				return
			}
			if !sameOrigin(r) || !sameSecret(r.PostForm.Get("csrf"), s.CSRF) {
				d.failS(w, s, http.StatusForbidden, "The form was refused: its CSRF token is missing or wrong, or it came from another site. Reload the page and try again.")
				return
			}
		}
		next(w, r, s)
	}
}

// authedStream admits an event stream with a live session; any other gets
// a bare 401, which an EventSource takes as the end.
func (d *Dashboard) authedStream(next sessionHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, err := d.session(r)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				d.log.Error().Err(err).Msg("read session")
				http.Error(w, "session store unavailable", http.StatusServiceUnavailable)
				return
			}
			http.Error(w, "not logged in", http.StatusUnauthorized)
			return
		}
		next(w, r, s)
	}
}

// session finds the request's live session and extends it.
func (d *Dashboard) session(r *http.Request) (store.Session, error) {
	c, err := r.Cookie(cookieName)
	if err != nil || !validSessionID(c.Value) {
		return store.Session{}, store.ErrNotFound
	}
	return d.cfg.Sessions.TouchSession(r.Context(), hashID(c.Value), d.cfg.Now(), d.cfg.IdleTimeout)
}

// alive reports whether the stream's session still holds (a logout
// elsewhere ends it).
func (d *Dashboard) alive(r *http.Request) bool {
	_, err := d.session(r)
	return err == nil
}

func (d *Dashboard) handleLoginForm(w http.ResponseWriter, r *http.Request) {
	secure(w)
	if _, err := d.session(r); err == nil {
		http.Redirect(w, r, "/fleet", http.StatusSeeOther)
		return
	}
	d.renderLogin(w, http.StatusOK, "")
}

func (d *Dashboard) handleLogin(w http.ResponseWriter, r *http.Request) {
	secure(w)
	if !d.logins.allow(remoteHost(r)) {
		w.Header().Set("Retry-After", fmt.Sprint(int(d.cfg.LoginWindow.Seconds())))
		d.renderLogin(w, http.StatusTooManyRequests, "Too many login attempts from your address; wait a minute.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		d.renderLogin(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	if !sameOrigin(r) {
		d.renderLogin(w, http.StatusForbidden, "The login form came from another site.")
		return
	}
	if !sameSecret(strings.TrimSpace(r.PostForm.Get("token")), d.cfg.Token) {
		d.log.Info().Str("remote", remoteHost(r)).Msg("dashboard login refused: wrong token")
		d.renderLogin(w, http.StatusUnauthorized, "Wrong admin token.")
		return
	}
	id, csrf := randomToken(), randomToken()
	now := d.cfg.Now()
	s := store.Session{IDHash: hashID(id), CSRF: csrf, CreatedAt: now,
		ExpiresAt: now.Add(min(d.cfg.IdleTimeout, d.cfg.MaxAge)), AbsoluteAt: now.Add(d.cfg.MaxAge)}
	if err := d.cfg.Sessions.CreateSession(r.Context(), s); err != nil {
		d.log.Error().Err(err).Msg("create session")
		d.renderLogin(w, http.StatusServiceUnavailable, "The session could not be stored; try again.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/", HttpOnly: true, Secure: d.cfg.Secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(d.cfg.MaxAge.Seconds())})
	d.log.Info().Str("remote", remoteHost(r)).Msg("dashboard login")
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}

func (d *Dashboard) handleLogout(w http.ResponseWriter, r *http.Request, s store.Session) {
	if err := d.cfg.Sessions.DeleteSession(r.Context(), s.IDHash); err != nil {
		d.log.Error().Err(err).Msg("delete session")
		d.failS(w, s, http.StatusServiceUnavailable, "The session could not be ended; try again.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", HttpOnly: true, Secure: d.cfg.Secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// secure sets the headers of every page: no framing, no inline script,
// nothing from elsewhere, nothing cached.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
}

// sameOrigin checks Origin, else Referer, when the browser sent one: a
// form posted from another site is refused even before its CSRF token is
// looked at.
func sameOrigin(r *http.Request) bool {
	src := r.Header.Get("Origin")
	if src == "" {
		src = r.Header.Get("Referer")
	}
	if src == "" {
		return true
	}
	u, err := url.Parse(src)
	return err == nil && u.Host == r.Host
}

// sameSecret compares in constant time (of the hashes, so the length of
// the secret does not leak either).
func sameSecret(got, want string) bool {
	if got == "" || want == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// randomToken is 256 random bits, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// validSessionID screens a cookie before it is hashed and looked up.
func validSessionID(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == 32
}

// hashID is what the store keeps of a session id.
func hashID(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limiter allows burst attempts per key in each window.
type limiter struct {
	mu     sync.Mutex
	burst  int
	window time.Duration
	now    func() time.Time
	start  time.Time
	counts map[string]int
}

// maxLimiterKeys bounds the memory of one window; past it, addresses not
// seen yet in the window wait for the next.
const maxLimiterKeys = 100_000

func newLimiter(burst int, window time.Duration, now func() time.Time) *limiter {
	return &limiter{burst: burst, window: window, now: now, counts: map[string]int{}}
}

func (l *limiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now := l.now(); now.Sub(l.start) >= l.window || now.Before(l.start) {
		l.start, l.counts = now, map[string]int{}
	}
	n, seen := l.counts[key]
	if n >= l.burst || (!seen && len(l.counts) >= maxLimiterKeys) {
		return false
	}
	l.counts[key] = n + 1
	return true
}
