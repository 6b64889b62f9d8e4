package procgroup

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// A reader that the scheduler gets to only after the drain ran out (a
// loaded host: the chaos soak saw it) still hands over everything already
// written into the pipe, and returns although the write end is still open,
// as it is when a process that left the group holds it.
func TestStoppedReaderKeepsWhatIsInThePipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	want := "exec-00318\n" + strings.Repeat("x", 3*readSize+17)
	if _, err := w.WriteString(want); err != nil {
		t.Fatal(err)
	}
	if !stopReading(r) {
		t.Fatal("a pipe took no read deadline")
	}
	var got bytes.Buffer
	copyOut(r, &got)
	if got.String() != want {
		t.Fatalf("read %d bytes, want %d", got.Len(), len(want))
	}
}

// Stopped on an empty pipe whose write end stays open, the reader returns.
func TestStoppedReaderOnAnEmptyPipeReturns(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	stopReading(r)
	var got bytes.Buffer
	copyOut(r, &got)
	if got.Len() != 0 {
		t.Fatalf("read %q", got.String())
	}
}
