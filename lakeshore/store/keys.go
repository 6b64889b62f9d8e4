package store

import (
	"context"
	"errors"
	"time"
)

// Refusals of the Keys methods, wrapped; match with errors.Is.
var (
	// ErrTokenConsumed: the enrollment token was already used.
	ErrTokenConsumed = errors.New("store: token already consumed")
	// ErrTokenExpired: the enrollment token's expiry has passed.
	ErrTokenExpired = errors.New("store: token expired")
	// ErrKeyExists: a key with that id is already stored (current or
	// revoked); a key id is never enrolled twice.
	ErrKeyExists = errors.New("store: key already enrolled")
	// ErrKeyNotCurrent: the key is revoked, unknown, or not the named
	// worker's current key.
	ErrKeyNotCurrent = errors.New("store: key is not the worker's current key")
)

// Keys holds the Ed25519 public keys daemons enrolled, and consumes the
// one-shot enrollment tokens that admit them. A worker has at most one
// current (unrevoked) key; every method that adds one revokes the previous
// one in the same transaction. Keys outlive their worker row: a key whose
// worker was deleted can be moved to the row its daemon re-creates.
type Keys interface {
	// ConsumeToken marks the enrollment token id consumed by `by` at now,
	// atomically: of concurrent callers exactly one succeeds. A consumed
	// token is ErrTokenConsumed, an expired one ErrTokenExpired, an unknown,
	// revoked or non-enrollment token ErrNotFound.
	ConsumeToken(ctx context.Context, id, by string, now time.Time) error
	// ReleaseToken undoes ConsumeToken(id, by) when what the token was
	// consumed for could not be completed. A token consumed by someone else
	// is left alone.
	ReleaseToken(ctx context.Context, id, by string) error
	// AddKey stores k as its worker's current key and revokes (at
	// k.CreatedAt) whatever key the worker had. A stored key id is
	// ErrKeyExists.
	AddKey(ctx context.Context, k Key) error
	// RotateKey replaces the worker's current key oldID by k: oldID is
	// revoked with ReplacedBy = k.ID and k becomes current, atomically.
	// oldID not being k.WorkerID's current key is ErrKeyNotCurrent; a stored
	// k.ID is ErrKeyExists.
	RotateKey(ctx context.Context, oldID string, k Key) error
	// RevokeKey revokes the worker's key keyID, or its current key when
	// keyID is empty, and returns it as it now is. Revoking a revoked key
	// changes nothing. No such key of that worker is ErrNotFound.
	RevokeKey(ctx context.Context, workerID, keyID string, now time.Time) (Key, error)
	// RebindKey moves the current key keyID from worker `from` (whose row is
	// gone) to worker `to`. It is ErrKeyNotCurrent when the key is not
	// `from`'s current key any more or `to` already has a current key.
	RebindKey(ctx context.Context, keyID, from, to string) error
	// Key returns one key by id.
	Key(ctx context.Context, id string) (Key, error)
	// CurrentKey returns the worker's current key, ErrNotFound when none.
	CurrentKey(ctx context.Context, workerID string) (Key, error)
	// CurrentKeyOf is CurrentKey for the worker a hello names.
	CurrentKeyOf(ctx context.Context, namespace, machineID, helloLabel string) (Key, error)
	// WorkerKeys lists every key a worker ever had, oldest first.
	WorkerKeys(ctx context.Context, workerID string) ([]Key, error)
	// NamespaceKeys lists the keys of every worker of a namespace, oldest
	// first.
	NamespaceKeys(ctx context.Context, namespace string) ([]Key, error)
}

// Key is one enrolled public key.
type Key struct {
	ID        string // identity.KeyID of PublicKey
	WorkerID  string
	Namespace string
	PublicKey []byte // raw 32 bytes
	CreatedAt time.Time
	RevokedAt *time.Time
	// ReplacedBy is the key that rotation put in its place; empty when the
	// key is current or was revoked outright.
	ReplacedBy string
}
