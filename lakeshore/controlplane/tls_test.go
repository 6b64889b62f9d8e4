package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/test/fakeclock"
	"nymph/test/harness"

	"github.com/rs/zerolog"
)

// lockedBuffer collects the server log so tests can see the reasons that
// are kept out of responses.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// tlsEnv is a control plane served by Serve over HTTPS on loopback, with a
// client that trusts the test CA.
type tlsEnv struct {
	t      testing.TB
	srv    *Server
	url    string
	client *http.Client
	clock  *fakeclock.Clock
	log    *lockedBuffer
}

func newTLSEnv(t testing.TB, opts ...envOpt) *tlsEnv {
	t.Helper()
	dir := t.TempDir()
	ca := harness.NewCA(t)
	certFile, keyFile, _ := ca.Issue(t)
	e := &tlsEnv{t: t, clock: fakeclock.New(time.Now().UTC().Truncate(time.Second)), log: &lockedBuffer{}}
	cfg := Config{
		DataDir:     filepath.Join(dir, "data"),
		AdminToken:  testAdmin,
		DaemonToken: testDaemon,
		Logger:      zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), e.log)).Level(zerolog.InfoLevel),
		Now:         e.clock.Now,
		TLSCertFile: certFile,
		TLSKeyFile:  keyFile,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv.pollCap = 50 * time.Millisecond
	addr, cancel, served := serveLoopback(t, srv)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}}
	e.srv, e.url, e.client = srv, "https://"+addr, &http.Client{Transport: tr, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		tr.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func TestServeSpeaksTLSWithTheConfiguredCertificate(t *testing.T) {
	e := newTLSEnv(t)
	req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/namespaces/default/workers", nil)
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	r, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("with the CA: %v", err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK || r.TLS == nil {
		t.Fatalf("status %d, tls %v", r.StatusCode, r.TLS != nil)
	}
	if got := e.srv.currentPublicURL(""); !strings.HasPrefix(got, "https://127.0.0.1:") {
		t.Fatalf("derived public URL %q", got)
	}

	// The system roots do not know the test CA.
	_, err = (&http.Client{Timeout: 10 * time.Second}).Get(e.url + "/v1/namespaces/default/workers")
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("without the CA: %v", err)
	}
	// Plain HTTP to the TLS port gets no API answer.
	r, err = http.Get("http://" + strings.TrimPrefix(e.url, "https://") + "/v1/namespaces/default/workers")
	if err == nil {
		r.Body.Close()
		if r.StatusCode != http.StatusBadRequest {
			t.Fatalf("plain HTTP to the TLS port: %d", r.StatusCode)
		}
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := harness.NewCA(t).Issue(t)
	_, otherKey, _ := harness.NewCA(t).Issue(t)
	for name, files := range map[string][2]string{
		"cert only":         {certFile, ""},
		"key only":          {"", keyFile},
		"missing file":      {filepath.Join(dir, "nope.pem"), keyFile},
		"key of other cert": {certFile, otherKey},
	} {
		_, err := newServer(context.Background(), Config{
			DataDir: filepath.Join(t.TempDir(), "data"), AdminToken: testAdmin, Logger: zerolog.Nop(),
			TLSCertFile: files[0], TLSKeyFile: files[1],
		})
		if err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
