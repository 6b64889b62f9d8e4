package actors_test

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"nymph/actors"
	"nymph/backoff"
	"nymph/daemon/orphans"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

func TestHelloAndFirstPollWire(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	hello := h.cp.Hellos()[0]
	if hello.MachineID != "m1" || hello.Label != "test box" || !reflect.DeepEqual(hello.Lanes, []string{"q1"}) ||
		hello.Versions.Protocol == nil || *hello.Versions.Protocol != "1" || !reflect.DeepEqual(hello.Capabilities.Runners, []string{"process", "echo"}) {
		t.Fatalf("hello = %+v", hello)
	}
	p := h.cp.Polls()[0]
	if p.WorkerID != "w-fake" || p.Queue != "q1" || p.TimeoutS != 2.0 || p.Cursor == nil || *p.Cursor != "0" ||
		p.Invocations == nil || len(p.Invocations) != 0 || p.UpdatedCapabilities != nil {
		t.Fatalf("first poll = %+v", p)
	}
	for _, r := range h.cp.Requests() {
		if r.Header.Get("Content-Type") != messages.ContentType || r.Header.Get("Accept") != messages.ContentType {
			t.Fatalf("%s: headers %v", r.Route, r.Header)
		}
	}
}

func TestProvisionalWorkerIDWhenHelloGivesNone(t *testing.T) {
	h := newHarness(t, setup{cpOpts: []fakecp.Option{fakecp.WithWorkerID(nil)}})
	h.waitPolls(1)
	if got := h.cp.Polls()[0].WorkerID; got != "m1-01PROVISIONAL" {
		t.Fatalf("worker_id = %q", got)
	}
}

func TestHelloRejectAbortsStartup(t *testing.T) {
	h := newHarness(t, setup{cpOpts: []fakecp.Option{fakecp.WithHello(func(*messages.HelloRequest) messages.HelloResponse {
		return messages.HelloResponse{Reject: &messages.Reject{Code: messages.RejectProtocolMismatch, Message: "speak v2"}}
	})}})
	err := h.wait(10 * time.Second)
	var rej *actors.RejectError
	if !errors.As(err, &rej) || rej.Code != "protocol_mismatch" || rej.Message != "speak v2" {
		t.Fatalf("err = %v", err)
	}
	if n := len(h.cp.Polls()); n != 0 {
		t.Fatalf("%d polls after a reject", n)
	}
}

func TestHelloRetriedOnErrors(t *testing.T) {
	h := newHarness(t, setup{cpOpts: []fakecp.Option{}, noStart: true})
	h.cp.Fail(fakecp.RouteHello, 2, 502)
	h.cp.Malform(fakecp.RouteHello, 1)
	if err := h.d.Start(); err != nil {
		t.Fatal(err)
	}
	h.waitPolls(1)
	if n := h.cp.Count(fakecp.RouteHello); n != 4 {
		t.Fatalf("hellos = %d", n)
	}
}

// Back-to-back execs flow at completion speed, far below one wait_max_s,
// through the poll the daemon holds: the control plane answers it as soon
// as the next exec is queued, so an exec's end does not abandon it. Each
// exec costs exactly one poll (the one that carried it is answered, and one
// new poll goes out after the batch); abandoning the held poll at every
// end, as a run's end does, would double that.
func TestBackToBackExecsKeepTheHeldPoll(t *testing.T) {
	h := newHarness(t, setup{
		cpOpts:   []fakecp.Option{fakecp.WithMaxHold(60 * time.Second)},
		settings: func(s *actors.Settings) { s.Poll.WaitMax = 20 * time.Second; s.Poll.RequestTimeout = 60 * time.Second },
	})
	h.waitPolls(1)
	n := len(h.cp.Polls())
	const execs = 5
	for i := range execs {
		id := "chain-" + string(rune('a'+i))
		h.exec(id, "echo "+id)
		r := h.cp.WaitResult(id, 10*time.Second)
		if r.ExitCode != 0 || r.Stdout != id+"\n" {
			t.Fatalf("%s: %+v", id, r)
		}
		// The poll after the batch and the exec's result go out
		// concurrently: wait for the poll, then there must be no other.
		want := n + i + 1
		h.waitPolls(want)
		if got := len(h.cp.Polls()); got != want {
			t.Fatalf("after %s: %d polls, want %d (one per exec)", id, got, want)
		}
	}
}

// With no free permit there is no poll in flight; an exec's end then
// polls at once.
func TestExecEndPollsWhenNoPollIsInFlight(t *testing.T) {
	h := newHarness(t, setup{
		cpOpts: []fakecp.Option{fakecp.WithMaxHold(60 * time.Second)},
		settings: func(s *actors.Settings) {
			s.Poll.MaxInvocations = 1
			s.Poll.WaitMax = 20 * time.Second
			s.Poll.RequestTimeout = 60 * time.Second
		},
	})
	h.waitPolls(1)
	h.exec("only", "true")
	h.cp.WaitResult("only", 10*time.Second)
	// Nothing else sends a poll within the 60 s the fake would hold one:
	// the permit was held, so none was in flight, and the exec's end
	// must start the next.
	h.waitPolls(2)
	h.exec("next", "true")
	h.cp.WaitResult("next", 10*time.Second)
	h.waitPolls(3)
}

// The poll after a batch with an exec goes out once the exec's process
// exists (AckHold, which bounds that wait, never ends it here), not ahead
// of its spawn.
func TestThePollAfterAnExecWaitsForItsProcess(t *testing.T) {
	var mu sync.Mutex
	var kids [][]int // per poll: the children of this process when it came
	h := newHarness(t, setup{
		cpOpts: []fakecp.Option{fakecp.WithMaxHold(60 * time.Second), fakecp.WithPollHook(func(messages.PollRequest) {
			// The pid, not the command line: that of a process in the
			// middle of its execve reads empty for a moment.
			there := children()
			mu.Lock()
			defer mu.Unlock()
			kids = append(kids, there)
		})},
		settings: func(s *actors.Settings) {
			s.Poll.WaitMax, s.Poll.RequestTimeout, s.Poll.AckHold = 20*time.Second, 60*time.Second, time.Hour
		},
	})
	h.waitPolls(1)
	id := h.exec("slow", "sleep 61")
	h.cp.Wait(10*time.Second, "the exec delivered", func() bool { _, ok := h.cp.DeliveredBy(id); return ok })
	by, _ := h.cp.DeliveredBy(id)
	h.waitPolls(by + 2)
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(kids[by+1], func(pid int) bool { return !slices.Contains(kids[by], pid) }) {
		t.Fatalf("the poll after the exec's batch came before the exec's process (children %v, before the batch %v)", kids[by+1], kids[by])
	}
}

// An exec that does not start soon (its payload's presign hangs) holds
// the next poll for AckHold only.
func TestThePollAfterAnExecThatWaitsGoesAfterTheHold(t *testing.T) {
	h := newHarness(t, setup{
		cpOpts: []fakecp.Option{fakecp.WithMaxHold(60 * time.Second)},
		settings: func(s *actors.Settings) {
			s.Poll.WaitMax, s.Poll.RequestTimeout, s.Poll.AckHold = 20*time.Second, 60*time.Second, 50*time.Millisecond
		},
	})
	h.waitPolls(1)
	h.cp.Hang(fakecp.RoutePresign, 1)
	id := h.exec("stuck", "true", func(e *messages.Exec) {
		e.PayloadRef = &messages.PayloadRef{Bucket: "b", Key: "k", Size: 1}
	})
	h.cp.Wait(10*time.Second, "the exec delivered", func() bool { _, ok := h.cp.DeliveredBy(id); return ok })
	by, _ := h.cp.DeliveredBy(id)
	h.waitPolls(by + 2)
	if _, done := h.cp.Result("stuck"); done {
		t.Fatal("the exec finished; its presign was to hang")
	}
}

func TestExecSentinelsThroughTheDaemon(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.exec("ok", "echo out; echo err >&2; exit 7")
	h.exec("timeout", "sleep 30", withTimeout(0.2))
	wd := "/nonexistent"
	h.exec("spawn", "true", func(e *messages.Exec) { e.Workdir = &wd })
	h.exec("trunc", "head -c 1100000 /dev/zero | tr '\\0' x")
	r := h.cp.WaitResult("ok", 10*time.Second)
	if r.ExitCode != 7 || r.Stdout != "out\n" || r.Stderr != "err\n" || r.Error != nil {
		t.Fatalf("ok: %+v", r)
	}
	r = h.cp.WaitResult("timeout", 10*time.Second)
	if r.ExitCode != messages.ExitTimeout {
		t.Fatalf("timeout: %+v %s", r, errOf(r))
	}
	r = h.cp.WaitResult("spawn", 10*time.Second)
	if r.ExitCode != messages.ExitFailed || !strings.HasPrefix(errOf(r), "spawn failed") {
		t.Fatalf("spawn: %+v %s", r, errOf(r))
	}
	r = h.cp.WaitResult("trunc", 10*time.Second)
	if r.ExitCode != 0 || errOf(r) != messages.ErrStdoutTruncated || len(r.Stdout) != messages.OutputCap {
		t.Fatalf("trunc: %d %s", r.ExitCode, errOf(r))
	}
}

func TestStreamingExecWithFailingChunks(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.cp.Fail(fakecp.RouteChunk, 1, 500)
	h.exec("s1", "for i in 1 2 3 4 5; do echo l$i; sleep 0.02; done", func(e *messages.Exec) {
		e.Log = &messages.LogSink{StdoutURL: "/v1/daemon/exec/s1/chunk", FlushMs: 15, FlushBytes: 4}
	})
	r := h.cp.WaitResult("s1", 10*time.Second)
	if r.ExitCode != 0 || r.Stdout != "" || r.Stderr != "" {
		t.Fatalf("%+v", r)
	}
	if got := string(h.cp.Chunks("s1")); got != "l1\nl2\nl3\nl4\nl5\n" {
		t.Fatalf("chunks %q", got)
	}
}

func TestUnknownAndMalformedCommandsSkipped(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.cp.QueueRaw("u1", "teleport", []byte{0x80})
	h.cp.QueueRaw("u2", messages.KindExec, []byte{0xa3, 'x', 'y', 'z'})                                 // a string, not a map
	h.cp.QueueRaw("u3", messages.KindExec, []byte{0x81, 0xa7, 'e', 'x', 'e', 'c', '_', 'i', 'd', 0x05}) // exec_id an int
	h.cp.QueueRaw("u4", messages.KindHibernate, []byte{0xc0})
	h.cp.QueueRaw("u5", messages.KindSetup, []byte{0x81, 0xa6, 's', 'c', 'r', 'i', 'p', 't', 0xa0})
	h.exec("after", "echo alive")
	r := h.cp.WaitResult("after", 10*time.Second)
	if r.Stdout != "alive\n" {
		t.Fatalf("%+v", r)
	}
	if n := len(h.cp.Results()); n != 1 {
		t.Fatalf("results = %d", n)
	}
	// a malformed poll response is backed off, not fatal
	h.cp.Malform(fakecp.RoutePoll, 1)
	h.exec("after2", "echo still")
	h.cp.WaitResult("after2", 10*time.Second)
}

func TestOtaAndRotateKeyAreRoutedOrLogged(t *testing.T) {
	got := make(chan *messages.Dispatch, 4)
	probe := propsRecording(got)
	h := newHarness(t, setup{opts: []actors.Option{actors.WithChild("keys", probe, messages.KindRotateKey)}})
	h.waitPolls(1)
	h.cp.QueueKind(messages.KindRotateKey, nil)
	h.cp.QueueKind(messages.KindOtaUpdate, &messages.OtaUpdate{Version: "2", URL: "http://x/n", SHA256: strings.Repeat("a", 64)})
	h.exec("e", "true")
	h.cp.WaitResult("e", 10*time.Second)
	select {
	case d := <-got:
		if d.Kind != messages.KindRotateKey {
			t.Fatalf("routed %s", d.Kind)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("rotate_key not routed to the keys child")
	}
	select {
	case d := <-got:
		t.Fatalf("ota_update routed to keys: %+v", d)
	default:
	}
}

func TestCancelExecAndRun(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.exec("long", "echo started; sleep 30")
	h.cp.QueueRun(messages.Run{InvocationID: "inv-long", Function: messages.FunctionRef{Module: "m", Qualname: "f"},
		Script: ptr("sleep 30")})
	wait.For(t, 10*time.Second, "both running", func() bool {
		return h.d.Ledger().Active() == 2 && len(h.d.Ledger().Running()) == 1
	})
	h.cp.QueueKind(messages.KindCancel, &messages.Cancel{ExecID: ptr("long")})
	h.cp.QueueKind(messages.KindCancel, &messages.Cancel{InvocationID: ptr("inv-long")})
	r := h.cp.WaitResult("long", 10*time.Second)
	if r.ExitCode != messages.ExitFailed || errOf(r) != "cancelled" {
		t.Fatalf("exec: %+v %s", r, errOf(r))
	}
	h.cp.Wait(10*time.Second, "ack", func() bool { return len(h.cp.Acks()) == 1 })
	a := h.cp.Acks()[0]
	if a.State != messages.StateKilled || a.Error == nil || a.Error.Type != "Cancelled" || a.Error.Message != "cancelled" || len(a.ResultBlob) != 0 {
		t.Fatalf("ack %+v %+v", a, a.Error)
	}
}

func TestRunAcks(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.cp.QueueRun(messages.Run{InvocationID: "echo-1", RunConfig: messages.RunConfig{Runner: ptr("echo")}, ArgsBlob: messages.Bytes("args!")})
	h.cp.QueueRun(messages.Run{InvocationID: "bad-kind", RunConfig: messages.RunConfig{Runner: ptr("teleport")}})
	h.cp.QueueRun(messages.Run{InvocationID: "default", Script: ptr(`printf done > "$NYMPH_RESULT_PATH"`)})
	h.cp.QueueRun(messages.Run{InvocationID: "fails", Script: ptr("exit 3")})
	// tail runs until the test has seen a poll list it with its stdout
	// tail: a fixed sleep could end before any poll went out (the wake
	// polls after the other four can precede its echo, the next is held
	// for wait_max_s).
	gate := filepath.Join(h.workdir, "tail-gate")
	h.cp.QueueRun(messages.Run{InvocationID: "tail", Script: ptr("echo tail-line; while [ ! -e " + gate + " ]; do sleep 0.02; done")})
	listed := h.cp.WaitUntil(15*time.Second, func() bool {
		for _, p := range h.cp.Polls() {
			for _, inv := range p.Invocations {
				if inv.InvocationID == "tail" && inv.State == "running" && strings.Contains(inv.StdoutTail, "tail-line") && inv.StartedAt > 0 {
					return true
				}
			}
		}
		return false
	})
	if !listed {
		t.Error("no poll listed the running invocation with its stdout tail")
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.cp.Wait(15*time.Second, "5 acks", func() bool { return len(h.cp.Acks()) == 5 })
	acks := map[string]messages.Ack{}
	for _, a := range h.cp.Acks() {
		acks[a.InvocationID] = a
		if a.WorkerID != "w-fake" {
			t.Errorf("%s: worker_id %q", a.InvocationID, a.WorkerID)
		}
	}
	if a := acks["echo-1"]; a.State != "succeeded" || string(a.ResultBlob) != "args!" || a.Error != nil {
		t.Errorf("echo: %+v", a)
	}
	if a := acks["bad-kind"]; a.State != "failed" || a.Error == nil || a.Error.Type != "DaemonError" || a.Error.Message != "unknown runner kind: teleport" {
		t.Errorf("bad kind: %+v %+v", a, a.Error)
	}
	if a := acks["default"]; a.State != "succeeded" || string(a.ResultBlob) != "done" {
		t.Errorf("default runner: %+v %+v", a, a.Error)
	}
	if a := acks["fails"]; a.State != "failed" || a.Error == nil || len(a.ResultBlob) != 0 {
		t.Errorf("fails: %+v", a)
	}
}

func TestHibernateDiscardsRestOfBatch(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	until := time.Now().Add(1500 * time.Millisecond)
	e1, _ := messages.EncodeCommand("c1", messages.KindExec, &messages.Exec{ExecID: "before", Command: "true"})
	hib, _ := messages.EncodeCommand("c2", messages.KindHibernate, &messages.Hibernate{UntilEpochS: messages.Epoch(until.Unix() + 1)})
	e2, _ := messages.EncodeCommand("c3", messages.KindExec, &messages.Exec{ExecID: "discarded", Command: "true"})
	h.cp.Queue(e1, hib, e2)
	h.cp.WaitResult("before", 10*time.Second)
	hibernatedAt := time.Now()
	polls := len(h.cp.Polls())
	h.cp.Wait(10*time.Second, "a poll after hibernation", func() bool { return len(h.cp.Polls()) > polls })
	if woke := time.Now(); woke.Before(until) {
		t.Fatalf("polled at %v, before the hibernate deadline %v (hibernated at %v)", woke, until, hibernatedAt)
	}
	h.exec("after", "true")
	h.cp.WaitResult("after", 10*time.Second)
	if _, ok := h.cp.Result("discarded"); ok {
		t.Fatal("a command after hibernate in the same batch ran")
	}
}

func TestPollErrorsBackOffWithJitter(t *testing.T) {
	h := newHarness(t, setup{
		noStart: true,
		settings: func(s *actors.Settings) {
			s.Poll.RequestTimeout = 300 * time.Millisecond
			s.Poll.WaitMax = 100 * time.Millisecond
		},
		deps: func(d *actors.Deps) {
			d.Rand = func() float64 { return 0.5 }
		},
	})
	h.cp.Fail(fakecp.RoutePoll, 4, 503)
	if err := h.d.Start(); err != nil {
		t.Fatal(err)
	}
	h.waitPollAnswered(200)
	ms := time.Millisecond
	// backoff 10, 20, 40, 40 ms (max 40) plus 0.5·min(backoff, 5 s)
	want := []time.Duration{15 * ms, 30 * ms, 60 * ms, 60 * ms}
	if got := h.d.PollerState().Delays(); !reflect.DeepEqual(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
	// success reset the backoff: a timeout starts again from retry_min
	h.cp.Hang(fakecp.RoutePoll, 1)
	h.cp.Wait(10*time.Second, "a delay after the timeout", func() bool { return len(h.d.PollerState().Delays()) == 5 })
	if got := h.d.PollerState().Delays()[4]; got != 15*ms {
		t.Fatalf("delay after reset = %v", got)
	}
}

func TestBackoffFormulaBounds(t *testing.T) {
	for _, r := range []float64{0, 0.25, 0.999999} {
		b := backoff.Backoff{Min: time.Second, Max: 60 * time.Second, Rand: func() float64 { return r }}
		base := time.Second
		for range 10 {
			d := b.Next()
			lo, hi := base, base+min(base, 5*time.Second)
			if d < lo || d > hi {
				t.Fatalf("rand %v: delay %v outside [%v, %v]", r, d, lo, hi)
			}
			base = min(base*2, 60*time.Second)
		}
		b.Reset()
		if b.Current() != time.Second {
			t.Fatal("reset")
		}
	}
}

func TestResetBackoffCommand(t *testing.T) {
	h := newHarness(t, setup{deps: func(d *actors.Deps) { d.Rand = func() float64 { return 0 } }})
	h.waitPolls(1)
	h.cp.QueueKind(messages.KindResetBackoff, nil)
	h.exec("e", "true")
	h.cp.WaitResult("e", 10*time.Second)
	// A poll already held by the fake has taken its fault check; queueing
	// e2 now would let that poll deliver it before the fault is ever hit.
	h.cp.Fail(fakecp.RoutePoll, 1, 500)
	h.waitPollAnswered(500)
	h.exec("e2", "true")
	h.cp.WaitResult("e2", 10*time.Second)
	if d := h.d.PollerState().Delays(); len(d) != 1 || d[0] != 10*time.Millisecond {
		t.Fatalf("delays %v", d)
	}
}

func TestCursorAbandonedPollLosesNothing(t *testing.T) {
	h := newHarness(t, setup{settings: func(s *actors.Settings) {
		s.Poll.RequestTimeout = 400 * time.Millisecond
		s.Poll.WaitMax = 200 * time.Millisecond
	}})
	h.waitPolls(1)
	h.cp.DropPollResponses(1)
	h.exec("x1", "echo once >> "+filepath.Join(h.workdir, "x1"))
	h.exec("x2", "true")
	h.cp.WaitResult("x1", 10*time.Second)
	h.cp.WaitResult("x2", 10*time.Second)
	// redelivered batches never run a command twice
	h.exec("x3", "true")
	h.cp.WaitResult("x3", 10*time.Second)
	b, _ := os.ReadFile(filepath.Join(h.workdir, "x1"))
	if string(b) != "once\n" {
		t.Fatalf("x1 ran %q", b)
	}
	for id, rs := range h.cp.Results() {
		if len(rs) != 1 {
			t.Fatalf("%s reported %d times", id, len(rs))
		}
	}
	// every poll echoed a cursor the server had sent (the hello's first)
	for _, p := range h.cp.Polls() {
		if p.Cursor == nil {
			t.Fatal("a poll without the cursor")
		}
	}
}

func TestDuplicateCommandIDNotRerun(t *testing.T) {
	h := newHarness(t, setup{cpOpts: []fakecp.Option{fakecp.WithLegacyCursor()}})
	h.waitPolls(1)
	f := filepath.Join(h.workdir, "dup")
	cmd, _ := messages.EncodeCommand("same-id", messages.KindExec, &messages.Exec{ExecID: "d1", Command: "echo run >> " + f})
	h.cp.Queue(cmd)
	h.cp.WaitResult("d1", 10*time.Second)
	h.cp.Queue(cmd)
	other, _ := messages.EncodeCommand("other-id", messages.KindExec, &messages.Exec{ExecID: "d1", Command: "echo run >> " + f})
	h.cp.Queue(other)
	h.exec("d2", "true")
	h.cp.WaitResult("d2", 10*time.Second)
	if b, _ := os.ReadFile(f); string(b) != "run\n" {
		t.Fatalf("ran %q", b)
	}
	if p := h.cp.Polls(); p[len(p)-1].Cursor != nil {
		t.Fatal("a legacy server's null cursor must stay null")
	}
}

func TestMaxInvocationsNoFreePermitNoPoll(t *testing.T) {
	h := newHarness(t, setup{
		cpOpts:   []fakecp.Option{fakecp.WithMaxBatch(1)},
		settings: func(s *actors.Settings) { s.Poll.MaxInvocations = 1 },
	})
	h.waitPolls(1)
	h.exec("p1", "sleep 0.5")
	h.exec("p2", "true")
	// The fake re-checks every 50 ms: busyFrom stays close to p1's start.
	h.cp.Wait(10*time.Second, "p1 running", func() bool { return h.d.Ledger().Active() == 1 })
	busyFrom := time.Now()
	h.cp.WaitResult("p1", 10*time.Second)
	busyTo := time.Now().Add(-100 * time.Millisecond)
	h.cp.WaitResult("p2", 10*time.Second)
	for _, r := range h.cp.Requests() {
		if r.Route == fakecp.RoutePoll && r.At.After(busyFrom) && r.At.Before(busyTo) {
			t.Fatalf("a poll went out at %v while the only permit was held (%v..%v)", r.At, busyFrom, busyTo)
		}
	}
}

func propsRecording(ch chan *messages.Dispatch) *actor.Props {
	return actor.PropsFromFunc(func(c actor.Context) {
		if d, ok := c.Message().(*messages.Dispatch); ok {
			ch <- d
		}
	})
}

func TestIdleSingleJobExits(t *testing.T) {
	h := newHarness(t, setup{settings: func(s *actors.Settings) { s.Poll.KeepAlive = 0 }})
	h.waitPolls(1)
	h.exec("only", "true")
	if err := h.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	h.cp.WaitResult("only", 5*time.Second)
}

func TestIdleSecondsExits(t *testing.T) {
	start := time.Now()
	h := newHarness(t, setup{settings: func(s *actors.Settings) { s.Poll.KeepAlive = 400 * time.Millisecond }})
	if err := h.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Fatalf("exited after %v", took)
	}
}

func TestSetupFIFOSudoAndRefreshCapabilities(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	out := filepath.Join(h.workdir, "order")
	for i, name := range []string{"one", "two", "three"} {
		s := messages.Setup{Script: "sleep 0.05; echo " + name + " >> " + out, Name: ptr(name)}
		if i == 1 {
			s.Sudo = true
			s.Script = "id -u >> " + out
		}
		if i == 2 {
			s.RefreshCapabilities = true
		}
		h.cp.QueueSetup(s)
	}
	wait.For(t, 10*time.Second, "setups done", func() bool { return h.d.SetupQueue().Idle() && h.d.SetupQueue().LastActivity().After(time.Time{}) })
	b, _ := os.ReadFile(out)
	if string(b) != "one\n0\nthree\n" {
		t.Fatalf("order %q", b)
	}
	h.cp.Wait(10*time.Second, "updated capabilities", func() bool {
		for _, p := range h.cp.Polls() {
			if p.UpdatedCapabilities != nil {
				return true
			}
		}
		return false
	})
	h.exec("later", "true")
	h.cp.WaitResult("later", 10*time.Second)
	n := 0
	for _, p := range h.cp.Polls() {
		if p.UpdatedCapabilities != nil {
			n++
			if !reflect.DeepEqual(p.UpdatedCapabilities.Runners, []string{"process", "echo", "docker"}) {
				t.Fatalf("caps %+v", p.UpdatedCapabilities)
			}
		}
	}
	if n != 1 {
		t.Fatalf("updated_capabilities sent on %d polls, want exactly 1", n)
	}
}

func TestShutdownGraceThenKill(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	// Each job carries a mark of its own: one job may be several processes
	// (bash and its sleep), so counting processes would not count jobs.
	const k = "NYMPH_SHUTDOWN_MARK"
	h.exec("short", "sleep 0.3; echo finished", withEnv(k, t.Name()+"-short"))
	h.exec("long", "sleep 30", withEnv(k, t.Name()+"-long"))
	h.cp.QueueRun(messages.Run{InvocationID: "run-long", Script: ptr("sleep 30"), RunConfig: messages.RunConfig{Env: map[string]string{k: t.Name() + "-run-long"}}})
	running := func(job string) int {
		pids, _ := orphans.WithEnv("/proc", k+"="+t.Name()+"-"+job)
		return len(pids)
	}
	wait.For(t, 10*time.Second, "3 jobs running", func() bool {
		return running("short") > 0 && running("long") > 0 && running("run-long") > 0
	})
	start := time.Now()
	h.d.Shutdown(800 * time.Millisecond)
	if err := h.wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < 800*time.Millisecond || took > 10*time.Second {
		t.Fatalf("shutdown took %v with an 800ms grace", took)
	}
	if r := h.cp.WaitResult("short", 5*time.Second); r.ExitCode != 0 || r.Stdout != "finished\n" {
		t.Fatalf("short job not allowed to finish in the grace: %+v", r)
	}
	r := h.cp.WaitResult("long", 5*time.Second)
	if r.ExitCode != messages.ExitFailed || errOf(r) != messages.CancelledShutdownMessage {
		t.Fatalf("long: %+v %s", r, errOf(r))
	}
	h.cp.Wait(5*time.Second, "ack", func() bool { return len(h.cp.Acks()) == 1 })
	a := h.cp.Acks()[0]
	if a.State != "killed" || a.Error == nil || a.Error.Type != "Cancelled" || a.Error.Message != "daemon shutdown grace expired" {
		t.Fatalf("ack %+v %+v", a, a.Error)
	}
	wait.For(t, 5*time.Second, "no process left", func() bool {
		return running("short")+running("long")+running("run-long") == 0
	})
	polls := len(h.cp.Polls())
	if got := len(h.cp.Polls()); got != polls {
		t.Fatal("still polling after shutdown")
	}
}

func TestStopNowSkipsTheGrace(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	h.exec("long", "sleep 30")
	wait.For(t, 10*time.Second, "running", func() bool { return h.d.Ledger().Active() == 1 })
	h.d.Shutdown(time.Hour)
	h.d.StopNow()
	if err := h.wait(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if r := h.cp.WaitResult("long", 5*time.Second); r.ExitCode != messages.ExitFailed {
		t.Fatalf("%+v", r)
	}
}

// A daemon whose credentials stop working (a revoked key or token) says
// hello again after a 401 on poll, so a refusal ends it with its reason
// instead of leaving it polling forever.
func TestPollUnauthorizedSaysHelloAgain(t *testing.T) {
	var hellos atomic.Int32
	h := newHarness(t, setup{cpOpts: []fakecp.Option{fakecp.WithHello(func(*messages.HelloRequest) messages.HelloResponse {
		if hellos.Add(1) == 1 {
			id := "w1"
			return messages.HelloResponse{WorkerID: &id}
		}
		return messages.HelloResponse{Reject: &messages.Reject{Code: messages.RejectEnrollTokenRequired, Message: "key revoked"}}
	})}, noStart: true})
	h.cp.Fail(fakecp.RoutePoll, 1, http.StatusUnauthorized)
	if err := h.d.Start(); err != nil {
		t.Fatal(err)
	}
	err := h.wait(20 * time.Second)
	var rej *actors.RejectError
	if !errors.As(err, &rej) || rej.Code != messages.RejectEnrollTokenRequired {
		t.Fatalf("err = %v, want the second hello's reject", err)
	}
	if n := hellos.Load(); n != 2 {
		t.Fatalf("hellos = %d, want 2", n)
	}
}

// A Terminated naming a child that is alive (a stale or forged notice) does
// not make the root drop it: the work that child serves still runs, and no
// second setup actor is started beside it.
func TestStaleTerminatedKeepsTheLiveChild(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	live := h.d.Child(actors.SetupName)
	h.d.System().Root.Send(h.d.PID(), &actor.Terminated{Who: live})
	out := filepath.Join(h.workdir, "ran")
	h.cp.QueueSetup(messages.Setup{Script: "echo yes > " + out, Name: ptr("after")})
	wait.For(t, 15*time.Second, "the setup ran", func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "yes\n"
	})
	if now := h.d.Child(actors.SetupName); now == nil || now.Id != live.Id {
		t.Fatalf("setup actor %v replaced by %v", live, now)
	}
}

// Each setup that runs to its end is reported as a setup.finished event of
// its command: the exit code, the duration and the output tail, a failure
// as well as a success.
func TestSetupOutcomesReported(t *testing.T) {
	h := newHarness(t, setup{})
	h.waitPolls(1)
	failing := h.cp.QueueSetup(messages.Setup{Script: "echo preparing; echo 'no such package' >&2; exit 9", Name: ptr("deps")})
	fine := h.cp.QueueSetup(messages.Setup{Script: "echo fine"})
	outcomes := map[string]messages.SetupOutcome{}
	h.cp.Wait(20*time.Second, "both setup outcomes", func() bool {
		for _, e := range h.cp.Events() {
			var o messages.SetupOutcome
			if e.Kind == messages.EventSetupFinished && messages.Unmarshal(e.Data, &o) == nil {
				if e.WorkerID != "w-fake" || e.TS == 0 {
					t.Fatalf("setup event %+v", e)
				}
				outcomes[e.InvocationID] = o
			}
		}
		return len(outcomes) == 2
	})
	f := outcomes[failing]
	if f.State != messages.StateFailed || f.ExitCode != 9 || f.Name != "deps" ||
		!strings.Contains(f.OutputTail, "preparing") || !strings.Contains(f.OutputTail, "no such package") {
		t.Fatalf("failing setup: %+v", f)
	}
	if o := outcomes[fine]; o.State != messages.StateSucceeded || o.ExitCode != 0 || o.Name != "setup" || o.OutputTail != "fine\n" || o.Error != nil {
		t.Fatalf("good setup: %+v", o)
	}
}
