package operatorapi

// Routes of daemon keys. A worker's keys are listed in Worker.Keys.
const (
	// RouteRotateKey queues a rotate_key command: the daemon makes a new
	// keypair and replaces its key through /v1/daemon/keys. Answered with
	// Queued; 409 when the daemon has no enrolled key.
	RouteRotateKey = "POST /v1/namespaces/{ns}/workers/{id}/rotate-key"
	// RouteRevokeKey revokes a daemon's key at once (RevokeKeyRequest,
	// answered with RevokeKeyResponse). The daemon needs a fresh enrollment
	// token, and a new key, to come back.
	RouteRevokeKey = "POST /v1/namespaces/{ns}/workers/{id}/revoke-key"
)

// RevokeKeyRequest names the key to revoke; empty means the current one.
type RevokeKeyRequest struct {
	KeyID string `json:"keyId,omitempty"`
}

// RevokeKeyResponse is the key as it now is.
type RevokeKeyResponse struct {
	WorkerID string  `json:"workerId"`
	Key      KeyInfo `json:"key"`
}
