package batch

import (
	"sync"
	"testing"
)

// What is added while a batch commits goes, in order, into the next
// batches, none larger than the bound; everything added is committed once.
func TestQueueBatchesWhatWaits(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{})
	var (
		mu      sync.Mutex
		batches [][]int
		wg      sync.WaitGroup
	)
	var q *Queue[int]
	q = New(4, func(b []int) {
		mu.Lock()
		first := len(batches) == 0
		batches = append(batches, b)
		mu.Unlock()
		if first {
			close(held)
			<-hold
		}
		for range b {
			wg.Done()
		}
	})
	wg.Add(11)
	q.Add(0)
	<-held
	for i := 1; i <= 10; i++ {
		q.Add(i)
	}
	if n := q.Len(); n != 10 {
		t.Fatalf("%d queued behind the first batch, want 10", n)
	}
	close(hold)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var all []int
	for i, b := range batches {
		if len(b) > 4 {
			t.Fatalf("batch %d holds %d, over the bound of 4", i, len(b))
		}
		all = append(all, b...)
	}
	if len(batches) != 4 { // [0] [1..4] [5..8] [9 10]
		t.Fatalf("batches %v, want 4", batches)
	}
	for i, x := range all {
		if x != i {
			t.Fatalf("committed %v, want 0..10 in order", all)
		}
	}
}

// Run commits a lone caller's batch before it returns (on the caller's
// goroutine); what others queue while it commits goes, in order, into
// batches that a goroutine of the queue's own commits.
func TestRunCommitsALoneCallerInPlace(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{})
	var (
		mu      sync.Mutex
		batches [][]int
		wg      sync.WaitGroup
	)
	q := New(4, func(b []int) {
		mu.Lock()
		batches = append(batches, b)
		n := len(batches)
		mu.Unlock()
		if n == 2 {
			close(held)
			<-hold
		}
		for range b {
			wg.Done()
		}
	})
	wg.Add(1)
	q.Run(0)
	mu.Lock()
	if len(batches) != 1 || len(batches[0]) != 1 || batches[0][0] != 0 {
		t.Fatalf("after a lone Run: %v, want [[0]] committed", batches)
	}
	mu.Unlock()

	wg.Add(7)
	go q.Run(1)
	<-held
	for i := 2; i <= 7; i++ {
		q.Run(i) // queued behind the batch being committed; returns at once
	}
	if n := q.Len(); n != 6 {
		t.Fatalf("%d queued behind the held batch, want 6", n)
	}
	close(hold)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	var all []int
	for _, b := range batches {
		all = append(all, b...)
	}
	if len(batches) != 4 { // [0] [1] [2..5] [6 7]
		t.Fatalf("batches %v, want 4", batches)
	}
	for i, x := range all {
		if x != i {
			t.Fatalf("committed %v, want 0..7 in order", all)
		}
	}
}
