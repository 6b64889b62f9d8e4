package harness

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a private certificate authority made for one test: the control
// plane's certificate is issued by it, and daemons and the CLI trust it
// through a CA file, as an operator's fleet would.
type CA struct {
	// CertFile is the CA certificate (PEM): [server] ca_file, --ca-file.
	CertFile string
	// Pool holds the CA certificate, for clients inside the test.
	Pool *x509.CertPool

	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA valid for the next day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "nymph e2e test CA"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, key := certify(t, tmpl, nil, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{dir: t.TempDir(), cert: cert, key: key, Pool: x509.NewCertPool()}
	ca.Pool.AddCert(cert)
	ca.CertFile = filepath.Join(ca.dir, "ca.pem")
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// certify makes a key and a certificate of it from tmpl, valid from an hour
// ago for a day, signed by parent (nil: self-signed).
func certify(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// Issue makes a server certificate for 127.0.0.1 and localhost and returns
// its files and the loaded pair.
func (ca *CA) Issue(t testing.TB) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	der, key := certify(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}, ca.cert, ca.key)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(ca.dir, "server-")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", kder)
	pair, err = tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// Client is an HTTP client that trusts only this CA.
func (ca *CA) Client() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: 2 * time.Minute}
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
