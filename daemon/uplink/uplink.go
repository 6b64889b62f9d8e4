// Package uplink owns nymph's outbound HTTP client: every request the daemon
// makes to the control plane. Bodies are msgpack (messages.Marshal) with
// Content-Type and Accept set to application/x-msgpack, the bootstrap bearer
// is attached when configured, each request is bounded by the 120 s client
// timeout of the spec, and log chunks go out as raw
// application/octet-stream bytes.
//
// Credentials (the bearer and, when a Signer is set, the request signature)
// are only ever attached to requests for the control plane's own origin; a
// server-supplied URL on another host (a presigned download, say) gets none.
// The one exception is an exec's log sink (PostChunk): the control plane
// names it as its own callback, which takes output only from the exec's
// worker, and the protocol attaches the bearer to it wherever it points (a
// control plane whose public URL is not the one this daemon dials).
//
// With a signer, hello carries the public key of the key that signs it and,
// while that key is not enrolled yet, the one-shot enrollment token as its
// bearer (WithEnrollToken). A RotatingSigner lets key rotation replace the
// key while requests are in flight: a request refused with 401 because the
// key that signed it was replaced meanwhile is signed again and sent once
// more, so a rotation fails no request.
//
// Requests the daemon abandons mid-flight as a matter of course (hello and
// the long-poll, which a finished job cuts short; a job's payload download,
// when the job is aborted) go through connection pools of their own, apart
// from the deliveries (results, acks, log chunks). net/http can fail a
// request whose own context is live with the context.Canceled of another
// request cancelled on the same keep-alive connection around its answer,
// after the victim may already have reached the server: sharing one pool, a
// job's end could fail a result post that had in fact arrived, or one that
// had not.
package uplink

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"nymph/identity"
	"nymph/messages"
)

// Routes the daemon calls, relative to the server URL.
const (
	PathHello = "/v1/daemon/hello"
	PathPoll  = "/v1/daemon/poll"
	PathAck   = "/v1/daemon/ack"
	PathKeys  = "/v1/daemon/keys"
	PathEvent = "/v1/daemon/event"
)

// Limits of the transport.
const (
	// DefaultTimeout bounds one request, body included.
	DefaultTimeout = 120 * time.Second
	// IdleConnTimeout is how long an idle pooled connection is kept.
	IdleConnTimeout = 90 * time.Second
	// maxResponse bounds a msgpack response body read into memory.
	maxResponse = 64 << 20
	// maxErrorBody is how much of an error response is kept for the message.
	maxErrorBody = 512
)

// OctetStream is the media type of raw log chunks.
const OctetStream = "application/octet-stream"

// ExecResultPath is the route of one exec's result callback.
func ExecResultPath(execID string) string {
	return "/v1/daemon/exec/" + url.PathEscape(execID) + "/result"
}

// PresignPath is the payload-store presign route of a namespace.
func PresignPath(namespace string) string {
	return "/v1/namespaces/" + url.PathEscape(namespace) + "/payloads/presign"
}

// Signer signs a request over its exact body bytes. *identity.Key
// satisfies it; without one, requests carry only the bearer and no X-LS-*
// header at all.
type Signer interface {
	SignRequest(req *http.Request, body []byte, now time.Time) error
}

// RotatingSigner is a Signer whose key can be replaced while requests are in
// flight (key rotation).
type RotatingSigner interface {
	Signer
	// Key is the key requests are signed with now.
	Key() *identity.Key
	// Replaced waits until no replacement is under way (or ctx ends) and
	// reports whether the key with id keyID has been replaced by another.
	Replaced(ctx context.Context, keyID string) bool
}

// Client talks to one control plane. It is safe for concurrent use.
type Client struct {
	base   *url.URL
	token  string
	signer Signer
	// http carries the deliveries and everything else; polls (hello,
	// poll) and fetches (presign, download) have pools of their own.
	http, polls, fetches *http.Client
	now                  func() time.Time

	// mu guards the enrollment token, dropped once a hello is accepted.
	mu          sync.Mutex
	enrollToken string
	enrollEager bool
}

// Option configures a Client.
type Option func(*Client) error

// WithToken sets the bearer token attached to every request to the server.
func WithToken(token string) Option {
	return func(c *Client) error {
		c.token = strings.TrimSpace(token)
		return nil
	}
}

// WithTokenFile reads the bearer token from a file (surrounding whitespace
// is dropped).
func WithTokenFile(path string) Option {
	return func(c *Client) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("token file: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
		return nil
	}
}

// WithHelloToken sets the bearer of hello requests only: the one-shot
// enrollment token (dle_…) that comes with a new public key. It is
// WithEnrollToken(token, true).
func WithHelloToken(token string) Option { return WithEnrollToken(token, true) }

// WithEnrollToken sets the one-shot enrollment token (dle_…) that hello
// presents as its bearer so the control plane enrolls the signing key. With
// eager, every hello carries it — right for a key made on this start, which
// cannot be enrolled yet. Otherwise a hello goes without it, and presents it
// only when refused with enroll_token_required: a key enrolled on an earlier
// start says hello with its signature alone. Once a hello is accepted the
// token is never sent again.
func WithEnrollToken(token string, eager bool) Option {
	return func(c *Client) error {
		c.enrollToken, c.enrollEager = strings.TrimSpace(token), eager
		return nil
	}
}

// WithCAFile trusts the PEM certificates in path (in addition to nothing
// else) for the server's TLS.
func WithCAFile(path string) Option {
	return func(c *Client) error {
		pem, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("ca file %s: no PEM certificate found", path)
		}
		tr, ok := c.http.Transport.(*http.Transport)
		if !ok {
			return errors.New("ca file: the HTTP client has a custom transport")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		return nil
	}
}

// WithTimeout replaces the 120 s per-request bound (for tests).
func WithTimeout(d time.Duration) Option {
	return func(c *Client) error {
		c.http.Timeout = d
		return nil
	}
}

// WithSigner signs every request to the server.
func WithSigner(s Signer) Option {
	return func(c *Client) error {
		c.signer = s
		return nil
	}
}

// WithClock replaces the clock used for signatures.
func WithClock(now func() time.Time) Option {
	return func(c *Client) error {
		c.now = now
		return nil
	}
}

// New returns a client for the control plane at baseURL.
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server url %q: must be http:// or https:// with a host", baseURL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.IdleConnTimeout = IdleConnTimeout
	tr.MaxIdleConnsPerHost = 32
	c := &Client{
		base: u,
		http: &http.Client{Transport: tr, Timeout: DefaultTimeout},
		now:  time.Now,
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	c.polls, c.fetches = c.sibling(), c.sibling()
	return c, nil
}

// sibling is a client like c.http (timeout, TLS) with a connection pool of
// its own.
func (c *Client) sibling() *http.Client {
	hc := *c.http
	if tr, ok := c.http.Transport.(*http.Transport); ok {
		hc.Transport = tr.Clone()
	}
	return &hc
}

// BaseURL is the server URL the client was made for.
func (c *Client) BaseURL() string { return c.base.String() }

// CloseIdleConnections drops pooled connections.
func (c *Client) CloseIdleConnections() {
	for _, hc := range []*http.Client{c.http, c.polls, c.fetches} {
		hc.CloseIdleConnections()
	}
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Method string
	URL    string
	Status int
	Body   string
}

// HTTPStatus lets callers that must not import this package read the status.
func (e *StatusError) HTTPStatus() int { return e.Status }

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.URL, e.Status, e.Body)
}

// DecodeError is a 2xx answer whose body could not be decoded.
type DecodeError struct {
	URL string
	Err error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("decode response of %s: %v", e.URL, e.Err) }
func (e *DecodeError) Unwrap() error { return e.Err }

// Retryable reports whether err is worth retrying later: a transport error,
// a timeout, 408, 425, 429 or any 5xx. Other 4xx answers are final, and so
// is a cancelled context.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status >= 500 || se.Status == http.StatusRequestTimeout ||
			se.Status == http.StatusTooEarly || se.Status == http.StatusTooManyRequests
	}
	return true
}

// bearerKey carries a per-request bearer override in a context.
type bearerKey struct{}

// signerKey carries a per-request signer override in a context.
type signerKey struct{}

// callbackKey marks a request to a URL the control plane named as its own
// callback: it carries the credentials whatever its origin.
type callbackKey struct{}

// poolKey carries the client (connection pool) a request goes through when
// it is not c.http.
type poolKey struct{}

func via(ctx context.Context, hc *http.Client) context.Context {
	return context.WithValue(ctx, poolKey{}, hc)
}

// Hello sends the first-contact request. With a key to sign with, the
// request's public_key is that key's, and the hello is signed by it even if
// a rotation replaces it meanwhile; the enrollment token rides along as
// WithEnrollToken describes.
func (c *Client) Hello(ctx context.Context, req *messages.HelloRequest) (*messages.HelloResponse, error) {
	ctx = via(ctx, c.polls)
	r := *req
	if key := c.currentKey(); key != nil {
		r.PublicKey = key.PublicKeyB64()
		ctx = context.WithValue(ctx, signerKey{}, Signer(key))
	}
	c.mu.Lock()
	tok, eager := c.enrollToken, c.enrollEager
	c.mu.Unlock()
	resp, err := c.hello(ctx, &r, tok, eager)
	if err == nil && !eager && tok != "" && resp.Reject != nil && resp.Reject.Code == messages.RejectEnrollTokenRequired {
		resp, err = c.hello(ctx, &r, tok, true)
	}
	if err != nil {
		return nil, err
	}
	if resp.Reject == nil && tok != "" {
		c.mu.Lock()
		c.enrollToken = ""
		c.mu.Unlock()
	}
	return resp, nil
}

func (c *Client) hello(ctx context.Context, req *messages.HelloRequest, tok string, withTok bool) (*messages.HelloResponse, error) {
	if withTok && tok != "" {
		ctx = context.WithValue(ctx, bearerKey{}, tok)
	}
	var resp messages.HelloResponse
	if err := c.call(ctx, PathHello, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// currentKey is the key the client signs with now, when it knows one.
func (c *Client) currentKey() *identity.Key {
	switch s := c.signer.(type) {
	case RotatingSigner:
		return s.Key()
	case *identity.Key:
		return s
	}
	return nil
}

// RotateKey posts a new public key to /v1/daemon/keys signed by outgoing,
// the key it replaces, whatever the client signs other requests with. Its
// 401 is final: no other key is tried.
func (c *Client) RotateKey(ctx context.Context, req *messages.KeysRequest, outgoing *identity.Key) (*messages.KeysResponse, error) {
	if outgoing == nil {
		return nil, errors.New("rotate key: no outgoing key to sign with")
	}
	ctx = context.WithValue(ctx, signerKey{}, Signer(outgoing))
	var resp messages.KeysResponse
	if err := c.call(ctx, PathKeys, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Poll long-polls for commands.
func (c *Client) Poll(ctx context.Context, req *messages.PollRequest) (*messages.PollResponse, error) {
	var resp messages.PollResponse
	if err := c.call(via(ctx, c.polls), PathPoll, req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// Ack posts the terminal outcome of one run.
func (c *Client) Ack(ctx context.Context, a *messages.Ack) error {
	return c.call(ctx, PathAck, a, nil)
}

// PostEvent posts one event (a run's output, a setup's or an update's
// outcome) to /v1/daemon/event.
func (c *Client) PostEvent(ctx context.Context, e *messages.Event) error {
	return c.call(ctx, PathEvent, e, nil)
}

// ExecResult posts one exec's result callback.
func (c *Client) ExecResult(ctx context.Context, execID string, r *messages.ExecResult) error {
	return c.call(ctx, ExecResultPath(execID), r, nil)
}

// Presign asks the payload store for a URL.
func (c *Client) Presign(ctx context.Context, namespace string, req *messages.PresignRequest) (*messages.PresignResponse, error) {
	var resp messages.PresignResponse
	if err := c.call(via(ctx, c.fetches), PresignPath(namespace), req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// PostEncoded posts an already encoded msgpack body to a server path and
// discards the answer's body. The outbox uses it to replay stored results
// byte for byte.
func (c *Client) PostEncoded(ctx context.Context, path string, body []byte) error {
	u, err := c.resolve(path)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPost, u, messages.ContentType, body, 0)
	return err
}

// PostChunk posts raw log bytes to a server-supplied URL (absolute, or a
// path on the server), with the credentials whatever its origin.
func (c *Client) PostChunk(ctx context.Context, rawURL string, data []byte) error {
	u, err := c.base.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("chunk url %q: %w", rawURL, err)
	}
	_, err = c.do(context.WithValue(ctx, callbackKey{}, true), http.MethodPost, u, OctetStream, data, 0)
	return err
}

// Download GETs a URL (absolute, or a path on the server) and returns at
// most limit bytes; a longer body is an error.
func (c *Client) Download(ctx context.Context, rawURL string, limit int64) ([]byte, error) {
	u, err := c.base.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("download url %q: %w", rawURL, err)
	}
	return c.do(via(ctx, c.fetches), http.MethodGet, u, "", nil, limit)
}

// resolve joins an escaped route path onto the server URL, keeping any path
// prefix the server URL has.
func (c *Client) resolve(path string) (*url.URL, error) {
	u, err := url.Parse(c.base.String() + path)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", path, err)
	}
	return u, nil
}

func (c *Client) call(ctx context.Context, path string, in, out any) error {
	body, err := messages.Marshal(in)
	if err != nil {
		return err
	}
	u, err := c.resolve(path)
	if err != nil {
		return err
	}
	limit := int64(0)
	if out != nil {
		limit = maxResponse
	}
	data, err := c.do(ctx, http.MethodPost, u, messages.ContentType, body, limit)
	if err != nil || out == nil {
		return err
	}
	if len(data) == 0 {
		return &DecodeError{URL: u.String(), Err: errors.New("empty body")}
	}
	if err := messages.Unmarshal(data, out); err != nil {
		return &DecodeError{URL: u.String(), Err: err}
	}
	return nil
}

// errorText makes an error body readable in a log line: the control plane
// answers daemon routes with a msgpack {error, field}.
func errorText(contentType string, b []byte) string {
	if strings.HasPrefix(contentType, messages.ContentType) {
		var v messages.ValidationError
		if messages.Unmarshal(b, &v) == nil && v.Error != "" {
			if v.Field != "" {
				return v.Error + " (field " + v.Field + ")"
			}
			return v.Error
		}
	}
	return strings.ToValidUTF8(strings.TrimSpace(string(b)), "?")
}

// do performs one request. limit > 0 reads the body up to limit bytes;
// limit 0 drains and discards it (so the connection is reused).
func (c *Client) do(ctx context.Context, method string, u *url.URL, contentType string, body []byte, limit int64) ([]byte, error) {
	resp, err := c.send(ctx, method, u, contentType, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil, &StatusError{Method: method, URL: u.Redacted(), Status: resp.StatusCode, Body: errorText(resp.Header.Get("Content-Type"), b)}
	}
	if limit <= 0 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil, nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", method, u.Redacted(), err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s %s: body larger than %d bytes", method, u.Redacted(), limit)
	}
	return data, nil
}

// maxResign bounds how often one request is signed again after 401s: once
// per rotation that overtook it.
const maxResign = 8

// send sends one request and returns the response, whatever its status. A
// 401 to a request signed by a key that a rotation replaced meanwhile is
// sent again, signed by the new key.
func (c *Client) send(ctx context.Context, method string, u *url.URL, contentType string, body []byte) (*http.Response, error) {
	signer, override := ctx.Value(signerKey{}).(Signer)
	if !override {
		signer = c.signer
	}
	rotating, _ := c.signer.(RotatingSigner)
	hc, ok := ctx.Value(poolKey{}).(*http.Client)
	if !ok {
		hc = c.http
	}
	for attempt := 0; ; attempt++ {
		req, err := c.newRequest(ctx, method, u, contentType, body, signer)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
		}
		if resp.StatusCode != http.StatusUnauthorized || attempt >= maxResign || override || rotating == nil {
			return resp, nil
		}
		kid := req.Header.Get(identity.HeaderKeyID)
		if kid == "" || !rotating.Replaced(ctx, kid) {
			return resp, nil
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
}

// newRequest builds one request with its headers and credentials.
func (c *Client) newRequest(ctx context.Context, method string, u *url.URL, contentType string, body []byte, signer Signer) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if contentType == messages.ContentType || method == http.MethodPost {
		req.Header.Set("Accept", messages.ContentType)
	}
	if callback, _ := ctx.Value(callbackKey{}).(bool); !callback && !c.sameOrigin(u) {
		return req, nil
	}
	token := c.token
	if t, ok := ctx.Value(bearerKey{}).(string); ok {
		token = t
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if signer != nil {
		if err := signer.SignRequest(req, body, c.now()); err != nil {
			return nil, fmt.Errorf("sign %s %s: %w", method, u.Path, err)
		}
	}
	return req, nil
}

func (c *Client) sameOrigin(u *url.URL) bool {
	return strings.EqualFold(u.Scheme, c.base.Scheme) && strings.EqualFold(hostPort(u), hostPort(c.base))
}

func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	switch u.Scheme {
	case "https":
		return net.JoinHostPort(u.Hostname(), "443")
	default:
		return net.JoinHostPort(u.Hostname(), "80")
	}
}
