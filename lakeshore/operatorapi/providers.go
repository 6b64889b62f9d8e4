package operatorapi

import (
	"encoding/json"
	"time"
)

// Provider routes: registered providers, launches through them, and what
// a launched machine printed.
const (
	RouteCreateProvider = "POST /v1/providers"
	RouteListProviders  = "GET /v1/providers"
	RouteGetProvider    = "GET /v1/providers/{name}"
	RouteDeleteProvider = "DELETE /v1/providers/{name}"
	// RouteLaunch launches daemons through a provider and answers once every
	// launcher call has (LaunchResponse).
	RouteLaunch = "POST /v1/namespaces/{ns}/workers/launch"
	// RouteLaunchLog is a launched daemon's console output. Query: latest=
	// false asks for the whole buffer where the provider has one (ec2).
	RouteLaunchLog = "GET /v1/namespaces/{ns}/workers/{id}/launch-log"
)

// Provider is one registered provider. Config is the kind's settings as a
// JSON object with the snake_case keys of `lakeshore provider show`
// (ec2: region, endpoint, profile, image_id, instance_type, subnet_id,
// security_group_ids, key_name, iam_instance_profile; podman: image, cli,
// run_args; script: command). It never holds a secret.
type Provider struct {
	Name      string          `json:"name"`
	Kind      string          `json:"kind"`
	Config    json.RawMessage `json:"config"`
	CreatedAt time.Time       `json:"createdAt"`
	// Workers counts the namespace's workers it launched that still have
	// a row (reads only).
	Workers int `json:"workers"`
}

// ProviderRequest registers a provider (RouteCreateProvider). Unless
// NoCheck, the control plane first checks that the provider works as
// configured (credentials, image) and refuses it otherwise.
type ProviderRequest struct {
	Name    string          `json:"name"`
	Kind    string          `json:"kind"`
	Config  json.RawMessage `json:"config"`
	NoCheck bool            `json:"noCheck,omitempty"`
}

// ProviderList is the body of RouteListProviders, by name.
type ProviderList struct {
	Providers []Provider `json:"providers"`
}

// Launch bounds.
const (
	MaxLaunchCount       = 100
	DefaultLaunchWorkers = 5
)

// LaunchRequest launches Count daemons through Provider (RouteLaunch).
// Name (with Count > 1 a prefix: name-00, name-01, …) is each daemon's
// label and the instance's Name tag; empty means <provider>-<short id>.
// Label, when set, is the label instead of Name. Capacity is handed to
// the launcher verbatim. Setup scripts become each worker's setup FIFO;
// BootstrapScript runs as root before nymph starts.
type LaunchRequest struct {
	Provider        string          `json:"provider"`
	Name            string          `json:"name,omitempty"`
	Label           string          `json:"label,omitempty"`
	Count           int             `json:"count,omitempty"`
	Concurrency     int             `json:"concurrency,omitempty"`
	Capacity        json.RawMessage `json:"capacity,omitempty"`
	Tags            []string        `json:"tags,omitempty"`
	Queues          []string        `json:"queues,omitempty"`
	Runners         []string        `json:"runners,omitempty"`
	KeepAliveS      *int            `json:"keepAliveS,omitempty"`
	BootstrapScript string          `json:"bootstrapScript,omitempty"`
	SetupScripts    []string        `json:"setupScripts,omitempty"`
}

// LaunchResponse answers RouteLaunch: the workers launched (state
// pending until their first hello), and the launches that failed, whose
// rows were removed. The status is 201 when every launch worked, 207 when
// some did; when none did it is a 502 Error naming each failure.
type LaunchResponse struct {
	Launched []Worker        `json:"launched"`
	Failed   []LaunchFailure `json:"failed"`
}

// LaunchFailure is one launch that did not start an instance.
type LaunchFailure struct {
	Name  string `json:"name"`
	Error string `json:"error"`
}

// LaunchLog is the body of RouteLaunchLog.
type LaunchLog struct {
	WorkerID   string `json:"workerId"`
	Provider   string `json:"provider"`
	InstanceID string `json:"instanceId"`
	Output     string `json:"output"`
}
