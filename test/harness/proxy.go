package harness

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is a reverse proxy in front of a control plane that records every
// request it forwards, so a test can count what a daemon asked for (polls,
// release downloads) and when, without reading logs.
type Proxy struct {
	URL string

	mu   sync.Mutex
	seen []ProxyRequest
}

// ProxyRequest is one forwarded request.
type ProxyRequest struct {
	Method string
	Path   string
	At     time.Time
}

// StartProxy forwards to target until the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatalf("proxy target %q: %v", target, err)
	}
	p := &Proxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	// A long-poll cut short by the daemon is routine, not worth a line.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.seen = append(p.seen, ProxyRequest{Method: r.Method, Path: r.URL.Path, At: time.Now()})
		p.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// Requests returns the forwarded requests whose path starts with prefix
// and that arrived at or after since.
func (p *Proxy) Requests(prefix string, since time.Time) []ProxyRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ProxyRequest
	for _, r := range p.seen {
		if strings.HasPrefix(r.Path, prefix) && !r.At.Before(since) {
			out = append(out, r)
		}
	}
	return out
}

// FirstPollAfterHello is when the first poll after the first hello at or
// after since arrived: the moment a (re)started daemon is taking work.
func (p *Proxy) FirstPollAfterHello(since time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	helloSeen := false
	for _, r := range p.seen {
		if r.At.Before(since) {
			continue
		}
		switch r.Path {
		case "/v1/daemon/hello":
			helloSeen = true
		case "/v1/daemon/poll":
			if helloSeen {
				return r.At, true
			}
		}
	}
	return time.Time{}, false
}
