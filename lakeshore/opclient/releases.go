package opclient

import (
	"context"
	"io"
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
	return call[operatorapi.Release](ctx, c, operatorapi.RoutePublishRelease, nil, q, upload{body, size})
}

// ListReleases returns every published binary, oldest version first
// (RouteListReleases).
func (c *Client) ListReleases(ctx context.Context) ([]operatorapi.Release, error) {
	out, err := call[operatorapi.ReleaseList](ctx, c, operatorapi.RouteListReleases, nil, nil, nil)
	return nonNil(out.Releases, err)
}

// TargetVersion returns the namespace's target version
// (RouteGetTargetVersion); Version is nil when none is set.
func (c *Client) TargetVersion(ctx context.Context) (operatorapi.TargetVersion, error) {
	return normTarget(call[operatorapi.TargetVersion](ctx, c, operatorapi.RouteGetTargetVersion, nil, nil, nil))
}

// SetTargetVersion sets the namespace's target version
// (RouteSetTargetVersion).
func (c *Client) SetTargetVersion(ctx context.Context, version string) (operatorapi.TargetVersion, error) {
	return normTarget(call[operatorapi.TargetVersion](ctx, c, operatorapi.RouteSetTargetVersion, nil, nil, operatorapi.SetTargetVersionRequest{Version: version}))
}

// ClearTargetVersion removes the namespace's target version
// (RouteClearTargetVersion).
func (c *Client) ClearTargetVersion(ctx context.Context) (operatorapi.TargetVersion, error) {
	return normTarget(call[operatorapi.TargetVersion](ctx, c, operatorapi.RouteClearTargetVersion, nil, nil, nil))
}

func normTarget(t operatorapi.TargetVersion, err error) (operatorapi.TargetVersion, error) {
	if t.PublishedTriples == nil {
		t.PublishedTriples = []string{}
	}
	return t, err
}

// UpdateWorker queues an ota_update on a worker (RouteUpdateWorker); what
// req leaves empty the control plane derives.
func (c *Client) UpdateWorker(ctx context.Context, workerID string, req operatorapi.UpdateRequest) (operatorapi.UpdateQueued, error) {
	return call[operatorapi.UpdateQueued](ctx, c, operatorapi.RouteUpdateWorker, params{"id": workerID}, nil, req)
}

// CreateQueue creates a queue in the namespace (RouteCreateQueue); creating
// one that exists is not an error (Created is false).
func (c *Client) CreateQueue(ctx context.Context, name string) (operatorapi.QueueCreated, error) {
	out, err := call[operatorapi.QueueCreated](ctx, c, operatorapi.RouteCreateQueue, nil, nil, operatorapi.CreateQueueRequest{Name: name})
	if out.Queue.Members == nil {
		out.Queue.Members = []string{}
	}
	return out, err
}

// ListQueues returns the namespace's queues, created or joined by daemons
// (RouteListQueues).
func (c *Client) ListQueues(ctx context.Context) ([]operatorapi.Queue, error) {
	out, err := call[operatorapi.QueueList](ctx, c, operatorapi.RouteListQueues, nil, nil, nil)
	for i := range out.Queues {
		if out.Queues[i].Members == nil {
			out.Queues[i].Members = []string{}
		}
	}
	return nonNil(out.Queues, err)
}

// EditWorkerQueues adds a worker to queues and removes it from others
// (RouteEditWorkerQueues).
func (c *Client) EditWorkerQueues(ctx context.Context, workerID string, req operatorapi.QueueEditRequest) (operatorapi.WorkerQueues, error) {
	return call[operatorapi.WorkerQueues](ctx, c, operatorapi.RouteEditWorkerQueues, params{"id": workerID}, nil, req)
}

// DeleteRelease removes the binary published for version and triple
// (RouteDeleteRelease). A version some namespace targets is refused (409).
func (c *Client) DeleteRelease(ctx context.Context, version, triple string) (operatorapi.Release, error) {
	return call[operatorapi.Release](ctx, c, operatorapi.RouteDeleteRelease, params{"version": version, "triple": triple}, nil, nil)
}
