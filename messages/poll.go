package messages

import "github.com/vmihailenco/msgpack/v5"

// PollRequest is the body of POST /v1/daemon/poll.
type PollRequest struct {
	WorkerID            string             `msgpack:"worker_id"`
	Queue               string             `msgpack:"queue"`
	TimeoutS            float64            `msgpack:"timeout_s"`
	Cursor              *string            `msgpack:"cursor"`
	Invocations         []InvocationStatus `msgpack:"invocations"`
	UpdatedCapabilities *Capabilities      `msgpack:"updated_capabilities,omitempty"`
	// Hibernating marks a watch poll (beyond the spec; sent only to a
	// control plane whose hello offered HibernateWake): the daemon is
	// hibernating and wants an answer only when a wake is queued for it.
	Hibernating bool `msgpack:"hibernating,omitempty"`
}

func (p *PollRequest) normalize() {
	if p.Invocations == nil {
		p.Invocations = []InvocationStatus{}
	}
	if p.UpdatedCapabilities != nil {
		c := *p.UpdatedCapabilities
		c.normalize()
		p.UpdatedCapabilities = &c
	}
}

// InvocationStatus reports one locally tracked run on each poll.
type InvocationStatus struct {
	InvocationID string `msgpack:"invocation_id"`
	State        string `msgpack:"state"`
	StartedAt    Epoch  `msgpack:"started_at"`
	ExitCode     *int32 `msgpack:"exit_code"`
	StdoutTail   string `msgpack:"stdout_tail"`
}

// PollResponse carries commands. Cursor is this project's extension: the
// daemon echoes it on its next poll, which acknowledges the batch.
type PollResponse struct {
	Commands           []Command `msgpack:"commands"`
	TargetNymphVersion *string   `msgpack:"target_nymph_version"`
	Cursor             *string   `msgpack:"cursor"`
}

func (p *PollResponse) normalize() {
	if p.Commands == nil {
		p.Commands = []Command{}
	}
	var cmds []Command
	for i := range p.Commands {
		if len(p.Commands[i].Body) == 0 {
			if cmds == nil {
				cmds = append([]Command(nil), p.Commands...)
			}
			cmds[i].normalize()
		}
	}
	if cmds != nil {
		p.Commands = cmds
	}
}

// Command is one queued instruction. Body stays raw until dispatched on Kind
// by DecodeCommand.
type Command struct {
	ID   string             `msgpack:"id"`
	Kind string             `msgpack:"kind"`
	Body msgpack.RawMessage `msgpack:"body"`
}

// normalize sends a missing body as nil: an empty raw message would write
// nothing at all and shift every key after it.
func (c *Command) normalize() {
	if len(c.Body) == 0 {
		c.Body = msgpack.RawMessage{0xc0}
	}
}
