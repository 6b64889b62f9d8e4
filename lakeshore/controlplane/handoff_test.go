package controlplane

import (
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// An exec queued for a daemon whose poll is parked here is delivered by
// its enqueue and handed to that poll: the poll answers with it without a
// Take, the exec reads running, the memo knows it was delivered (the
// acknowledging poll writes the acknowledgement alone, the next one
// nothing), and a daemon that lost the answer gets the exec again by
// polling with its old cursor.
func TestAnExecGoesStraightToTheParkedPoll(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	id, cur := e.hello("m", "straight")
	e.poll(id, &cur, 0, "") // the first poll records the worker

	handed := func(cursor string) messages.PollResponse {
		t.Helper()
		// The polls that answered at once parked for an instant too.
		for len(e.parked) > 0 {
			<-e.parked
		}
		polled := make(chan messages.PollResponse, 1)
		go func() { polled <- e.poll(id, &cursor, 15, "") }()
		e.waitParked(workerKey(id))
		cs.take()
		acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
		p := recv(t, polled, "the parked poll's answer")
		if len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec {
			t.Fatalf("the parked poll answered %v", commandsOf(p))
		}
		if x, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Exec); !ok || x.ExecID != acc.ExecID {
			t.Fatalf("the parked poll was handed %+v, want exec %s", p.Commands[0], acc.ExecID)
		}
		if calls := cs.take(); strings.Contains(calls, "Take") {
			t.Fatalf("handing the exec over called %q: want no Take", calls)
		}
		if x := e.getExec(acc.ExecID, ""); x.State != operatorapi.ExecRunning {
			t.Fatalf("the handed exec reads %s", x.State)
		}
		if n := e.srv.handoffs.size(); n != 0 {
			t.Fatalf("%d offers left after the answer", n)
		}
		cs.take()
		return p
	}

	p := handed(cur)
	next := *p.Cursor
	e.poll(id, &next, 0, "")
	if calls := cs.take(); calls != "AckThrough×I" {
		t.Fatalf("the poll acknowledging the handed exec called %q: want its AckThrough alone", calls)
	}
	e.poll(id, &next, 0, "")
	if calls := cs.take(); calls != "" {
		t.Fatalf("an empty poll after the acknowledgement called %q", calls)
	}

	// The answer lost on the way: the daemon polls again from where it was.
	lost := handed(next)
	again := e.poll(id, &next, 0, "")
	if len(again.Commands) != 1 || again.Commands[0].ID != lost.Commands[0].ID {
		t.Fatalf("a poll from before the lost answer got %v, want %s again", commandsOf(again), lost.Commands[0].ID)
	}
}

// A legacy daemon's poll (no cursor) acknowledges by receipt: it is never
// handed a command by an enqueue, and takes it as ever.
func TestALegacyPollIsNotHandedCommands(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	id, _ := e.hello("m", "legacy")
	polled := make(chan messages.PollResponse, 1)
	go func() { polled <- e.poll(id, nil, 15, "") }()
	e.waitParked(workerKey(id))
	if n := e.srv.handoffs.size(); n != 0 {
		t.Fatalf("a legacy poll offered itself (%d offers)", n)
	}
	cs.take()
	e.exec(id, operatorapi.ExecRequest{Command: "true"})
	if p := recv(t, polled, "the legacy poll's answer"); len(p.Commands) != 1 {
		t.Fatalf("the legacy poll answered %v", commandsOf(p))
	}
	if calls := cs.take(); !strings.Contains(calls, "Take") {
		t.Fatalf("the legacy poll's delivery called %q: want a Take", calls)
	}
}

// A claimed offer is filled once: what the enqueue handed over stands
// against the empty fill a claimer defers (for an enqueue that panics),
// and a withdrawn offer says it was claimed, so its poll waits for it.
func TestAClaimedOfferIsFilledOnce(t *testing.T) {
	h := newHandoffs()
	o := h.offer("w1", 3)
	if got := h.claim("w1"); got != o {
		t.Fatalf("claim found %p, want the offer %p", got, o)
	}
	if h.claim("w1") != nil || h.size() != 0 {
		t.Fatal("an offer was claimed twice")
	}
	o.fill([]store.Command{{ID: "c4", Seq: 4}}, 7, time.Unix(1, 0))
	o.fill(nil, 0, time.Time{})
	if !h.withdraw("w1", o) {
		t.Fatal("a claimed offer withdrew as unclaimed")
	}
	<-o.done
	if len(o.cmds) != 1 || o.cmds[0].ID != "c4" || o.gen != 7 {
		t.Fatalf("the offer holds %+v at gen %d after a second fill", o.cmds, o.gen)
	}
	quiet := h.offer("w1", 4)
	if h.withdraw("w1", quiet) || h.size() != 0 {
		t.Fatal("an unclaimed offer withdrew as claimed, or stayed")
	}
}
