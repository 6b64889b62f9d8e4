package invocations

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/actors/ledger"
	"nymph/daemon/outbox"
	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/runners"
	"nymph/test/fakecp"
)

// scripted is a runner whose run is a function of the test: it writes to
// the spec's streams what the test wants, when the test wants.
type scripted struct {
	run func(spec runners.Spec)
}

func (s *scripted) Kind() string { return "process" }

func (s *scripted) Run(_ context.Context, spec runners.Spec) (runners.Outcome, error) {
	s.run(spec)
	return runners.Outcome{State: messages.StateSucceeded, Result: []byte("done")}, nil
}

// fast keeps the tests quick: a flush every few milliseconds, quick retries.
var fast = LogSettings{FlushEvery: 5 * time.Millisecond, RetryMin: 5 * time.Millisecond, RetryMax: 20 * time.Millisecond}

func shipFixture(t *testing.T, run func(spec runners.Spec), logs LogSettings) (*fixture, *scripted) {
	t.Helper()
	f := newFixture(t)
	client, err := uplink.New(f.cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	sc := &scripted{run: run}
	f.d.Runners["process"] = sc
	f.d.Events = client
	f.d.Logs = logs
	f.d.WorkerID = func() string { return "w-fake" }
	return f, sc
}

type logEvent struct {
	messages.Event
	data messages.LogData
}

// logEvents decodes the invocation.log events the fake received.
func logEvents(t *testing.T, cp *fakecp.CP) []logEvent {
	t.Helper()
	var out []logEvent
	for _, e := range cp.Events() {
		if e.Kind != messages.EventInvocationLog {
			continue
		}
		le := logEvent{Event: e}
		if err := messages.Unmarshal(e.Data, &le.data); err != nil {
			t.Fatalf("event data: %v", err)
		}
		out = append(out, le)
	}
	return out
}

func streamText(evs []logEvent, stream string) string {
	var b bytes.Buffer
	for _, e := range evs {
		if e.data.Stream == stream {
			b.Write(e.data.Data)
		}
	}
	return b.String()
}

// received reports whether the fake has got s in one stream's output.
func received(t *testing.T, cp *fakecp.CP, stream, s string) func() bool {
	return func() bool { return bytes.Contains([]byte(streamText(logEvents(t, cp), stream)), []byte(s)) }
}

func wantOrdered(t *testing.T, evs []logEvent, id string) {
	t.Helper()
	for i, e := range evs {
		if e.InvocationID != id || e.WorkerID != "w-fake" || e.TS == 0 {
			t.Fatalf("event %d: %+v", i, e.Event)
		}
		if i > 0 && e.data.Seq <= evs[i-1].data.Seq {
			t.Fatalf("seq %d after %d: not in order", e.data.Seq, evs[i-1].data.Seq)
		}
	}
	if len(evs) > 0 && evs[0].data.Seq != 1 {
		t.Fatalf("first seq %d, want 1", evs[0].data.Seq)
	}
}

// Output reaches the control plane while the run goes on, each stream under
// its name, in order, and all of it before the run's ack exists.
func TestRunOutputStreamsWhileRunning(t *testing.T) {
	var f *fixture
	f, _ = shipFixture(t, func(spec runners.Spec) {
		fmt.Fprint(spec.Stdout, "hello\n")
		fmt.Fprint(spec.Stderr, "oops\n")
		// Still running: the first lines are on the control plane already.
		f.cp.Wait(10*time.Second, "the first lines", func() bool {
			return received(t, f.cp, messages.StreamStdout, "hello\n")() && received(t, f.cp, messages.StreamStderr, "oops\n")()
		})
		fmt.Fprint(spec.Stdout, "bye\n")
	}, fast)
	a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i-live"}, &ledger.Tail{})
	if a.State != messages.StateSucceeded {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	evs := logEvents(t, f.cp)
	wantOrdered(t, evs, "i-live")
	if out, errs := streamText(evs, messages.StreamStdout), streamText(evs, messages.StreamStderr); out != "hello\nbye\n" || errs != "oops\n" {
		t.Fatalf("stdout %q, stderr %q", out, errs)
	}
}

// A failed post is retried and loses nothing; the run is not affected.
func TestRunOutputRetriedAfterFailedPosts(t *testing.T) {
	var f *fixture
	f, _ = shipFixture(t, func(spec runners.Spec) {
		fmt.Fprint(spec.Stdout, "first\n")
		f.cp.Wait(10*time.Second, "the first line, after the failures", received(t, f.cp, messages.StreamStdout, "first\n"))
		fmt.Fprint(spec.Stdout, "second\n")
	}, fast)
	f.cp.Fail(fakecp.RouteEvent, 3, http.StatusServiceUnavailable)
	a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i-retry"}, &ledger.Tail{})
	if a.State != messages.StateSucceeded {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	evs := logEvents(t, f.cp)
	wantOrdered(t, evs, "i-retry")
	if got := streamText(evs, messages.StreamStdout); got != "first\nsecond\n" {
		t.Fatalf("stdout %q", got)
	}
	if n := f.cp.Count(fakecp.RouteEvent); n < 3+len(evs) {
		t.Fatalf("%d event requests for %d events after 3 failures", n, len(evs))
	}
}

// A control plane that refuses the output gets no more of it, and the run
// is not affected.
func TestRunOutputStopsWhenRefused(t *testing.T) {
	var f *fixture
	f, _ = shipFixture(t, func(spec runners.Spec) {
		fmt.Fprint(spec.Stdout, "x")
		f.cp.Wait(10*time.Second, "the refused post", func() bool { return f.cp.Count(fakecp.RouteEvent) >= 1 })
		fmt.Fprint(spec.Stdout, "y")
	}, fast)
	f.cp.Fail(fakecp.RouteEvent, 1, http.StatusForbidden)
	a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i-refused"}, &ledger.Tail{})
	if a.State != messages.StateSucceeded {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	if n := f.cp.Count(fakecp.RouteEvent); n != 1 {
		t.Fatalf("%d event posts after a refusal, want the refused one only", n)
	}
}

// A character cut between two reads travels whole.
func TestRunOutputKeepsCharactersWhole(t *testing.T) {
	var f *fixture
	f, _ = shipFixture(t, func(spec runners.Spec) {
		spec.Stdout.Write([]byte("a\xc3"))
		f.cp.Wait(10*time.Second, "the part before the cut", received(t, f.cp, messages.StreamStdout, "a"))
		spec.Stdout.Write([]byte("\xa9b"))
	}, fast)
	f.d.execute(context.Background(), &messages.Run{InvocationID: "i-utf8"}, &ledger.Tail{})
	evs := logEvents(t, f.cp)
	var parts []string
	for _, e := range evs {
		parts = append(parts, string(e.data.Data))
	}
	if len(parts) != 2 || parts[0] != "a" || parts[1] != "éb" {
		t.Fatalf("pieces %q, want [a éb]", parts)
	}
}

// deadURL is a control plane that is not there: connections are refused.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// While the control plane cannot be reached the run holds at most
// MaxBuffered bytes, dropping the oldest; at the end what is left goes to
// the outbox, whose posts say how much was dropped before them.
func TestRunOutputBoundedWhileUnreachable(t *testing.T) {
	const piece, pieces = 1 << 10, 20
	logs := fast
	logs.FlushBytes, logs.MaxPiece, logs.MaxBuffered = piece, piece, 4*piece
	f, _ := shipFixture(t, func(spec runners.Spec) {
		for i := 0; i < pieces; i++ {
			spec.Stdout.Write(bytes.Repeat([]byte{'a' + byte(i)}, piece))
		}
	}, logs)
	dead, err := uplink.New(deadURL(t))
	if err != nil {
		t.Fatal(err)
	}
	f.d.Events = dead
	live, err := uplink.New(f.cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	box, err := outbox.Open(filepath.Join(t.TempDir(), "outbox"), live, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil {
		t.Fatal(err)
	}
	f.d.Leftovers = box

	a := f.d.execute(context.Background(), &messages.Run{InvocationID: "i-bounded"}, &ledger.Tail{})
	if a.State != messages.StateSucceeded {
		t.Fatalf("ack %s %+v", a.State, a.Error)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := box.Close(ctx); err != nil {
		t.Fatal(err)
	}
	evs := logEvents(t, f.cp)
	// The outbox posts side by side: order them by seq as a reader does.
	sort.Slice(evs, func(i, j int) bool { return evs[i].data.Seq < evs[j].data.Seq })
	var got []byte
	var dropped uint64
	for _, e := range evs {
		got = append(got, e.data.Data...)
		dropped += e.data.Dropped
	}
	if len(got) > logs.MaxBuffered || len(got) == 0 {
		t.Fatalf("%d bytes delivered, want at most the %d buffered", len(got), logs.MaxBuffered)
	}
	if int(dropped)+len(got) != piece*pieces {
		t.Fatalf("%d delivered + %d reported dropped, want the %d written", len(got), dropped, piece*pieces)
	}
	// What survived is the newest output (and the oldest piece, when its
	// post was on its way as the buffer overflowed).
	want := bytes.Repeat([]byte{'a' + pieces - 1}, piece)
	if !bytes.HasSuffix(got, want) || dropped == 0 {
		t.Fatalf("delivered ...%q (%d dropped): want the newest output and the loss reported", got[len(got)-16:], dropped)
	}
}

func TestIncompleteTailAndCutPoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"abc", 0}, {"a\xc3", 1}, {"é", 0}, {"a\xe2\x82", 2}, {"€", 0}, {"\xf0\x9f\x98", 3}, {"😀", 0}, {"\xff", 0},
	} {
		if got := incompleteTail([]byte(c.in)); got != c.want {
			t.Errorf("incompleteTail(%q) = %d, want %d", c.in, got, c.want)
		}
	}
	if got := cutPoint([]byte("ab€cd"), 3); got != 2 {
		t.Errorf("cutPoint in the middle of € = %d, want 2", got)
	}
	if got := cutPoint([]byte("abc"), 5); got != 3 {
		t.Errorf("cutPoint past the end = %d", got)
	}
	if got := cutPoint([]byte("\xff\xff\xff\xff\xff"), 2); got != 2 {
		t.Errorf("cutPoint in bytes that are not UTF-8 = %d", got)
	}
}
