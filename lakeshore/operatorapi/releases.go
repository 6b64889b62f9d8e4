package operatorapi

import "time"

// Routes of releases, over-the-air updates, target versions and queues.
//
// RouteDownloadRelease is not an operator route: it needs no token and is
// served for daemons (and anyone) as GET or HEAD, the binary at
// /v1/releases/<version>/<triple> and its sha256sum sidecar at
// /v1/releases/<version>/<triple>.sha256. A daemon trusts the sha256 in
// its authenticated ota_update command, not the download.
const (
	RoutePublishRelease     = "POST /v1/releases"
	RouteListReleases       = "GET /v1/releases"
	RouteDownloadRelease    = "GET /v1/releases/"
	RouteDeleteRelease      = "DELETE /v1/releases/{version}/{triple}"
	RouteGetTargetVersion   = "GET /v1/namespaces/{ns}/target-version"
	RouteSetTargetVersion   = "PUT /v1/namespaces/{ns}/target-version"
	RouteClearTargetVersion = "DELETE /v1/namespaces/{ns}/target-version"
	RouteUpdateWorker       = "POST /v1/namespaces/{ns}/workers/{id}/update"
	RouteCreateQueue        = "POST /v1/namespaces/{ns}/queues"
	RouteListQueues         = "GET /v1/namespaces/{ns}/queues"
	RouteEditWorkerQueues   = "POST /v1/namespaces/{ns}/workers/{id}/queues"
)

// ReleasesPrefix is the path prefix release downloads are served under.
const ReleasesPrefix = "/v1/releases"

// Query parameters of RoutePublishRelease, whose body is the raw binary
// (any content type). Triple omitted: read from the binary's ELF header.
const (
	QueryVersion = "version"
	QueryTriple  = "triple"
)

// Release is one published nymph binary. URL is where daemons download it,
// SidecarURL its sha256sum file.
type Release struct {
	Version     string    `json:"version"`
	Triple      string    `json:"triple"`
	SHA256      string    `json:"sha256"`
	Size        int64     `json:"size"`
	PublishedAt time.Time `json:"publishedAt"`
	URL         string    `json:"url"`
	SidecarURL  string    `json:"sidecarUrl"`
}

// ReleaseList is the body of RouteListReleases, oldest version first.
type ReleaseList struct {
	Releases []Release `json:"releases"`
}

// TargetVersion is the body of the target-version routes. Version nil
// means none is set. PublishedTriples lists the triples the control plane
// can serve that version for, so a caller can warn about a target no
// daemon could download from here.
type TargetVersion struct {
	Namespace        string   `json:"namespace"`
	Version          *string  `json:"version"`
	PublishedTriples []string `json:"publishedTriples"`
}

// SetTargetVersionRequest is the body of RouteSetTargetVersion.
type SetTargetVersionRequest struct {
	Version string `json:"version"`
}

// UpdateRequest is the body of RouteUpdateWorker. Every field is optional:
// Version defaults to the namespace's target version, URL to this control
// plane's release for the worker's architecture, SHA256 to the checksum
// the release store (or the URL's .sha256 sidecar) publishes.
type UpdateRequest struct {
	Version string `json:"version,omitempty"`
	URL     string `json:"url,omitempty"`
	SHA256  string `json:"sha256,omitempty"`
}

// UpdateQueued answers RouteUpdateWorker: the ota_update command queued and
// what it carries. CurrentVersion is what the daemon last said it runs.
type UpdateQueued struct {
	CommandID      string  `json:"commandId"`
	WorkerID       string  `json:"workerId"`
	Kind           string  `json:"kind"`
	Version        string  `json:"version"`
	URL            string  `json:"url"`
	SHA256         string  `json:"sha256"`
	CurrentVersion *string `json:"currentVersion"`
}

// CreateQueueRequest is the body of RouteCreateQueue.
type CreateQueueRequest struct {
	Name string `json:"name"`
}

// Queue is one queue of a namespace. CreatedAt is set for a queue an
// operator created and nil for one that exists because daemons joined it;
// Members are worker ids.
type Queue struct {
	Name      string     `json:"name"`
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	Members   []string   `json:"members"`
}

// QueueCreated answers RouteCreateQueue; Created is false when the queue
// already existed.
type QueueCreated struct {
	Queue   Queue `json:"queue"`
	Created bool  `json:"created"`
}

// QueueList is the body of RouteListQueues, ordered by name.
type QueueList struct {
	Queues []Queue `json:"queues"`
}

// QueueEditRequest is the body of RouteEditWorkerQueues. Adding a queue
// that does not exist is a 400 naming it.
type QueueEditRequest struct {
	Add    []string `json:"add,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// WorkerQueues answers RouteEditWorkerQueues. Queues is the effective
// membership; Lanes are what the daemon names on hello; Added and Removed
// are the operator's edits, which survive the daemon's next hello.
type WorkerQueues struct {
	WorkerID string   `json:"workerId"`
	Queues   []string `json:"queues"`
	Lanes    []string `json:"lanes"`
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
}
