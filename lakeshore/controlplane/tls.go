package controlplane

import (
	"crypto/tls"
	"errors"
	"fmt"
)

// loadTLS reads the serving certificate once, at start, so a bad path or a
// key that does not match its certificate stops New instead of the first
// handshake. Both files or neither.
func loadTLS(certFile, keyFile string) (*tls.Config, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, errors.New("TLS needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s, key %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// scheme is what this server speaks, for the URLs it derives.
func (s *Server) scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}
