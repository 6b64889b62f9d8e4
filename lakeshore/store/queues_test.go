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
