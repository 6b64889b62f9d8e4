package store

import (
	"context"
	"time"
)

// TargetVersions holds each namespace's target_nymph_version: the daemon
// version every poll response advertises, which `daemon update` falls back
// to and auto-updating daemons converge on.
type TargetVersions interface {
	// TargetVersion returns the namespace's target, nil when none is set.
	TargetVersion(ctx context.Context, namespace string) (*string, error)
	// SetTargetVersion sets the target, or clears it when version is nil.
	SetTargetVersion(ctx context.Context, namespace string, version *string, now time.Time) error
	// NamespacesTargeting lists, sorted, the namespaces whose target is
	// version.
	NamespacesTargeting(ctx context.Context, version string) ([]string, error)
}
