package backoff_test

import (
	"context"
	"testing"
	"time"

	"nymph/backoff"
)

func TestSpecFormula(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		b := backoff.Backoff{Min: time.Second, Max: 60 * time.Second, Rand: func() float64 { return r }}
		cur := time.Second
		for i := 0; i < 10; i++ {
			if got := b.Current(); got != cur {
				t.Fatalf("r=%v step %d: Current %v, want %v", r, i, got, cur)
			}
			want := cur + time.Duration(r*float64(min(cur, 5*time.Second)))
			if got := b.Next(); got != want {
				t.Fatalf("r=%v step %d: Next %v, want %v", r, i, got, want)
			}
			cur = min(2*cur, 60*time.Second)
		}
		b.Reset()
		if b.Current() != time.Second {
			t.Fatalf("Reset left %v", b.Current())
		}
	}
}

func TestDefaultRandStaysInBounds(t *testing.T) {
	b := backoff.New(100*time.Millisecond, time.Second)
	for i := 0; i < 100; i++ {
		cur := b.Current()
		d := b.Next()
		if d < cur || d >= cur+min(cur, backoff.JitterCap) {
			t.Fatalf("delay %v outside [%v, %v)", d, cur, 2*cur)
		}
	}
	if b.Current() != time.Second {
		t.Fatalf("backoff did not cap at Max: %v", b.Current())
	}
}

func TestSleepEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if backoff.Sleep(ctx, time.Hour) {
		t.Fatal("Sleep reported the whole delay on a cancelled context")
	}
	if !backoff.Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep of 1 ms did not complete")
	}
}
