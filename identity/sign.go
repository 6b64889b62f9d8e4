package identity

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The four signature headers. Header names are case-insensitive on the
// wire; net/http sends them canonicalised (X-Ls-Key-Id, …).
const (
	HeaderKeyID     = "X-LS-Key-Id"
	HeaderTimestamp = "X-LS-Timestamp"
	HeaderNonce     = "X-LS-Nonce"
	HeaderSignature = "X-LS-Signature"
)

const (
	canonicalTag     = "LS-SIG"
	canonicalVersion = "v1"
	nonceBytes       = 16
	// maxNonceBytes bounds what a verifier keeps per request in its cache.
	maxNonceBytes = 64
)

// Canonical returns the exact bytes that are signed: the fields listed in the
// package doc, one per line. method is upper-cased; everything else is used
// as given, so callers pass the escaped path and raw query as they appear on
// the request line.
func Canonical(keyID, method, path, rawQuery string, ts int64, nonce string, body []byte) []byte {
	sum := sha256.Sum256(body)
	fields := []string{
		canonicalTag,
		canonicalVersion,
		keyID,
		strings.ToUpper(method),
		path,
		rawQuery,
		strconv.FormatInt(ts, 10),
		nonce,
		hex.EncodeToString(sum[:]),
	}
	return []byte(strings.Join(fields, "\n"))
}

// SignRequest sets the four signature headers on req, replacing any already
// there. body must be the exact bytes req will carry. Each call draws a fresh
// nonce, so a retried request has to be signed again: the control plane
// refuses a nonce it has seen.
func (k *Key) SignRequest(req *http.Request, body []byte, now time.Time) error {
	if req == nil || req.URL == nil {
		return errors.New("identity: sign request: request or its URL is nil")
	}
	raw := make([]byte, nonceBytes)
	if _, err := io.ReadFull(rand.Reader, raw); err != nil {
		return fmt.Errorf("identity: sign request: nonce: %w", err)
	}
	nonce := b64.EncodeToString(raw)
	method := req.Method
	if method == "" {
		method = http.MethodGet // what net/http sends for an empty Method
	}
	ts := now.Unix()
	msg := Canonical(k.id, method, requestPath(req.URL), req.URL.RawQuery, ts, nonce, body)
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	req.Header.Set(HeaderKeyID, k.id)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(HeaderNonce, nonce)
	req.Header.Set(HeaderSignature, b64.EncodeToString(k.Sign(msg)))
	return nil
}

// requestPath is the escaped path as it travels on the request line. Both
// sides derive it from the URL the same way (the server's URL is parsed from
// the request line, also when a proxy sent the absolute form), and net/http
// sends "/" for an empty path.
func requestPath(u *url.URL) string {
	if p := u.EscapedPath(); p != "" {
		return p
	}
	return "/"
}
