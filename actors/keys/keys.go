// Package keys owns the daemon's signing key while it runs: the Holder that
// signs every request, and the keys actor that carries out rotate_key.
//
// A rotation makes a new keypair and posts {worker_id, public_key, key_id}
// to /v1/daemon/keys, signed by the outgoing key. Only once the control
// plane accepts (it echoes the new key_id) does the Holder switch to the new
// key — atomically, so requests in flight are signed by one key or the
// other — and the new key is written to key_file (0600, through a temporary
// file and a rename). Anything short of an acceptance — a refusal, a 4xx,
// a network error or 5xx that outlasts the retries — leaves the old key in
// use and on disk, and the reason in the log.
//
// Transient failures are retried with the same new key. The control plane
// commits a rotation before it answers and answers a repeat of it with the
// same acceptance, so an answer lost on the way does not strand the daemon
// with a key the control plane has already retired.
//
// The actor never blocks in Receive: the rotation runs in a goroutine that
// reports back by message. Whether one is under way lives in the Holder,
// outside the actor, so a restarted actor does not start a second one.
package keys

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/backoff"
	"nymph/identity"
	"nymph/messages"
)

// Name is the actor's name under the root.
const Name = "keys"

// Defaults of Deps.
const (
	DefaultAttempts       = 4
	DefaultRetryMin       = time.Second
	DefaultRetryMax       = 15 * time.Second
	DefaultRequestTimeout = 30 * time.Second
)

// Server posts a rotation; *uplink.Client satisfies it.
type Server interface {
	RotateKey(ctx context.Context, req *messages.KeysRequest, outgoing *identity.Key) (*messages.KeysResponse, error)
}

// Deps is everything the actor uses. It outlives every incarnation.
type Deps struct {
	Holder *Holder
	Server Server
	// KeyFile is where an accepted key is written ([identity] key_file).
	KeyFile string
	// WorkerID is the worker id hello gave; a rotation needs one.
	WorkerID func() string
	Log      zerolog.Logger
	// Retryable tells a transient failure from a final one (uplink.Retryable);
	// by default only a cancelled context is final.
	Retryable func(error) bool
	// Attempts bounds the posts of one rotation; the delay between them
	// is the protocol's backoff from RetryMin up to RetryMax.
	Attempts           int
	RetryMin, RetryMax time.Duration
	// RequestTimeout bounds one post.
	RequestTimeout time.Duration
	// Generate makes the new key (default identity.Generate).
	Generate func() (*identity.Key, error)
	// Save writes the accepted key (default (*identity.Key).Save).
	Save func(k *identity.Key, path string) error
	// Report, when set, is called with the outcome of every rotation.
	Report func(Result)
	// Jobs counts rotations under way, so that the daemon's Wait lets one
	// the control plane accepted write its key before the process exits
	// (default: a count of its own).
	Jobs *sync.WaitGroup
	// PropsOptions are added to the actor's props.
	PropsOptions []actor.PropsOption
}

// Result is the outcome of one rotate_key.
type Result struct {
	CommandID string
	// OldKeyID signed the request; NewKeyID is the key offered.
	OldKeyID, NewKeyID string
	// Accepted: the control plane took the new key, and the daemon now
	// signs with it.
	Accepted bool
	// Attempts is how many posts were made.
	Attempts int
	// Err says why the rotation did not happen (Accepted false), or, with
	// Accepted, why the new key could not be written to KeyFile.
	Err error
}

// Props returns the props of the keys actor.
func Props(deps *Deps) *actor.Props {
	d := *deps
	if d.Attempts <= 0 {
		d.Attempts = DefaultAttempts
	}
	if d.RetryMin <= 0 {
		d.RetryMin = DefaultRetryMin
	}
	if d.RetryMax < d.RetryMin {
		d.RetryMax = max(d.RetryMin, DefaultRetryMax)
	}
	if d.RequestTimeout <= 0 {
		d.RequestTimeout = DefaultRequestTimeout
	}
	if d.Generate == nil {
		d.Generate = identity.Generate
	}
	if d.Save == nil {
		d.Save = func(k *identity.Key, path string) error { return k.Save(path) }
	}
	if d.Retryable == nil {
		d.Retryable = func(err error) bool { return !errors.Is(err, context.Canceled) }
	}
	if d.WorkerID == nil {
		d.WorkerID = func() string { return "" }
	}
	if d.Jobs == nil {
		d.Jobs = new(sync.WaitGroup)
	}
	return actor.PropsFromProducer(func() actor.Actor { return &keysActor{d: &d} }, d.PropsOptions...)
}

// rotated is the self-message a rotation goroutine ends with.
type rotated struct{ res Result }

type keysActor struct {
	d        *Deps
	stopping bool
}

func (a *keysActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.Dispatch:
		if _, ok := m.Body.(messages.RotateKey); !ok {
			a.d.Log.Warn().Str("command_id", m.CommandID).Str("kind", m.Kind).Msg("keys: not a rotate_key; skipped")
			return
		}
		a.start(ctx, m.CommandID)
	case *rotated:
		a.finish(m.res)
	case *messages.Shutdown:
		// A rotation already posted runs to its end: abandoning it could
		// leave the control plane with the new key and the disk with the old.
		a.stopping = true
	}
}

func (a *keysActor) start(ctx actor.Context, cmdID string) {
	log := a.d.Log.With().Str("command_id", cmdID).Logger()
	if a.stopping {
		log.Warn().Msg("rotate_key received while stopping; the key is unchanged")
		return
	}
	if a.d.Holder == nil || a.d.Server == nil {
		log.Warn().Msg("rotate_key received but this daemon has no identity ([identity] enabled = false); skipped")
		return
	}
	outgoing, err := a.d.Holder.begin()
	if err != nil {
		log.Info().Str("key_id", a.d.Holder.Key().ID()).Msg("rotate_key received while a rotation is under way; skipped")
		return
	}
	sys, self := ctx.ActorSystem(), ctx.Self()
	a.d.Jobs.Add(1)
	go func() {
		defer a.d.Jobs.Done()
		res := a.d.rotate(cmdID, outgoing)
		sys.Root.Send(self, &rotated{res: res})
	}()
}

func (a *keysActor) finish(r Result) {
	log := a.d.Log.With().Str("command_id", r.CommandID).Str("worker_id", a.d.WorkerID()).
		Str("key_id", r.OldKeyID).Str("new_key_id", r.NewKeyID).Int("attempts", r.Attempts).Logger()
	switch {
	case r.Accepted && r.Err != nil:
		log.Error().Err(r.Err).Str("key_file", a.d.KeyFile).
			Msg("key rotated, but the new key could not be written to key_file: the daemon signs with it until it stops and will not authenticate after a restart")
	case r.Accepted:
		log.Info().Str("key_file", a.d.KeyFile).Msg("key rotated: now signing with the new key")
	default:
		log.Warn().Err(r.Err).Msg("key rotation failed: the old key stays in use and on disk")
	}
	if a.d.Report != nil {
		a.d.Report(r)
	}
}

// rotate runs one rotation to its end. The caller marked the Holder busy;
// rotate releases it, switched to the new key when the control plane
// accepted it.
func (d *Deps) rotate(cmdID string, outgoing *identity.Key) Result {
	res := Result{CommandID: cmdID, OldKeyID: outgoing.ID()}
	key, err := d.offer(cmdID, outgoing, &res)
	if err != nil {
		d.Holder.end(nil)
		res.Err = err
		return res
	}
	// Switch before writing the file: the control plane has retired the
	// old key, so every request signed by it from now on is refused.
	d.Holder.end(key)
	res.Accepted = true
	if err := d.Save(key, d.KeyFile); err != nil {
		res.Err = err
	}
	return res
}

// offer makes the new key and posts it until the control plane accepts it,
// refuses it, or the attempts run out.
func (d *Deps) offer(cmdID string, outgoing *identity.Key, res *Result) (*identity.Key, error) {
	wid := d.WorkerID()
	if wid == "" {
		return nil, errors.New("no worker id yet (hello has not been accepted)")
	}
	key, err := d.Generate()
	if err != nil {
		return nil, fmt.Errorf("make a new key: %w", err)
	}
	res.NewKeyID = key.ID()
	req := &messages.KeysRequest{WorkerID: wid, PublicKey: key.PublicKeyB64(), KeyID: key.ID()}
	retry := backoff.New(d.RetryMin, d.RetryMax)
	for {
		res.Attempts++
		err := d.post(req, outgoing)
		var rej *RejectError
		switch {
		case err == nil:
			return key, nil
		case errors.As(err, &rej), res.Attempts >= d.Attempts, !d.Retryable(err):
			return nil, err
		}
		delay := retry.Next()
		d.Log.Warn().Err(err).Str("command_id", cmdID).Str("new_key_id", key.ID()).Dur("retry_in", delay).
			Int("attempt", res.Attempts).Msg("key rotation: post failed; retrying with the same new key")
		time.Sleep(delay)
	}
}

// post makes one attempt; nil means the control plane accepted key.
func (d *Deps) post(req *messages.KeysRequest, outgoing *identity.Key) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.RequestTimeout)
	defer cancel()
	resp, err := d.Server.RotateKey(ctx, req, outgoing)
	switch {
	case err != nil:
		return err
	case resp.Reject != nil:
		return &RejectError{Code: resp.Reject.Code, Message: resp.Reject.Message}
	case resp.KeyID == nil || *resp.KeyID != req.KeyID:
		got := "none"
		if resp.KeyID != nil {
			got = *resp.KeyID
		}
		return &RejectError{Code: "unexpected_answer", Message: fmt.Sprintf("the control plane answered key_id %s, not %s", got, req.KeyID)}
	}
	return nil
}

// RejectError is a rotation the control plane refused outright.
type RejectError struct {
	Code    string
	Message string
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("rotation refused: %s: %s", e.Code, e.Message)
}
