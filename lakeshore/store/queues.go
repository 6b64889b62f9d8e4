package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"nymph/lakeshore/operatorapi"
)

// Queues holds the queues of a namespace and the operator's edits of worker
// membership.
//
// A queue exists once an operator creates it or a daemon joins it (by a lane
// in its hello or by the queue it polls). A worker's membership has two
// sources kept apart: the lanes its daemon names on every hello, and the
// operator's additions and removals, which a re-hello leaves alone. The
// effective membership (Worker.Queues) merges them on read.
type Queues interface {
	// CreateQueue records a queue; created is false when it was already
	// recorded.
	CreateQueue(ctx context.Context, namespace, name string, now time.Time) (created bool, err error)
	// ListQueues returns every queue of the namespace, created or joined,
	// ordered by name.
	ListQueues(ctx context.Context, namespace string) ([]Queue, error)
	// EditWorkerQueues applies one membership edit atomically and returns the
	// worker as it reads afterwards. Adding a queue that does not exist is an
	// *UnknownQueueError; an unknown worker is ErrNotFound.
	EditWorkerQueues(ctx context.Context, e QueueEdit) (Worker, error)
}

// Queue is one queue of a namespace.
type Queue struct {
	Name string
	// CreatedAt is when an operator created it; nil for a queue that exists
	// only because daemons joined it.
	CreatedAt *time.Time
	// Members are the ids of the workers whose effective queues or poll
	// queue name it, in id order.
	Members []string
}

// QueueEdit adds a worker to queues and removes it from others. A queue in
// both lists is a caller error the store does not arbitrate: Remove wins.
type QueueEdit struct {
	Namespace string
	WorkerID  string
	Add       []string
	Remove    []string
}

// ErrUnknownQueue is wrapped by UnknownQueueError.
var ErrUnknownQueue = errors.New("store: unknown queue")

// UnknownQueueError names a queue that neither an operator created nor a
// daemon joined.
type UnknownQueueError struct{ Name string }

func (e *UnknownQueueError) Error() string {
	return fmt.Sprintf("queue %q does not exist", e.Name)
}

func (e *UnknownQueueError) Unwrap() error { return ErrUnknownQueue }

// EffectiveQueues merges a worker's two membership sources: its lanes, then
// the operator's additions, without duplicates and without anything the
// operator removed. An operator removal therefore outlasts the daemon naming
// the lane again on its next hello.
func EffectiveQueues(lanes, added, removed []string) []string {
	out := make([]string, 0, len(lanes)+len(added))
	for _, src := range [][]string{lanes, added} {
		for _, q := range src {
			if !slices.Contains(out, q) && !slices.Contains(removed, q) {
				out = append(out, q)
			}
		}
	}
	return out
}

// ApplyQueueEdit returns the operator's additions and removals after e:
// adding a queue cancels an earlier removal of it and removing one cancels
// an earlier addition, so the two lists never share a name.
func ApplyQueueEdit(added, removed []string, e QueueEdit) (newAdded, newRemoved []string) {
	newAdded = slices.Clone(added)
	newRemoved = slices.Clone(removed)
	for _, q := range e.Add {
		newRemoved = slices.DeleteFunc(newRemoved, func(s string) bool { return s == q })
		if !slices.Contains(newAdded, q) {
			newAdded = append(newAdded, q)
		}
	}
	for _, q := range e.Remove {
		newAdded = slices.DeleteFunc(newAdded, func(s string) bool { return s == q })
		if !slices.Contains(newRemoved, q) {
			newRemoved = append(newRemoved, q)
		}
	}
	if newAdded == nil {
		newAdded = []string{}
	}
	if newRemoved == nil {
		newRemoved = []string{}
	}
	return newAdded, newRemoved
}

// RoutingQueues is the one membership rule for handing work to a worker by
// queue: an exec routed to a queue and an invocation claimed at poll time
// both follow it. It is the effective membership (Queues) plus the queue
// the daemon polls, the default queue when it names none, unless an
// operator removed that one: an operator's removal outranks the daemon's
// poll, and an operator's addition counts whatever the daemon polls.
func (w Worker) RoutingQueues() []string {
	out := slices.Clone(w.Queues)
	pq := w.PollQueue
	if pq == "" {
		pq = operatorapi.DefaultQueue
	}
	if !slices.Contains(out, pq) && !slices.Contains(w.QueuesRemoved, pq) {
		out = append(out, pq)
	}
	return out
}

// InQueue reports whether w takes work sent to queue. A trailing '*' on
// either side is a prefix match, so a daemon polling "gpu-*" takes
// "gpu-a100", and an exec for "gpu-*" reaches a member of "gpu-h100".
func (w Worker) InQueue(queue string) bool {
	for _, q := range w.RoutingQueues() {
		if QueueMatch(q, queue) || QueueMatch(queue, q) {
			return true
		}
	}
	return false
}

// QueueMatch reports whether name matches pattern: equal, or pattern ends
// in '*' and name starts with the rest.
func QueueMatch(pattern, name string) bool {
	if p, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return pattern == name
}
