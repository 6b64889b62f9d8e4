package storetest

import (
	"context"
	"testing"
)

// A store is ready once open (its migrations applied), on every replica,
// and stops being ready once closed.
func testReadyWhileOpen(t *testing.T, e *env) {
	ctx := context.Background()
	s := e.store(t)
	if err := s.Ready(ctx); err != nil {
		t.Fatalf("a freshly opened store: %v", err)
	}
	for i, r := range e.racers(t, 2) {
		if err := r.Ready(ctx); err != nil {
			t.Fatalf("store %d on the same database: %v", i, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := s.Ready(ctx); err == nil {
		t.Fatal("a closed store says it is ready")
	}
}
