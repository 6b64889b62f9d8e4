package controlplane

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// testCA is a private CA made for one test, and a serving certificate for
// 127.0.0.1 and localhost signed by it.
type testCA struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
}

func newTestCA(t testing.TB, dir string) testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "lakeshore test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "lakeshore test server"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	ca := testCA{
		caFile:   filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "server.pem"),
		keyFile:  filepath.Join(dir, "server-key.pem"),
		pool:     x509.NewCertPool(),
	}
	ca.pool.AddCert(caCert)
	write := func(path, typ string, der []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(ca.caFile, "CERTIFICATE", caDER)
	write(ca.certFile, "CERTIFICATE", srvDER)
	write(ca.keyFile, "EC PRIVATE KEY", keyDER)
	return ca
}

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
	clock  *clock
	log    *lockedBuffer
	ca     testCA
}

func newTLSEnv(t testing.TB, opts ...envOpt) *tlsEnv {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, dir)
	e := &tlsEnv{t: t, clock: &clock{t: time.Now().UTC().Truncate(time.Second)}, log: &lockedBuffer{}, ca: ca}
	cfg := Config{
		DataDir:     filepath.Join(dir, "data"),
		AdminToken:  testAdmin,
		DaemonToken: testDaemon,
		Logger:      zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), e.log)).Level(zerolog.InfoLevel),
		Now:         e.clock.Now,
		TLSCertFile: ca.certFile,
		TLSKeyFile:  ca.keyFile,
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
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}}
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
	ca := newTestCA(t, dir)
	other := newTestCA(t, t.TempDir())
	for name, files := range map[string][2]string{
		"cert only":         {ca.certFile, ""},
		"key only":          {"", ca.keyFile},
		"missing file":      {filepath.Join(dir, "nope.pem"), ca.keyFile},
		"key of other cert": {ca.certFile, other.keyFile},
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
