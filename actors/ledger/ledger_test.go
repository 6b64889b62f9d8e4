package ledger_test

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/actors/ledger"
)

func TestLifecycleAndExactlyOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	l := ledger.New(func() time.Time { return now })
	if !l.Accept(ledger.Exec, "e1", "body") || l.Accept(ledger.Exec, "e1", "again") {
		t.Fatal("accept")
	}
	if !l.Accept(ledger.Run, "e1", "same id, other kind") {
		t.Fatal("kinds must not collide")
	}
	if got := l.Unclaimed(ledger.Exec); len(got) != 1 || got[0].Body != "body" {
		t.Fatalf("unclaimed %v", got)
	}
	if _, ok := l.Claim(ledger.Exec, "e1"); !ok {
		t.Fatal("first claim")
	}
	if _, ok := l.Claim(ledger.Exec, "e1"); ok {
		t.Fatal("second claim must fail")
	}
	if len(l.Unclaimed(ledger.Exec)) != 0 || l.Active() != 2 || l.Active(ledger.Exec) != 1 {
		t.Fatal("counts")
	}
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.Complete(ledger.Exec, "e1") {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || l.Reported() != 1 || l.Active(ledger.Exec) != 0 {
		t.Fatalf("wins=%d reported=%d", wins.Load(), l.Reported())
	}
	if l.Accept(ledger.Exec, "e1", "replay") {
		t.Fatal("a finished id must not be accepted again")
	}
}

func TestRunningListsClaimedRunsWithTail(t *testing.T) {
	l := ledger.New(nil)
	l.Accept(ledger.Run, "r1", nil)
	l.Accept(ledger.Run, "r2", nil)
	l.Accept(ledger.Exec, "x", nil)
	e, _ := l.Claim(ledger.Run, "r1")
	_, _ = e.Tail.Write([]byte("hello "))
	_, _ = e.Tail.Write([]byte("world"))
	got := l.Running()
	if len(got) != 1 || got[0].InvocationID != "r1" || got[0].State != "running" || got[0].StdoutTail != "hello world" || got[0].ExitCode != nil {
		t.Fatalf("running = %+v", got)
	}
	if empty := ledger.New(nil).Running(); empty == nil {
		t.Fatal("Running must never be nil")
	}
}

func TestTailKeepsLast4KiBValidUTF8(t *testing.T) {
	var tl ledger.Tail
	_, _ = tl.Write([]byte(strings.Repeat("a", 5000)))
	_, _ = tl.Write([]byte("é"))
	s := tl.String()
	if len(s) > ledger.TailSize || !strings.HasSuffix(s, "é") {
		t.Fatalf("len %d suffix %q", len(s), s[len(s)-3:])
	}
	var cut ledger.Tail
	_, _ = cut.Write([]byte(strings.Repeat("é", 3000))) // 6000 bytes; the cut lands inside a character
	s = cut.String()
	if strings.ContainsRune(s, '\uFFFD') || len(s) > ledger.TailSize {
		t.Fatalf("bad tail start: %q", s[:4])
	}
}

func TestRefusedJobIsActiveUntilReported(t *testing.T) {
	l := ledger.New(nil)
	if !l.Accept(ledger.Exec, "mine", "body") || !l.Refuse(ledger.Exec, "other", "body", "single-job: has its job") {
		t.Fatal("accept and refuse")
	}
	if l.Refuse(ledger.Exec, "other", "body", "again") || l.Accept(ledger.Exec, "other", "body") || l.Refuse(ledger.Exec, "mine", "body", "x") {
		t.Fatal("a job already known is neither refused nor accepted again")
	}
	got := l.Unclaimed(ledger.Exec)
	if len(got) != 2 || got[0].Refused != "" || got[1].ID != "other" || got[1].Refused != "single-job: has its job" {
		t.Fatalf("unclaimed %+v", got)
	}
	// It holds its place until its refusal is reported, exactly once.
	if l.Active() != 2 {
		t.Fatalf("active %d", l.Active())
	}
	if _, ok := l.Claim(ledger.Exec, "other"); !ok || !l.Complete(ledger.Exec, "other") || l.Complete(ledger.Exec, "other") {
		t.Fatal("report the refusal once")
	}
	if l.Active() != 1 || l.Refuse(ledger.Exec, "other", "body", "x") {
		t.Fatal("after the report")
	}
}

// A job a previous process ran (and the start-up reported) is refused when
// its command comes again, and does not count as this process's work.
func TestMarkDoneRefusesARedelivery(t *testing.T) {
	l := ledger.New(nil)
	l.MarkDone(ledger.Exec, "e1")
	l.MarkDone(ledger.Exec, "e1")
	if l.AcceptCommand(ledger.Exec, "e1", "cmd-again", "body") {
		t.Fatal("a job reported at start was accepted again")
	}
	if !l.AcceptCommand(ledger.Run, "e1", "cmd-run", "other kind") {
		t.Fatal("kinds must not collide")
	}
	if got := l.Unclaimed(ledger.Run); len(got) != 1 || got[0].CommandID != "cmd-run" {
		t.Fatalf("unclaimed %+v, want the run with its command id", got)
	}
	if l.Reported() != 0 || l.Active() != 1 {
		t.Fatalf("reported %d active %d", l.Reported(), l.Active())
	}
	// An active job is left alone.
	l.MarkDone(ledger.Run, "e1")
	if l.Active(ledger.Run) != 1 || !l.Complete(ledger.Run, "e1") {
		t.Fatal("MarkDone ended an active job")
	}
}
