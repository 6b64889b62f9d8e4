package gopool

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"nymph/test/wait"
)

// started is how many goroutines p ever started.
func (p *Pool) startedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

func TestGoReusesAnIdleGoroutine(t *testing.T) {
	p := New(4)
	defer p.Close()
	for i := 0; i < 100; i++ {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		// The goroutine is idle once it has put itself back.
		wait.For(t, 10*time.Second, "the goroutine to be idle again", func() bool { return p.Idle() == 1 })
	}
	if n := p.startedCount(); n != 1 {
		t.Fatalf("100 functions one after another started %d goroutines, want 1", n)
	}
}

func TestGoNeverWaitsForABusyGoroutine(t *testing.T) {
	p := New(2)
	defer p.Close()
	release := make(chan struct{})
	var wg sync.WaitGroup
	const n = 10
	wg.Add(n)
	for i := 0; i < n; i++ {
		// Each blocks until all are running: Go must start a goroutine for
		// each rather than queue behind a busy one.
		p.Go(func() { wg.Done(); <-release })
	}
	wg.Wait()
	close(release)
	if got := p.startedCount(); got != n {
		t.Fatalf("started %d goroutines for %d blocked functions", got, n)
	}
	// Only maxIdle stay; the others end.
	wait.For(t, 10*time.Second, "two idle goroutines", func() bool { return p.Idle() == 2 })
}

func TestCloseEndsIdleGoroutinesAndGoStillRuns(t *testing.T) {
	before := runtime.NumGoroutine()
	p := New(8)
	var wg sync.WaitGroup
	wg.Add(5)
	for i := 0; i < 5; i++ {
		p.Go(wg.Done)
	}
	wg.Wait()
	p.Close()
	p.Wait()
	if p.Idle() != 0 {
		t.Fatalf("%d goroutines idle after Close", p.Idle())
	}
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	<-ran
	wait.For(t, 10*time.Second, "no goroutine left over", func() bool { return runtime.NumGoroutine() <= before })
}

func TestBusyGoroutineEndsAfterClose(t *testing.T) {
	p := New(8)
	release, running := make(chan struct{}), make(chan struct{})
	p.Go(func() { close(running); <-release })
	<-running
	p.Close()
	close(release)
	p.Wait() // returns only once the busy goroutine has ended instead of idling
	if p.Idle() != 0 {
		t.Fatal("a goroutine went idle in a closed pool")
	}
}

func BenchmarkGo(b *testing.B) {
	deep := func(n int) int {
		var f func(int) int
		f = func(n int) int {
			var pad [256]byte
			if n == 0 {
				return int(pad[0])
			}
			return f(n-1) + int(pad[n%256])
		}
		return f(n)
	}
	run := func(b *testing.B, spawn func(func())) {
		done := make(chan struct{})
		for i := 0; i < b.N; i++ {
			spawn(func() { deep(64); done <- struct{}{} })
			<-done
		}
	}
	b.Run("go", func(b *testing.B) { run(b, func(fn func()) { go fn() }) })
	b.Run("pool", func(b *testing.B) {
		p := New(4)
		defer p.Close()
		run(b, p.Go)
	})
}

// A nil Pool, what a caller given none holds, runs fn on a goroutine of
// its own.
func TestNilPoolRunsOnAGoroutineOfItsOwn(t *testing.T) {
	var p *Pool
	done := make(chan struct{})
	p.Go(func() { close(done) })
	<-done
}
