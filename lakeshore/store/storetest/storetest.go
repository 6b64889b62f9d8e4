// Package storetest is the one conformance suite every store.Store passes:
// what each method promises (the cursor, redelivery, claims guarded by
// state, one job for a single-job worker, one-shot tokens, tokens bound to workers, key rotation, idempotent reports, durability
// across a reopen), and, on a backend several replicas share, that those
// promises hold when the replicas race each other.
//
// A backend's tests call Run with a way to make empty databases.
package storetest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/store"
)

// Backend tells the suite how to get databases.
type Backend struct {
	// NewDatabase makes an empty database and returns a function that opens
	// a store on it. Each call opens another, independent store: a second
	// replica, or the same database after a restart. The suite closes every
	// store it opens (some early, to reopen the database), exactly once.
	NewDatabase func(t *testing.T) (open func(t *testing.T) store.Store)
	// Replicas says several stores open on one database may be used at
	// once, as control-plane replicas use them. The concurrency tests then
	// race one store per goroutine pair; otherwise they race goroutines on
	// one store.
	Replicas bool
}

// Run runs the whole suite, one subtest per behaviour.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(*testing.T, *env)
	}{
		{"HelloIsIdempotentPerIdentity", testHelloIsIdempotentPerIdentity},
		{"WorkersByLabel", testWorkersByLabel},
		{"CursorAckAndRedelivery", testCursorAckAndRedelivery},
		{"AckThroughAcknowledgesOnly", testAckThroughAcknowledgesOnly},
		{"EnqueueTellsOfItsWorker", testEnqueueTellsOfItsWorker},
		{"EnqueueDeliversToAWaitingPoll", testEnqueueDeliversToAWaitingPoll},
		{"LegacyDeliveryAndHibernateEndsBatch", testLegacyDeliveryAndHibernateEndsBatch},
		{"HibernationInForce", testHibernationInForce},
		{"WakeWithdrawsQueuedHibernates", testWakeWithdrawsQueuedHibernates},
		{"WakeOfAnUndeliveredHibernate", testWakeOfAnUndeliveredHibernate},
		{"SetupStateFollowsQueue", testSetupStateFollowsQueue},
		{"ExecOutputAndResult", testExecOutputAndResult},
		{"DurableAcrossReopen", testDurableAcrossReopen},
		{"CleanupAndTokens", testCleanupAndTokens},
		{"ReportsAreIdempotent", testReportsAreIdempotent},
		{"EventsLogAndOutcomes", testEventsLogAndOutcomes},
		{"InvocationClaimCancelFinishAndReopen", testInvocationClaimCancelFinishAndReopen},
		{"ClaimRespectsCapacityRunnersAndState", testClaimRespectsCapacityRunnersAndState},
		{"ReportRunningAndLost", testReportRunningAndLost},
		{"TouchWorkers", testTouchWorkers},
		{"RestartLosesReceivedJobs", testRestartLosesReceivedJobs},
		{"LostExecsStaleAndRemoved", testLostExecsStaleAndRemoved},
		{"EnrollTokenIsConsumedOnce", testEnrollTokenIsConsumedOnce},
		{"TokensListAndRevoke", testTokensListAndRevoke},
		{"NoncesAreUsedOnce", testNoncesAreUsedOnce},
		{"ConcurrentNonceBatches", testConcurrentNonceBatches},
		{"KeysLifecycle", testKeysLifecycle},
		{"RebindKeyToRecreatedWorker", testRebindKeyToRecreatedWorker},
		{"QueueEditsSurviveHelloAndReopen", testQueueEditsSurviveHelloAndReopen},
		{"ClaimFollowsMembership", testClaimFollowsMembership},
		{"SingleJobWorkerIsHandedOneJob", testSingleJobWorkerIsHandedOneJob},
		{"SingleJobNeverGetsASecondQueuedJob", testSingleJobNeverGetsASecondQueuedJob},
		{"SingleJobClaimsOneInvocation", testSingleJobClaimsOneInvocation},
		{"SingleJobHelloAfterItsJobEnded", testSingleJobHelloAfterItsJobEnded},
		{"SingleJobRunIsNotLostToSilence", testSingleJobRunIsNotLostToSilence},
		{"ConcurrentHelloCreatesOneWorker", testConcurrentHelloCreatesOneWorker},
		{"ConcurrentEnqueueNumbersConsecutively", testConcurrentEnqueueNumbersConsecutively},
		{"ConcurrentClaimsTakeEachInvocationOnce", testConcurrentClaimsTakeEachInvocationOnce},
		{"ConcurrentLegacyTakesDeliverOnce", testConcurrentLegacyTakesDeliverOnce},
		{"ConcurrentCursorAcks", testConcurrentCursorAcks},
		{"CancelRacingDelivery", testCancelRacingDelivery},
		{"ConcurrentRotationsFromOneKey", testConcurrentRotationsFromOneKey},
		{"ConcurrentJobsForASingleJobWorker", testConcurrentJobsForASingleJobWorker},
		{"ReadyWhileOpen", testReadyWhileOpen},
		{"TokenBindsToItsFirstWorker", testTokenBindsToItsFirstWorker},
		{"RefusedKeyHelloWritesNothing", testRefusedKeyHelloWritesNothing},
		{"ExecReportsOnlyWhileRunning", testExecReportsOnlyWhileRunning},
		{"ConcurrentHellosBindATokenOnce", testConcurrentHellosBindATokenOnce},
		{"ProvidersCRUD", testProvidersCRUD},
		{"LaunchedWorkerIsAdoptedByItsHello", testLaunchedWorkerIsAdoptedByItsHello},
		{"PayloadRetention", testPayloadRetention},
		{"SessionsExpireAndEnd", testSessionsExpireAndEnd},
		{"ListExecsNewestFirst", testListExecsNewestFirst},
		{"Counts", testCounts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			open := b.NewDatabase(t)
			tc.fn(t, &env{open: func(t *testing.T) store.Store {
				s := &closeOnce{Store: open(t)}
				t.Cleanup(func() { _ = s.Close() })
				return s
			}, replicas: b.Replicas})
		})
	}
}

// closeOnce lets the suite close a store early (a restart) and again at
// cleanup.
type closeOnce struct {
	store.Store
	once sync.Once
	err  error
}

func (c *closeOnce) Close() error {
	c.once.Do(func() { c.err = c.Store.Close() })
	return c.err
}

// env is one subtest's database.
type env struct {
	open     func(t *testing.T) store.Store
	replicas bool
	first    store.Store
}

// store is the subtest's main store, opened on first use.
func (e *env) store(t *testing.T) store.Store {
	if e.first == nil {
		e.first = e.open(t)
	}
	return e.first
}

// reopen closes the main store and opens the database again, as a restart
// does.
func (e *env) reopen(t *testing.T) store.Store {
	t.Helper()
	if e.first != nil {
		if err := e.first.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	e.first = e.open(t)
	return e.first
}

// racers returns n stores to race on: distinct replicas when the backend
// has them, else the main store n times.
func (e *env) racers(t *testing.T, n int) []store.Store {
	t.Helper()
	out := make([]store.Store, n)
	for i := range out {
		if e.replicas && i > 0 {
			out[i] = e.open(t)
		} else {
			out[i] = e.store(t)
		}
	}
	return out
}

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

var bg = context.Background()

func hello(t *testing.T, s store.Store, id, machine, label string) store.Worker {
	t.Helper()
	w, _, err := s.Hello(bg, store.Hello{
		NewID: id, Namespace: "default", MachineID: machine, Label: label,
		Tags: []string{"a=b"}, Capabilities: store.Capabilities{Runners: []string{"process"}},
		Versions: json.RawMessage(`{"daemon":"1.0","protocol":"1"}`), Now: t0,
	})
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	return w
}

func enqueue(t *testing.T, s store.Store, worker, id, kind string) store.Command {
	t.Helper()
	c, err := s.Enqueue(bg, store.NewCommand{ID: id, WorkerID: worker, Kind: kind, Body: []byte{0xc0}, Now: t0}, nil)
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return c
}

func newInvocation(t *testing.T, s store.Store, id, queue, runner string, at time.Time) {
	t.Helper()
	if _, err := s.CreateInvocation(bg, store.NewInvocation{
		ID: id, Namespace: "default", Queue: queue, Module: "m", Qualname: "f", Runner: runner,
		RunConfig: []byte(`{}`), Args: []byte{1}, ArgsSize: 1, RunBody: []byte("body-" + id), Now: at,
	}); err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
}

func ids(cs []store.Command) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.ID)
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func ptr[T any](v T) *T { return &v }
