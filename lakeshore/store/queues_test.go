package store_test

import (
	"slices"
	"testing"

	"nymph/lakeshore/store"
)

func TestEffectiveQueues(t *testing.T) {
	added, removed := store.ApplyQueueEdit(nil, nil, store.QueueEdit{Add: []string{"a", "b"}, Remove: []string{"lane"}})
	if !slices.Equal(added, []string{"a", "b"}) || !slices.Equal(removed, []string{"lane"}) {
		t.Fatalf("edit 1: %v %v", added, removed)
	}
	added, removed = store.ApplyQueueEdit(added, removed, store.QueueEdit{Add: []string{"lane"}, Remove: []string{"a"}})
	if !slices.Equal(added, []string{"b", "lane"}) || !slices.Equal(removed, []string{"a"}) {
		t.Fatalf("edit 2: %v %v", added, removed)
	}
	if got := store.EffectiveQueues([]string{"lane", "x", "x"}, []string{"b", "lane"}, []string{"x"}); !slices.Equal(got, []string{"lane", "b"}) {
		t.Fatalf("effective: %v", got)
	}
}

// TestInQueue pins the routing rule both queue execs and invocation claims
// follow.
func TestInQueue(t *testing.T) {
	for _, c := range []struct {
		name  string
		w     store.Worker
		queue string
		want  bool
	}{
		{"no queues, no poll: default", store.Worker{}, "default", true},
		{"no queues, no poll: not another", store.Worker{}, "gpu", false},
		{"polls another: not default", store.Worker{PollQueue: "gpu"}, "default", false},
		{"poll queue", store.Worker{PollQueue: "gpu"}, "gpu", true},
		{"poll prefix", store.Worker{PollQueue: "gpu-*"}, "gpu-a100", true},
		{"request prefix reaches a member", store.Worker{Queues: []string{"gpu-h100"}, PollQueue: "x"}, "gpu-*", true},
		{"added while polling another", store.Worker{Queues: []string{"training"}, PollQueue: "gpu"}, "training", true},
		{"lane and the default poll", store.Worker{Queues: []string{"gpu"}}, "default", true},
		{"removed poll queue", store.Worker{PollQueue: "gpu", QueuesRemoved: []string{"gpu"}}, "gpu", false},
		{"removed default", store.Worker{QueuesRemoved: []string{"default"}}, "default", false},
	} {
		if got := c.w.InQueue(c.queue); got != c.want {
			t.Errorf("%s: InQueue(%q) = %v, want %v (routing queues %v)", c.name, c.queue, got, c.want, c.w.RoutingQueues())
		}
	}
}
