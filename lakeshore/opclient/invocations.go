package opclient

import (
	"bytes"
	"context"
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

	"nymph/backoff"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// Tuning of WaitInvocation.
const (
	waitPoll     = operatorapi.MaxWait
	waitSlack    = 15 * time.Second
	waitRetryMin = 100 * time.Millisecond
	waitRetryMax = 2 * time.Second
)

// SubmitInvocation queues a function invocation (RouteSubmitInvocation).
func (c *Client) SubmitInvocation(ctx context.Context, req operatorapi.InvocationRequest) (operatorapi.InvocationSubmitted, error) {
	return call[operatorapi.InvocationSubmitted](ctx, c, operatorapi.RouteSubmitInvocation, nil, nil, req)
}

// GetInvocation reads an invocation (RouteGetInvocation). A positive wait
// long-polls until its state changes or is terminal; the server caps it at
// operatorapi.MaxWait.
func (c *Client) GetInvocation(ctx context.Context, id string, wait time.Duration) (operatorapi.Invocation, error) {
	return call[operatorapi.Invocation](ctx, c, operatorapi.RouteGetInvocation, params{"inv_id": id}, waitQuery(wait), nil)
}

// InvocationFilter narrows ListInvocations; zero fields match everything
// (Limit 0: the server's default).
type InvocationFilter struct {
	State string
	Queue string
	Limit int
}

// ListInvocations lists the namespace's invocations, newest first
// (RouteListInvocations).
func (c *Client) ListInvocations(ctx context.Context, f InvocationFilter) ([]operatorapi.Invocation, error) {
	q := url.Values{}
	if f.State != "" {
		q.Set("state", f.State)
	}
	if f.Queue != "" {
		q.Set("queue", f.Queue)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	out, err := call[operatorapi.InvocationList](ctx, c, operatorapi.RouteListInvocations, nil, q, nil)
	return nonNil(out.Invocations, err)
}

// CancelInvocation cancels a queued invocation at once, or asks the daemon
// running it to stop (RouteCancelInvocation).
func (c *Client) CancelInvocation(ctx context.Context, id string) (operatorapi.CancelInvocationResponse, error) {
	return call[operatorapi.CancelInvocationResponse](ctx, c, operatorapi.RouteCancelInvocation, params{"inv_id": id}, nil, struct{}{})
}

// WaitInvocation follows an invocation until it is terminal and returns it.
// progress, when not nil, sees every read (state changes, and each long
// poll that ran out). Transport failures and a restarting server are
// retried with backoff until ctx ends; other errors end the wait.
func (c *Client) WaitInvocation(ctx context.Context, id string, progress func(operatorapi.Invocation, error)) (operatorapi.Invocation, error) {
	retry := backoff.New(waitRetryMin, waitRetryMax)
	for {
		rctx, cancel := context.WithTimeout(ctx, waitPoll+waitSlack)
		inv, err := c.GetInvocation(rctx, id, waitPoll)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return inv, ctx.Err()
			}
			if !Retryable(err) && !errors.Is(err, context.DeadlineExceeded) {
				return inv, err
			}
			if progress != nil {
				progress(operatorapi.Invocation{}, err)
			}
			if !retry.Wait(ctx) {
				return inv, ctx.Err()
			}
			continue
		}
		retry.Reset()
		if progress != nil {
			progress(inv, nil)
		}
		if operatorapi.InvocationTerminal(inv.State) {
			return inv, nil
		}
	}
}

// Presign asks the payload store for a URL (RoutePresign, as JSON).
func (c *Client) Presign(ctx context.Context, req messages.PresignRequest) (messages.PresignResponse, error) {
	return call[messages.PresignResponse](ctx, c, operatorapi.RoutePresign, nil, nil, req)
}

// UploadPayload stores data in the payload store and returns its ref; kind
// (may be empty) goes into the generated key. The key can then be given as
// InvocationRequest.ArgsKey. The bytes go straight to the URL presign
// answers — the control plane's own route, or its bucket — with their
// size and sha256 declared, so the store refuses anything else.
func (c *Client) UploadPayload(ctx context.Context, data []byte, kind string) (messages.PayloadRef, error) {
	size := uint64(len(data))
	digest := sha256.Sum256(data)
	sum := hex.EncodeToString(digest[:])
	req := messages.PresignRequest{Op: messages.PresignPut, Size: &size, SHA256: &sum}
	if kind != "" {
		req.Kind = &kind
	}
	p, err := c.Presign(ctx, req)
	if err != nil {
		return messages.PayloadRef{}, err
	}
	if err := c.capability(ctx, http.MethodPut, p.URL, p.Headers, data, func([]byte) error { return nil }); err != nil {
		return messages.PayloadRef{}, err
	}
	return messages.PayloadRef{Bucket: operatorapi.PayloadBucket, Key: p.Key, Size: size, ContentType: payloadContentType, SHA256: &sum}, nil
}

// payloadContentType is what UploadPayload stores.
const payloadContentType = "application/octet-stream"

// DownloadPayload reads a blob of the payload store by key.
func (c *Client) DownloadPayload(ctx context.Context, key string) ([]byte, error) {
	p, err := c.Presign(ctx, messages.PresignRequest{Op: messages.PresignGet, Key: &key})
	if err != nil {
		return nil, err
	}
	var out []byte
	err = c.capability(ctx, http.MethodGet, p.URL, p.Headers, nil, func(body []byte) error {
		out = body
		return nil
	})
	return out, err
}

// capability calls a presigned URL. The URL is its own credential, so the
// admin token is not sent along.
func (c *Client) capability(ctx context.Context, method, rawURL string, headers map[string]string, body []byte, read func([]byte) error) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return fmt.Errorf("%s payload: %w", method, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", payloadContentType)
	}
	// A bucket's presigned put signs some headers; they must be sent
	// exactly (the length is the body's).
	for k, v := range headers {
		if !strings.EqualFold(k, "Content-Length") {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return &TransportError{Method: method, URL: rawURL, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(method, req.URL.Path, resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, messages.MaxPayload+1))
	if err != nil {
		return &TransportError{Method: method, URL: rawURL, Err: err}
	}
	if len(data) > messages.MaxPayload {
		return fmt.Errorf("%s payload: more than %d bytes", method, messages.MaxPayload)
	}
	return read(data)
}
