package runnertest

import (
	"context"
	"testing"
	"time"

	"nymph/runners"
	"nymph/runners/procgroup"
)

// Outcome runs spec on r and fails t if Run returns an error.
func Outcome(t testing.TB, r runners.Runner, spec runners.Spec) runners.Outcome {
	t.Helper()
	out, err := r.Run(context.Background(), spec)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return out
}

// Background is a run in its own goroutine, for a test that acts on it
// from outside (cancels it, kills its CLI, reaps its container) while it
// runs.
type Background struct {
	done chan struct{}
	out  runners.Outcome
	err  error
}

// Start runs spec on r in the background.
func Start(ctx context.Context, r runners.Runner, spec runners.Spec) *Background {
	b := &Background{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		b.out, b.err = r.Run(ctx, spec)
	}()
	return b
}

// Done is closed once Run has returned.
func (b *Background) Done() <-chan struct{} { return b.done }

// Result is what Run returned; only once Done is closed.
func (b *Background) Result() (runners.Outcome, error) { return b.out, b.err }

// Wait waits up to limit for Run to return, failing t with what it waited
// for when it does not, and returns what Run returned.
func (b *Background) Wait(t testing.TB, limit time.Duration, what string) (runners.Outcome, error) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(limit):
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
	return b.out, b.err
}

// Reaper is a runner that removes what the runs of a killed daemon left
// behind.
type Reaper interface {
	runners.Runner
	ReapLeftovers(ctx context.Context, marker string) (int, error)
}

// StartOwned starts spec on r in the background, as a run of the daemon
// marked marker would be. At the end of the test it reaps what marker
// left and waits for Run to return, so that a test failing early leaves
// nothing running.
func StartOwned(t testing.TB, r Reaper, marker string, spec runners.Spec) *Background {
	b := Start(context.Background(), r, spec)
	t.Cleanup(func() {
		_, _ = r.ReapLeftovers(context.Background(), marker)
		<-b.done
	})
	return b
}

// NoneNaming fails t if a live process names marker on its command line.
func NoneNaming(t testing.TB, marker, what string) {
	t.Helper()
	if live, err := procgroup.WithCmdline(marker); err != nil || len(live) != 0 {
		t.Fatalf("%s: processes naming %s still alive: %v (%v)", what, marker, live, err)
	}
}
