package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// TestTheFirstSignalCancelsAWatchedRun: once watched (twice is once), a
// SIGINT cancels the run's context instead of ending the process.
func TestTheFirstSignalCancelsAWatchedRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &signalWatch{cancel: cancel}
	w.start()
	w.start()
	// A witness of its own keeps this test process alive once the watch
	// has given SIGINT its default back.
	witness := make(chan os.Signal, 1)
	signal.Notify(witness, os.Interrupt)
	defer signal.Stop(witness)
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a SIGINT did not cancel the watched run")
	}
	<-witness
}
