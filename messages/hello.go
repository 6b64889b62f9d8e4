package messages

// HelloRequest is the body of POST /v1/daemon/hello.
type HelloRequest struct {
	MachineID    string       `msgpack:"machine_id"`
	Label        string       `msgpack:"label"`
	Tags         []string     `msgpack:"tags"`
	Lanes        []string     `msgpack:"lanes,omitempty"`
	Capabilities Capabilities `msgpack:"capabilities"`
	Versions     Versions     `msgpack:"versions"`
	PublicKey    string       `msgpack:"public_key,omitempty"`
	// Extras the original control plane ignores (it skips unknown keys).
	// Incarnation is new with every process start (never with a re-hello
	// of the same process): a control plane seeing it change knows the
	// jobs the previous process held are lost unless reported. SingleJob
	// says keep_alive_s = 0: hand this daemon one job at most.
	Incarnation string `msgpack:"incarnation,omitempty"`
	SingleJob   bool   `msgpack:"single_job,omitempty"`
}

func (h *HelloRequest) normalize() {
	if h.Tags == nil {
		h.Tags = []string{}
	}
	h.Capabilities.normalize()
}

// Capabilities is what a host can actually run.
type Capabilities struct {
	Runners        []string `msgpack:"runners"`
	MaxInvocations uint32   `msgpack:"max_invocations"`
	Workdir        string   `msgpack:"workdir"`
}

func (c *Capabilities) normalize() {
	if c.Runners == nil {
		c.Runners = []string{}
	}
}

// Versions is the best-effort boot-time probe of binaries and tooling; a
// probe that fails is nil.
type Versions struct {
	Daemon   *string  `msgpack:"daemon"`
	Protocol *string  `msgpack:"protocol"`
	Runsc    *string  `msgpack:"runsc"`
	Docker   *string  `msgpack:"docker"`
	Python   *string  `msgpack:"python"`
	Kernel   *string  `msgpack:"kernel"`
	Distro   *string  `msgpack:"distro"`
	Arch     *string  `msgpack:"arch"`
	CPU      *CPUInfo `msgpack:"cpu"`
	GPU      []GPU    `msgpack:"gpu"`
}

// CPUInfo is read from /proc/cpuinfo.
type CPUInfo struct {
	Model string `msgpack:"model"`
	Cores uint32 `msgpack:"cores"`
}

// GPU is one line of nvidia-smi plus its CUDA header.
type GPU struct {
	Name   string  `msgpack:"name"`
	Driver string  `msgpack:"driver"`
	CUDA   *string `msgpack:"cuda"`
}

// Reject is a refusal of a hello, sent as HTTP 200.
type Reject struct {
	Code    string `msgpack:"code"`
	Message string `msgpack:"message"`
}

// Reject codes of the hello route.
const (
	RejectProtocolMismatch            = "protocol_mismatch"
	RejectEnrollTokenRequired         = "enroll_token_required"
	RejectInvalidEnrollToken          = "invalid_enroll_token"
	RejectEnrollTokenConsumed         = "enroll_token_consumed"
	RejectEnrollTokenExpired          = "enroll_token_expired"
	RejectEnrollSignatureRequired     = "enroll_signature_required"
	RejectKeyIDMismatch               = "key_id_mismatch"
	RejectEnrollSignatureInvalid      = "enroll_signature_invalid"
	RejectEnrollmentSignatureRequired = "enrollment_signature_required"
	// The two below are this control plane's: a daemon token is bound to
	// the worker of its first hello.
	RejectTokenBound  = "token_bound_elsewhere"
	RejectWorkerBound = "worker_bound_to_another_token"
)

// HelloResponse answers a hello. Cursor is where this daemon's first poll
// starts; a nil cursor means the server keeps legacy delete-on-delivery.
type HelloResponse struct {
	WorkerID           *string        `msgpack:"worker_id"`
	SessionToken       *string        `msgpack:"session_token"`
	SessionTTLS        uint64         `msgpack:"session_ttl_s"`
	Config             map[string]any `msgpack:"config"`
	Cursor             *string        `msgpack:"cursor"`
	Reject             *Reject        `msgpack:"reject"`
	KeyID              *string        `msgpack:"key_id"`
	KeyRotationMaxAgeS uint64         `msgpack:"key_rotation_max_age_s"`
	ServerTimeEpochS   *Epoch         `msgpack:"server_time_epoch_s"`
	// HibernateWake (beyond the spec; old daemons skip the key) says this
	// control plane answers a watch poll (PollRequest.Hibernating) as soon
	// as a wake is queued, so a hibernating daemon may keep one open and
	// wake early.
	HibernateWake bool `msgpack:"hibernate_wake,omitempty"`
}

func (h *HelloResponse) normalize() {
	if h.Config == nil {
		h.Config = map[string]any{}
	}
}

// ValidationError is the 422 body of a malformed daemon request.
type ValidationError struct {
	Error string `msgpack:"error" json:"error"`
	Field string `msgpack:"field" json:"field"`
}
