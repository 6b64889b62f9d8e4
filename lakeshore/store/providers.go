package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrExists is returned (wrapped) when a create names a row that exists.
var ErrExists = errors.New("store: already exists")

// Provider is one registered provider. Spec is the JSON of
// providers.Spec: the store keeps it whole and never looks inside.
type Provider struct {
	Name      string
	Kind      string
	Spec      json.RawMessage
	CreatedAt time.Time
}

// Launch is one worker row a provider launch makes before it calls the
// launcher: the row (state pending, no machine yet) and its daemon's
// token, bound to it from the start, with its setup FIFO.
type Launch struct {
	WorkerID  string
	Namespace string
	Label     string
	Provider  string
	Tags      []string
	Queues    []string
	Runners   []string
	Now       time.Time
	// Token is minted for this worker alone; WorkerID is set to the
	// worker's by LaunchWorker.
	Token Token
	// Setup is the worker's setup FIFO, queued in order (Kind setup).
	Setup []NewCommand
}

// Providers holds registered providers and the rows they launch.
type Providers interface {
	// CreateProvider registers p; a name taken is ErrExists.
	CreateProvider(ctx context.Context, p Provider) error
	// Provider returns one provider; ErrNotFound when there is none.
	Provider(ctx context.Context, name string) (Provider, error)
	// ListProviders returns every provider by name.
	ListProviders(ctx context.Context) ([]Provider, error)
	// DeleteProvider removes one provider; ErrNotFound when there is none.
	// The workers it launched keep their rows (and its name).
	DeleteProvider(ctx context.Context, name string) error

	// LaunchWorker creates, in one transaction, the pending worker row of
	// l, its token (bound to it) and its setup commands. The first hello
	// made with that token adopts the row (see Hello.TokenID): the
	// daemon's machine and label become its identity, and it turns
	// setting_up or active.
	LaunchWorker(ctx context.Context, l Launch) (Worker, error)
	// SetInstance records the provider's id for a launched worker's
	// instance. ErrNotFound when the row is gone (killed meanwhile).
	SetInstance(ctx context.Context, workerID, instanceID string) error
}
