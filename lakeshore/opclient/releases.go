package opclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"nymph/lakeshore/operatorapi"
)

// PublishRelease uploads a nymph binary as version for triple
// (RoutePublishRelease), streaming it from body. size is the body's length
// when known (it lets the server refuse an oversized binary before the
// upload), else -1. An empty triple lets the server read it from the
// binary.
func (c *Client) PublishRelease(ctx context.Context, body io.Reader, size int64, version, triple string) (operatorapi.Release, error) {
	q := url.Values{operatorapi.QueryVersion: {version}}
	if triple != "" {
		q.Set(operatorapi.QueryTriple, triple)
	}
	method, path, err := routePath(operatorapi.RoutePublishRelease, c.namespace, nil)
	if err != nil {
		return operatorapi.Release{}, err
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path+"?"+q.Encode(), body)
	if err != nil {
		return operatorapi.Release{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return operatorapi.Release{}, &TransportError{Method: method, URL: c.base.String() + path, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return operatorapi.Release{}, decodeError(method, path, resp)
	}
	var out operatorapi.Release
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return operatorapi.Release{}, fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	return out, nil
}

// ListReleases returns every published binary, oldest version first
// (RouteListReleases).
func (c *Client) ListReleases(ctx context.Context) ([]operatorapi.Release, error) {
	var out operatorapi.ReleaseList
	if err := c.do(ctx, operatorapi.RouteListReleases, nil, nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Releases == nil {
		out.Releases = []operatorapi.Release{}
	}
	return out.Releases, nil
}

// TargetVersion returns the namespace's target version
// (RouteGetTargetVersion); Version is nil when none is set.
func (c *Client) TargetVersion(ctx context.Context) (operatorapi.TargetVersion, error) {
	var out operatorapi.TargetVersion
	err := c.do(ctx, operatorapi.RouteGetTargetVersion, nil, nil, nil, &out)
	return normTarget(out), err
}

// SetTargetVersion sets the namespace's target version
// (RouteSetTargetVersion).
func (c *Client) SetTargetVersion(ctx context.Context, version string) (operatorapi.TargetVersion, error) {
	var out operatorapi.TargetVersion
	err := c.do(ctx, operatorapi.RouteSetTargetVersion, nil, nil, operatorapi.SetTargetVersionRequest{Version: version}, &out)
	return normTarget(out), err
}

// ClearTargetVersion removes the namespace's target version
// (RouteClearTargetVersion).
func (c *Client) ClearTargetVersion(ctx context.Context) (operatorapi.TargetVersion, error) {
	var out operatorapi.TargetVersion
	err := c.do(ctx, operatorapi.RouteClearTargetVersion, nil, nil, nil, &out)
	return normTarget(out), err
}

func normTarget(t operatorapi.TargetVersion) operatorapi.TargetVersion {
	if t.PublishedTriples == nil {
		t.PublishedTriples = []string{}
	}
	return t
}

// UpdateWorker queues an ota_update on a worker (RouteUpdateWorker); what
// req leaves empty the control plane derives.
func (c *Client) UpdateWorker(ctx context.Context, workerID string, req operatorapi.UpdateRequest) (operatorapi.UpdateQueued, error) {
	var out operatorapi.UpdateQueued
	err := c.do(ctx, operatorapi.RouteUpdateWorker, params{"id": workerID}, nil, req, &out)
	return out, err
}

// CreateQueue creates a queue in the namespace (RouteCreateQueue); creating
// one that exists is not an error (Created is false).
func (c *Client) CreateQueue(ctx context.Context, name string) (operatorapi.QueueCreated, error) {
	var out operatorapi.QueueCreated
	err := c.do(ctx, operatorapi.RouteCreateQueue, nil, nil, operatorapi.CreateQueueRequest{Name: name}, &out)
	if out.Queue.Members == nil {
		out.Queue.Members = []string{}
	}
	return out, err
}

// ListQueues returns the namespace's queues, created or joined by daemons
// (RouteListQueues).
func (c *Client) ListQueues(ctx context.Context) ([]operatorapi.Queue, error) {
	var out operatorapi.QueueList
	if err := c.do(ctx, operatorapi.RouteListQueues, nil, nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Queues == nil {
		out.Queues = []operatorapi.Queue{}
	}
	for i := range out.Queues {
		if out.Queues[i].Members == nil {
			out.Queues[i].Members = []string{}
		}
	}
	return out.Queues, nil
}

// EditWorkerQueues adds a worker to queues and removes it from others
// (RouteEditWorkerQueues).
func (c *Client) EditWorkerQueues(ctx context.Context, workerID string, req operatorapi.QueueEditRequest) (operatorapi.WorkerQueues, error) {
	var out operatorapi.WorkerQueues
	err := c.do(ctx, operatorapi.RouteEditWorkerQueues, params{"id": workerID}, nil, req, &out)
	return out, err
}

// DeleteRelease removes the binary published for version and triple
// (RouteDeleteRelease). A version some namespace targets is refused (409).
func (c *Client) DeleteRelease(ctx context.Context, version, triple string) (operatorapi.Release, error) {
	var out operatorapi.Release
	err := c.do(ctx, operatorapi.RouteDeleteRelease, params{"version": version, "triple": triple}, nil, nil, &out)
	return out, err
}
