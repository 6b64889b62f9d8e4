package cli

import (
	"bytes"
	"strings"
	"testing"

	"nymph/lakeshore/operatorapi"
)

// `invocations show` prints at most its cap, even of a page whose one
// piece is larger, and says so; a page that fits is printed whole.
func TestPrintOutputCaps(t *testing.T) {
	inv := operatorapi.Invocation{ID: "inv1"}
	big := operatorapi.InvocationLogs{Events: []operatorapi.LogEvent{
		{Seq: 1, Stream: "stdout", Data: []byte(strings.Repeat("z", showOutputCap+500))},
	}}
	var out bytes.Buffer
	printOutput(&out, inv, &big)
	if n := strings.Count(out.String(), "z"); n != showOutputCap {
		t.Fatalf("%d bytes of output printed, want the %d of the cap", n, showOutputCap)
	}
	if !strings.Contains(out.String(), "… output capped at 64 KiB; see `lakeshore invocations logs inv1`") {
		t.Fatalf("no note:\n%s", out.String()[len(out.String())-200:])
	}
	out.Reset()
	small := operatorapi.InvocationLogs{Events: []operatorapi.LogEvent{
		{Seq: 1, Stream: "stdout", Data: []byte("one\n")}, {Seq: 3, Stream: "stderr", Data: []byte("two\n"), Dropped: 70},
	}}
	printOutput(&out, inv, &small)
	if want := "output:\n  one\n  [70 bytes of output lost here: the daemon could not post them in time]\n  two\n"; out.String() != want {
		t.Fatalf("printed %q, want %q", out.String(), want)
	}
	// No output streamed: the tail the daemon reported on its polls.
	out.Reset()
	printOutput(&out, operatorapi.Invocation{StdoutTail: "tail\n"}, &operatorapi.InvocationLogs{})
	if out.String() != "output (tail):\n  tail\n" {
		t.Fatalf("fallback %q", out.String())
	}
}
