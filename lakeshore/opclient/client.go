package opclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"nymph/lakeshore/operatorapi"
)

// maxErrorBody bounds how much of a non-JSON error body is kept.
const maxErrorBody = 4 << 10

// Client talks to one control plane in one namespace. It is safe for
// concurrent use.
type Client struct {
	base      *url.URL
	token     string
	namespace string
	http      *http.Client
}

// Options tune New. A zero HTTPClient means a fresh client without an
// overall timeout: long polls are bounded by their context instead.
type Options struct {
	Namespace  string
	HTTPClient *http.Client
}

// New returns a client for the control plane at baseURL (scheme and host,
// optionally a path prefix) authenticating with token.
func New(baseURL, token string, opts Options) (*Client, error) {
	if strings.TrimSpace(baseURL) == "" {
		return nil, errors.New("control plane URL is empty")
	}
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("control plane URL %q: %w", baseURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("control plane URL %q: scheme must be http or https", baseURL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("control plane URL %q: missing host", baseURL)
	}
	ns := opts.Namespace
	if ns == "" {
		ns = operatorapi.DefaultNamespace
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: u, token: token, namespace: ns, http: hc}, nil
}

// Namespace is the namespace every namespaced call addresses.
func (c *Client) Namespace() string { return c.namespace }

// BaseURL is the control plane's URL as given to New, without a trailing slash.
func (c *Client) BaseURL() string { return c.base.String() }

// ListWorkers returns every worker of the namespace (RouteListWorkers).
func (c *Client) ListWorkers(ctx context.Context) ([]operatorapi.Worker, error) {
	out, err := call[operatorapi.WorkerList](ctx, c, operatorapi.RouteListWorkers, nil, nil, nil)
	return nonNil(out.Workers, err)
}

// WorkerFilter filters and pages ListWorkerPage on the server; zero
// fields match every worker, a zero Limit takes every match.
type WorkerFilter struct {
	State, Queue, LabelPrefix string
	Limit, Offset             int
}

// ListWorkerPage returns one page of the workers matching f, with how
// many match and the namespace's counts by state (RouteListWorkers).
func (c *Client) ListWorkerPage(ctx context.Context, f WorkerFilter) (operatorapi.WorkerList, error) {
	q := url.Values{}
	for k, v := range map[string]string{operatorapi.WorkerQueryState: f.State, operatorapi.WorkerQueryQueue: f.Queue,
		operatorapi.WorkerQueryLabelPrefix: f.LabelPrefix} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit > 0 {
		q.Set(operatorapi.WorkerQueryLimit, strconv.Itoa(f.Limit))
	}
	if f.Offset > 0 {
		q.Set(operatorapi.WorkerQueryOffset, strconv.Itoa(f.Offset))
	}
	out, err := call[operatorapi.WorkerList](ctx, c, operatorapi.RouteListWorkers, nil, q, nil)
	if err != nil {
		return operatorapi.WorkerList{}, err
	}
	out.Workers, _ = nonNil(out.Workers, nil)
	return out, nil
}

// GetWorker returns one worker by id (RouteGetWorker).
func (c *Client) GetWorker(ctx context.Context, workerID string) (operatorapi.Worker, error) {
	return call[operatorapi.Worker](ctx, c, operatorapi.RouteGetWorker, params{"id": workerID}, nil, nil)
}

// KillWorker deletes a worker row (RouteKillWorker). With terminate false
// the control plane leaves any cloud instance behind it running; the choice
// travels as the query parameter terminate=false.
func (c *Client) KillWorker(ctx context.Context, workerID string, terminate bool) (operatorapi.KillResponse, error) {
	var q url.Values
	if !terminate {
		q = url.Values{"terminate": {"false"}}
	}
	return call[operatorapi.KillResponse](ctx, c, operatorapi.RouteKillWorker, params{"id": workerID}, q, nil)
}

// Cleanup deletes (or, dry, lists) workers not seen for a while (RouteCleanup).
func (c *Client) Cleanup(ctx context.Context, req operatorapi.CleanupRequest) (operatorapi.CleanupResponse, error) {
	out, err := call[operatorapi.CleanupResponse](ctx, c, operatorapi.RouteCleanup, nil, nil, req)
	if out.Deleted == nil {
		out.Deleted = []operatorapi.Worker{}
	}
	return out, err
}

// Exec submits a shell command to one worker (RouteWorkerExec) without
// waiting for it.
func (c *Client) Exec(ctx context.Context, workerID string, req operatorapi.ExecRequest) (operatorapi.ExecAccepted, error) {
	acc, _, err := c.SubmitExec(ctx, workerID, req, 0)
	return acc, err
}

// SubmitExec submits req to the worker ref names (its id, or a label only
// one worker has) and, with wait > 0, waits as GetExec(wait, offset 0)
// would for the first news of the exec, in the same request. The Exec is
// nil when wait is 0, and also when the connection ended after the exec was
// accepted: err is nil then, and the caller follows the exec with GetExec.
func (c *Client) SubmitExec(ctx context.Context, ref string, req operatorapi.ExecRequest, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
	return c.submitExec(ctx, operatorapi.RouteWorkerExec, params{"id": ref}, req, wait)
}

// SubmitQueueExec is SubmitExec for any eligible member of req.Queue.
func (c *Client) SubmitQueueExec(ctx context.Context, req operatorapi.ExecRequest, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
	return c.submitExec(ctx, operatorapi.RouteQueueExec, nil, req, wait)
}

func (c *Client) submitExec(ctx context.Context, route string, p params, req operatorapi.ExecRequest, wait time.Duration) (operatorapi.ExecAccepted, *operatorapi.Exec, error) {
	var acc operatorapi.ExecAccepted
	resp, where, err := c.send(ctx, route, p, waitQuery(wait), req)
	if err != nil {
		return acc, nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	if err := dec.Decode(&acc); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || ctx.Err() != nil {
			return acc, nil, &TransportError{Method: where.method, URL: where.url, Err: err}
		}
		return acc, nil, fmt.Errorf("%s %s: decode response: %w", where.method, where.path, err)
	}
	if acc.ExecID == "" {
		return acc, nil, fmt.Errorf("%s %s: the answer names no exec", where.method, where.path)
	}
	if wait <= 0 || !strings.HasPrefix(resp.Header.Get("Content-Type"), operatorapi.ContentTypeNDJSON) {
		return acc, nil, nil
	}
	var ex operatorapi.Exec
	if err := dec.Decode(&ex); err != nil {
		// Accepted, but the wait was cut short: follow it with GetExec.
		return acc, nil, nil
	}
	return acc, &ex, nil
}

// QueueExec submits a shell command to any eligible member of req.Queue
// (RouteQueueExec) without waiting for it.
func (c *Client) QueueExec(ctx context.Context, req operatorapi.ExecRequest) (operatorapi.ExecAccepted, error) {
	acc, _, err := c.SubmitQueueExec(ctx, req, 0)
	return acc, err
}

// GetExec reads an exec (RouteGetExec). A positive wait long-polls until
// something changes (the server caps it at 20 s); offset skips streamed
// output already seen.
func (c *Client) GetExec(ctx context.Context, execID string, wait time.Duration, offset int64) (operatorapi.Exec, error) {
	q := waitQuery(wait)
	if offset > 0 {
		q.Set("offset", fmt.Sprint(offset))
	}
	return call[operatorapi.Exec](ctx, c, operatorapi.RouteGetExec, params{"exec_id": execID}, q, nil)
}

// ListExecs lists the namespace's execs, newest first, one worker's with
// workerID (RouteListExecs); limit 0 is the server's default.
func (c *Client) ListExecs(ctx context.Context, workerID string, limit int) ([]operatorapi.ExecSummary, error) {
	q := url.Values{}
	if workerID != "" {
		q.Set("worker", workerID)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	out, err := call[operatorapi.ExecList](ctx, c, operatorapi.RouteListExecs, nil, q, nil)
	return nonNil(out.Execs, err)
}

// Setup queues a setup script on a worker (RouteSetup).
func (c *Client) Setup(ctx context.Context, workerID string, req operatorapi.SetupRequest) (operatorapi.Queued, error) {
	return call[operatorapi.Queued](ctx, c, operatorapi.RouteSetup, params{"id": workerID}, nil, req)
}

// Hibernate asks a worker to stop polling until the deadline (RouteHibernate).
// The deadline is sent in whole seconds, rounded up.
func (c *Client) Hibernate(ctx context.Context, workerID string, until time.Time) (operatorapi.Queued, error) {
	secs := until.Unix()
	if until.Nanosecond() > 0 {
		secs++
	}
	return call[operatorapi.Queued](ctx, c, operatorapi.RouteHibernate, params{"id": workerID}, nil, operatorapi.HibernateRequest{UntilEpochS: secs})
}

// Wake queues a wake on a worker (RouteWake): its hibernation ends now,
// and the hibernates not yet delivered to it are withdrawn.
func (c *Client) Wake(ctx context.Context, workerID string) (operatorapi.Woken, error) {
	return call[operatorapi.Woken](ctx, c, operatorapi.RouteWake, params{"id": workerID}, nil, struct{}{})
}

// Reset queues a reset_backoff command on a worker (RouteReset).
func (c *Client) Reset(ctx context.Context, workerID string) (operatorapi.Queued, error) {
	return call[operatorapi.Queued](ctx, c, operatorapi.RouteReset, params{"id": workerID}, nil, struct{}{})
}

// Cancel stops a running exec or invocation on a worker (RouteCancel).
func (c *Client) Cancel(ctx context.Context, workerID string, req operatorapi.CancelRequest) (operatorapi.Queued, error) {
	return call[operatorapi.Queued](ctx, c, operatorapi.RouteCancel, params{"id": workerID}, nil, req)
}

// CreateToken mints a daemon bearer or enrollment token (RouteCreateToken).
func (c *Client) CreateToken(ctx context.Context, req operatorapi.TokenRequest) (operatorapi.TokenResponse, error) {
	return call[operatorapi.TokenResponse](ctx, c, operatorapi.RouteCreateToken, nil, nil, req)
}

// ListTokens lists every minted token, oldest first (RouteListTokens).
func (c *Client) ListTokens(ctx context.Context) ([]operatorapi.TokenInfo, error) {
	out, err := call[operatorapi.TokenList](ctx, c, operatorapi.RouteListTokens, nil, nil, nil)
	return nonNil(out.Tokens, err)
}

// RevokeToken revokes a token by id (RouteRevokeToken); the next request
// made with it is refused.
func (c *Client) RevokeToken(ctx context.Context, id string) (operatorapi.TokenInfo, error) {
	return call[operatorapi.TokenInfo](ctx, c, operatorapi.RouteRevokeToken, params{"token_id": id}, nil, nil)
}

// ListCommands returns a worker's queued and delivered commands
// (RouteListCommands). It accepts either a bare JSON array or an object
// with a "commands" array.
func (c *Client) ListCommands(ctx context.Context, workerID string) ([]operatorapi.CommandInfo, error) {
	var raw json.RawMessage
	if err := c.do(ctx, operatorapi.RouteListCommands, params{"id": workerID}, nil, nil, &raw); err != nil {
		return nil, err
	}
	out := []operatorapi.CommandInfo{}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if err := json.Unmarshal(trimmed, &out); err != nil {
			return nil, fmt.Errorf("decode commands: %w", err)
		}
		return out, nil
	}
	var wrapped struct {
		Commands []operatorapi.CommandInfo `json:"commands"`
	}
	if err := json.Unmarshal(trimmed, &wrapped); err != nil {
		return nil, fmt.Errorf("decode commands: %w", err)
	}
	if wrapped.Commands != nil {
		out = wrapped.Commands
	}
	return out, nil
}

type params map[string]string

// waitQuery asks a long poll to wait up to wait; 0 asks for no wait.
func waitQuery(wait time.Duration) url.Values {
	q := url.Values{}
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	return q
}

// call does one request and decodes its answer as a T.
func call[T any](ctx context.Context, c *Client, route string, p params, q url.Values, body any) (T, error) {
	var out T
	err := c.do(ctx, route, p, q, body, &out)
	return out, err
}

// nonNil is a list answer's items, never nil (so --json prints [], not
// null), or nil with the error.
func nonNil[T any](items []T, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	if items == nil {
		items = []T{}
	}
	return items, nil
}

// routePath splits an operatorapi route ("METHOD /path/{x}") and fills in
// its placeholders, escaping each value as one path segment.
func routePath(route string, ns string, p params) (method, path string, err error) {
	method, pattern, ok := strings.Cut(route, " ")
	if !ok {
		return "", "", fmt.Errorf("malformed route %q", route)
	}
	segs := strings.Split(pattern, "/")
	for i, s := range segs {
		if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
			continue
		}
		name := s[1 : len(s)-1]
		var v string
		if name == "ns" {
			v = ns
		} else {
			v = p[name]
		}
		if v == "" {
			return "", "", &Error{Status: 0, Message: fmt.Sprintf("%s must not be empty", name), Field: name}
		}
		segs[i] = url.PathEscape(v)
	}
	return method, strings.Join(segs, "/"), nil
}

func (c *Client) do(ctx context.Context, route string, p params, q url.Values, body, out any) error {
	resp, where, err := c.send(ctx, route, p, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return &TransportError{Method: where.method, URL: where.url, Err: err}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", where.method, where.path, err)
	}
	return nil
}

// upload is a request body sent as it is (application/octet-stream), not
// as JSON; size is its length, or -1 when unknown.
type upload struct {
	r    io.Reader
	size int64
}

// endpoint names a request in errors.
type endpoint struct{ method, path, url string }

// send makes one request and returns a response with a 2xx status, whose
// body the caller closes; any other status becomes an *Error.
func (c *Client) send(ctx context.Context, route string, p params, q url.Values, body any) (*http.Response, endpoint, error) {
	method, path, err := routePath(route, c.namespace, p)
	if err != nil {
		return nil, endpoint{}, err
	}
	where := endpoint{method: method, path: path, url: c.base.String() + path}
	target := where.url
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	var rd io.Reader
	ctype := "application/json"
	switch b := body.(type) {
	case nil:
	case upload:
		rd, ctype = b.r, "application/octet-stream"
	default:
		data, err := json.Marshal(body)
		if err != nil {
			return nil, where, fmt.Errorf("encode %s body: %w", route, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, where, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if up, ok := body.(upload); ok {
		req.ContentLength = up.size
		if up.size == 0 {
			req.Body = http.NoBody
		}
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, where, &TransportError{Method: method, URL: where.url, Err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, where, decodeError(method, path, resp)
	}
	return resp, where, nil
}

func decodeError(method, path string, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{Status: resp.StatusCode, Method: method, Path: path}
	var body operatorapi.Error
	if err := json.Unmarshal(data, &body); err == nil && body.Error != "" {
		e.Message, e.Field = body.Error, body.Field
		return e
	}
	e.Message = strings.TrimSpace(string(data))
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}
