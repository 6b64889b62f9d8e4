// Package blobs owns where the control plane keeps bytes too large for its
// database: invocation payloads and published nymph releases. One contract,
// Store, has two implementations: Local, files under the data directory
// (the embedded default, enough for a single control plane), and S3, any
// S3-compatible bucket (AWS S3, Cloudflare R2, MinIO), which replicas share.
//
// A key is a slash-separated path of segments that each start with a
// letter or digit (ValidKey), so no key escapes the store or names its
// bookkeeping. Callers give each kind of blob its own first segment
// ("payloads/<ns>/<key>", "releases/<version>/<file>").
//
// Presigned URLs are capabilities: whoever holds one may do the one
// operation on the one key until it expires, with no other credential.
// S3's are the bucket's own SigV4 URLs, so the bytes never pass through
// the control plane; Local's are HMAC-signed tokens for the control plane's
// own payload route, which Local checks (Authorize) and serves (Handler).
package blobs

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Errors a Store wraps, whichever implementation.
var (
	// ErrNotFound: no blob has the key.
	ErrNotFound = errors.New("blobs: not found")
	// ErrChecksum: the bytes do not hash to the sha256 they were declared
	// with. A Put that returns it has stored nothing.
	ErrChecksum = errors.New("blobs: sha256 mismatch")
	// ErrSize: the bytes are not the size they were declared with, or over
	// PutOptions.Max.
	ErrSize = errors.New("blobs: size mismatch")
	// ErrExpired: a presigned URL was used after its expiry.
	ErrExpired = errors.New("blobs: presigned URL expired")
	// ErrDenied: a presigned URL was forged, tampered with, or used for
	// another operation.
	ErrDenied = errors.New("blobs: presigned URL not valid")
	// ErrInvalidKey: the key is not one ValidKey accepts.
	ErrInvalidKey = errors.New("blobs: invalid key")
)

// Info describes one stored blob.
type Info struct {
	Key  string
	Size int64
	// SHA256 is the hex digest of the bytes. List may leave it empty where
	// the backend cannot list it cheaply (S3 lists no user metadata); Stat
	// and Open always fill it for blobs this package wrote.
	SHA256      string
	ContentType string
	// Modified is when the blob was last written.
	Modified time.Time
}

// PutOptions says what a Put (or a presigned put) must store.
type PutOptions struct {
	// Size is the exact size in bytes; -1 is any size up to Max.
	Size int64
	// Max caps the size when Size is -1; 0 is no cap.
	Max int64
	// SHA256, when set (hex), is what the bytes must hash to.
	SHA256 string
	// ContentType defaults to application/octet-stream.
	ContentType string
}

// Presigned is a URL that grants one operation on one key until Expires.
type Presigned struct {
	// URL is absolute for S3; for Local it is a path ("/v1/payloads/...")
	// that the caller resolves against the control plane's public URL.
	URL    string
	Method string
	// Headers must be sent with the request, exactly (a presigned put
	// signs its length and checksum headers). Empty for a get.
	Headers map[string]string
	Expires time.Time
}

// Store keeps blobs by key. Implementations are safe for concurrent use,
// also by several processes (replicas) sharing the same backing store.
type Store interface {
	// Put streams r into key, hashing as it goes, and replaces any blob
	// there. A declared size or sha256 that the bytes do not match is
	// ErrSize or ErrChecksum, and leaves no new blob behind.
	Put(ctx context.Context, key string, r io.Reader, o PutOptions) (Info, error)
	// Stat describes key, or ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Open reads key. The reader fails with ErrChecksum at EOF when the
	// bytes do not match the sha256 they were stored with.
	Open(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// Delete removes key; a key that is not there is no error.
	Delete(ctx context.Context, key string) error
	// List calls fn for every blob whose key starts with prefix, in key
	// order; fn's error stops the walk and is returned.
	List(ctx context.Context, prefix string, fn func(Info) error) error
	// PresignGet grants a GET of key for ttl; a key that is not there is
	// ErrNotFound.
	PresignGet(ctx context.Context, key string, ttl time.Duration) (Presigned, error)
	// PresignPut grants one PUT of key for ttl, of the size and sha256 in
	// o when they are set.
	PresignPut(ctx context.Context, key string, o PutOptions, ttl time.Duration) (Presigned, error)
	// Check proves the store usable now (the bucket exists, the
	// credentials are accepted, the endpoint answers; the directory is
	// writable), with an error that names the fix. serve calls it before
	// it listens.
	Check(ctx context.Context) error
	// String names the store for logs and errors: "local:/var/lib/x",
	// "s3://bucket/prefix".
	String() string
}

var segmentRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$`) })

// ValidKey reports whether key is 1-8 segments joined by '/', each
// starting with a letter or digit and made of letters, digits and . _ + -
// (at most 200 each).
func ValidKey(key string) bool {
	if key == "" || len(key) > 1024 {
		return false
	}
	parts := strings.Split(key, "/")
	if len(parts) > 8 {
		return false
	}
	for _, p := range parts {
		if !segmentRe().MatchString(p) {
			return false
		}
	}
	return true
}

// Do sends the request a Presigned describes, with body (nil for a get),
// and returns the response for the caller to read and close. A status
// other than 2xx is an error carrying the body's first KiB.
func Do(ctx context.Context, c *http.Client, p Presigned, body io.Reader, size int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, p.Method, p.URL, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = size
	}
	for k, v := range p.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return resp, nil
}

// StatusError is a presigned request the store refused.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string {
	return http.StatusText(e.Code) + " (" + strconv.Itoa(e.Code) + "): " + e.Body
}
