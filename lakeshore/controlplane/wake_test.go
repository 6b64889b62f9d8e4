package controlplane

import "testing"

// An exec's news wakes the waits for any change of it too; a change that
// is not news (its delivery) wakes only those.
func TestExecNewsWakesStateWaitsButNotTheOtherWayRound(t *testing.T) {
	h := newHub()
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	news, relNews := h.subscribe(execKey("a"))
	defer relNews()
	state, relState := h.subscribe(execStateKey("a"))
	defer relState()
	other, relOther := h.subscribe(execStateKey("b"))
	defer relOther()

	h.deliver(execStateKey("a"))
	if !closed(state) || closed(news) {
		t.Fatalf("a delivery: state wait woken %v, news wait woken %v; want true, false", closed(state), closed(news))
	}
	state, relState2 := h.subscribe(execStateKey("a"))
	defer relState2()
	h.deliver(execKey("a"))
	if !closed(news) || !closed(state) || closed(other) {
		t.Fatalf("news: news wait woken %v, state wait %v, another exec's %v; want true, true, false", closed(news), closed(state), closed(other))
	}
}
