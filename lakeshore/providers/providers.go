// Package providers owns the machines the control plane launches daemons
// on: a registered provider's description (Spec, stored and shown, never a
// secret) and, for each kind, a Launcher that starts an instance running a
// rendered bootstrap, terminates it, and reads its console.
//
// Kinds: ec2 (the AWS SDK, credentials from the standard chain of the
// serve process), podman (a container on this host) and script (an
// operator's executable speaking JSON on stdin and stdout, for every other
// cloud). The subpackage bootstrap renders what an instance runs first.
//
// A Launcher is safe for concurrent use: a launch of --count N calls Launch
// from up to --concurrency goroutines at once.
package providers

import (
	"context"
	"encoding/json"
	"errors"

	"nymph/lakeshore/providers/providerspec"
)

// The settings types live in providerspec, which links no provider's SDK,
// so the operator CLI can bind them to its flags.
type (
	Kind       = providerspec.Kind
	Spec       = providerspec.Spec
	EC2Spec    = providerspec.EC2Spec
	PodmanSpec = providerspec.PodmanSpec
	ScriptSpec = providerspec.ScriptSpec
)

// The provider kinds.
const (
	KindEC2    = providerspec.KindEC2
	KindPodman = providerspec.KindPodman
	KindScript = providerspec.KindScript
)

// LaunchRequest is one instance to start.
type LaunchRequest struct {
	// WorkerID is the Worker row the instance's daemon will be: launchers
	// tag or name the instance with it so an operator can match the two.
	WorkerID string
	// Name is the daemon's label and the instance's Name tag.
	Name string
	// Bootstrap is the rendered bash script the instance runs as root on
	// first boot (ec2 user data, the podman entrypoint, the script's
	// request). It carries the daemon's token: never log it.
	Bootstrap string
	// Capacity is the operator's --capacity JSON object, verbatim; nil when
	// none was given.
	Capacity json.RawMessage
}

// Instance is what a launch started.
type Instance struct {
	// ID is the provider's name for it (an ec2 instance id, a container
	// id, whatever the script answered); Terminate and ConsoleLog take it.
	ID string
}

// Launcher starts and ends the instances of one registered provider.
type Launcher interface {
	// Check verifies, cheaply, that the provider can work as configured:
	// its credentials are accepted and its image exists. `provider add`
	// calls it so a wrong credential is an error then, not at launch.
	Check(ctx context.Context) error
	// Launch starts one instance. A throttled call is retried inside, with
	// backoff, until ctx ends; any other failure returns at once.
	Launch(ctx context.Context, req LaunchRequest) (Instance, error)
	// Terminate ends an instance; one that is already gone is not an error.
	Terminate(ctx context.Context, instanceID string) error
	// ConsoleLog returns the instance's console output (serial console,
	// container log). latest=false asks ec2 for the whole buffer rather
	// than the most recent output; other kinds ignore it.
	ConsoleLog(ctx context.Context, instanceID string, latest bool) (string, error)
}

// ErrInstanceGone is what ConsoleLog returns for an instance the provider
// no longer knows.
var ErrInstanceGone = errors.New("instance not found at the provider")
