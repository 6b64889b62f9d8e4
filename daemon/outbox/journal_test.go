package outbox_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/daemon/outbox"
	"nymph/daemon/uplink"
	"nymph/messages"
	"nymph/test/wait"
)

// recordingCP accepts every post and keeps the decoded exec results and
// acks, for tests that look at what was posted, and how often.
type recordingCP struct {
	mu      sync.Mutex
	refuse  bool // answer 503 to everything
	results map[string][]messages.ExecResult
	acks    []messages.Ack
}

func newRecordingCP(t *testing.T) (*recordingCP, *uplink.Client) {
	t.Helper()
	c := &recordingCP{results: map[string][]messages.ExecResult{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.refuse {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		switch {
		case r.URL.Path == uplink.PathAck:
			var a messages.Ack
			if err := messages.Unmarshal(body.Bytes(), &a); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			c.acks = append(c.acks, a)
		case strings.HasPrefix(r.URL.Path, "/v1/daemon/exec/"):
			id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/daemon/exec/"), "/result")
			var res messages.ExecResult
			if err := messages.Unmarshal(body.Bytes(), &res); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			c.results[id] = append(c.results[id], res)
		}
	}))
	t.Cleanup(srv.Close)
	client, err := uplink.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, client
}

// downClient is a client of a control plane that answers 503 to
// everything, for an outbox that plays a process about to die. Its own
// server, not a refusing phase of the one the next process posts to: a
// post the dead outbox abandoned may still reach its server after the
// outbox closed, and must not count as the next process's.
func downClient(t *testing.T) *uplink.Client {
	t.Helper()
	c, client := newRecordingCP(t)
	c.setRefuse(true)
	return client
}

func (c *recordingCP) setRefuse(v bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refuse = v
}

func (c *recordingCP) posted() (map[string][]messages.ExecResult, []messages.Ack) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := map[string][]messages.ExecResult{}
	for k, v := range c.results {
		res[k] = append([]messages.ExecResult(nil), v...)
	}
	return res, append([]messages.Ack(nil), c.acks...)
}

// syncLog is a log sink tests read while the outbox writes.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// openJobs lists the ids of the jobs the journal on disk holds open.
func openJobs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := outbox.ReadJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Kind+":"+e.ID)
	}
	return ids
}

func open(t *testing.T, dir string, client *uplink.Client, log zerolog.Logger) *outbox.Outbox {
	t.Helper()
	o, err := outbox.Open(dir, client, log, outbox.WithBackoff(time.Millisecond, 4*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// closeNow stops o like a daemon killed mid-way: what is not posted yet
// stays on disk.
func closeNow(o *outbox.Outbox) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = o.Close(ctx)
}

// An entry is on disk when Begin returns, and gone once the job's outcome
// is posted.
func TestJournalEntryLastsFromBeginToStoredOutcome(t *testing.T) {
	c, client := newRecordingCP(t)
	dir := t.TempDir()
	o := open(t, dir, client, zerolog.Nop())
	if err := o.Begin(outbox.JobExec, "e1", "cmd-1"); err != nil {
		t.Fatal(err)
	}
	if err := o.Begin(outbox.JobRun, "r1", "cmd-2"); err != nil {
		t.Fatal(err)
	}
	if got := openJobs(t, dir); strings.Join(got, " ") != "exec:e1 run:r1" {
		t.Fatalf("journal holds %v, want both jobs", got)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 4}); err != nil {
		t.Fatal(err)
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := openJobs(t, dir); strings.Join(got, " ") != "run:r1" {
		t.Fatalf("journal holds %v after the exec's result, want the run alone", got)
	}
	if err := o.Ack(&messages.Ack{InvocationID: "r1", State: messages.StateSucceeded}); err != nil {
		t.Fatal(err)
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := openJobs(t, dir); len(got) != 0 {
		t.Fatalf("journal holds %v after both outcomes", got)
	}
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	results, acks := c.posted()
	if len(results["e1"]) != 1 || results["e1"][0].ExitCode != 4 || len(acks) != 1 || acks[0].State != messages.StateSucceeded {
		t.Fatalf("posted %+v %+v", results, acks)
	}
	if err := o.Begin("setup", "s1", ""); err == nil {
		t.Fatal("a job kind the journal does not know was accepted")
	}
}

// A process that died while jobs ran leaves their entries; the next one
// reports each exactly once, as interrupted by a restart.
func TestRecoverReportsInterruptedJobsOnce(t *testing.T) {
	c, client := newRecordingCP(t)
	dir := t.TempDir()
	dead := open(t, dir, client, zerolog.Nop())
	for _, j := range []struct{ kind, id string }{{outbox.JobExec, "e1"}, {outbox.JobRun, "r1"}, {outbox.JobExec, "done"}} {
		if err := dead.Begin(j.kind, j.id, "cmd-"+j.id); err != nil {
			t.Fatal(err)
		}
	}
	// One job finished before the crash.
	if err := dead.ExecResult("done", &messages.ExecResult{ExitCode: 0, Stdout: "ok"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the finished job's result to be posted and dropped", func() bool {
		r, _ := c.posted()
		return len(r["done"]) == 1 && len(files(t, dir)) == 0
	})
	closeNow(dead)

	next := open(t, dir, client, zerolog.Nop())
	got, err := next.Recover()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, e := range got {
		kinds[e.ID] = e.Kind + " " + e.CommandID
	}
	if len(got) != 2 || kinds["e1"] != "exec cmd-e1" || kinds["r1"] != "run cmd-r1" {
		t.Fatalf("recovered %+v, want e1 and r1 with their commands", got)
	}
	if err := next.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	results, acks := c.posted()
	if r := results["e1"]; len(r) != 1 || r[0].ExitCode != messages.ExitFailed || r[0].Error == nil || !strings.Contains(*r[0].Error, "restarted") {
		t.Fatalf("exec e1 reported %+v", r)
	}
	if len(acks) != 1 || acks[0].InvocationID != "r1" || acks[0].State != messages.StateFailed || acks[0].Error == nil ||
		acks[0].Error.Type != messages.ErrorTypeDaemonRestarted || !strings.Contains(acks[0].Error.Message, "restarted") {
		t.Fatalf("acks %+v", acks)
	}
	if len(results["done"]) != 1 {
		t.Fatalf("the finished exec was reported again: %+v", results["done"])
	}
	if got := openJobs(t, dir); len(got) != 0 {
		t.Fatalf("journal holds %v after recovery", got)
	}
	// And once only: a third start finds nothing to report.
	third := open(t, dir, client, zerolog.Nop())
	if again, err := third.Recover(); err != nil || len(again) != 0 {
		t.Fatalf("second recovery: %+v %v", again, err)
	}
	_ = third.Close(context.Background())
	if results, acks := c.posted(); len(results["e1"]) != 1 || len(acks) != 1 {
		t.Fatalf("reported twice: %+v %+v", results, acks)
	}
}

// A crash after the outcome was stored but before the entry went: the
// stored outcome is posted, not "unknown".
func TestRecoverPrefersAStoredOutcome(t *testing.T) {
	c, client := newRecordingCP(t)
	dir := t.TempDir()
	dead := open(t, dir, downClient(t), zerolog.Nop())
	if err := dead.Begin(outbox.JobExec, "e2", "cmd"); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, outbox.JournalFile)
	begun, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if err := dead.ExecResult("e2", &messages.ExecResult{ExitCode: 7, Stdout: "real"}); err != nil {
		t.Fatal(err)
	}
	closeNow(dead)
	// The log as a crash just before the end record leaves it.
	if err := os.WriteFile(log, begun, 0o600); err != nil {
		t.Fatal(err)
	}
	next := open(t, dir, client, zerolog.Nop())
	got, err := next.Recover()
	if err != nil || len(got) != 0 {
		t.Fatalf("recovered %+v %v, want nothing (the outcome is stored)", got, err)
	}
	if err := next.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	results, _ := c.posted()
	if r := results["e2"]; len(r) != 1 || r[0].ExitCode != 7 || r[0].Stdout != "real" {
		t.Fatalf("posted %+v, want the stored result once", r)
	}
	if got := openJobs(t, dir); len(got) != 0 {
		t.Fatalf("journal holds %v", got)
	}
}

// Stored results that are truncated or garbled (a crash mid-write, a full
// disk) are set aside under a name that says so, logged with their name,
// and keep neither the outbox from opening nor the good ones from being
// posted.
func TestCorruptResultsAreSetAside(t *testing.T) {
	c, client := newRecordingCP(t)
	dir := t.TempDir()
	dead := open(t, dir, downClient(t), zerolog.Nop())
	if err := dead.ExecResult("good", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	closeNow(dead)
	bad := map[string][]byte{
		filepath.Join(dir, "garbage.msgpack"):          []byte("\xc1\xc1 not msgpack"),
		filepath.Join(dir, "empty.msgpack"):            {},
		filepath.Join(dir, "no-key.msgpack"):           mustMarshal(t, map[string]any{"path": "/v1/daemon/ack"}),
		filepath.Join(dir, "truncated-result.msgpack"): mustMarshal(t, map[string]any{"key": "exec:z", "path": "/v1/daemon/exec/z/result", "body": []byte{0x81}})[:10],
	}
	for p, b := range bad {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	log := &syncLog{}
	next, err := outbox.Open(dir, client, zerolog.New(log))
	if err != nil {
		t.Fatalf("open with corrupt files: %v", err)
	}
	if err := next.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for p := range bad {
		expectSetAside(t, p, log.String())
	}
	if results, _ := c.posted(); len(results["good"]) != 1 || results["good"][0].ExitCode != 3 || len(results) != 1 {
		t.Fatalf("posted %+v, want the good result alone", results)
	}
	// Set aside, they are not read again.
	log2 := &syncLog{}
	again, err := outbox.Open(dir, client, zerolog.New(log2))
	if err != nil {
		t.Fatal(err)
	}
	_ = again.Close(context.Background())
	if strings.Contains(log2.String(), "corrupt") {
		t.Fatalf("set-aside files read again:\n%s", log2.String())
	}
}

// A journal torn at its end (a crash mid-append) or garbled in the middle
// is logged by name and set aside; the jobs before the damage are still
// reported, and the next start finds a clean journal.
func TestCorruptJournalIsSetAside(t *testing.T) {
	for name, damage := range map[string]func([]byte) []byte{
		"torn tail":            func(b []byte) []byte { return append(b, 0, 0, 0, 40, 1, 2, 3, 4, 0x85) },
		"torn header":          func(b []byte) []byte { return append(b, 0, 0) },
		"flipped byte":         func(b []byte) []byte { b = append(b, b...); b[len(b)-3] ^= 0xff; return b },
		"garbage length":       func(b []byte) []byte { return append(b, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0) },
		"not a journal at all": func([]byte) []byte { return []byte("hello, I am not a journal\n") },
	} {
		t.Run(name, func(t *testing.T) {
			c, client := newRecordingCP(t)
			dir := t.TempDir()
			dead := open(t, dir, client, zerolog.Nop())
			if err := dead.Begin(outbox.JobRun, "r-good", "cmd"); err != nil {
				t.Fatal(err)
			}
			closeNow(dead)
			path := filepath.Join(dir, outbox.JournalFile)
			whole, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, damage(whole), 0o600); err != nil {
				t.Fatal(err)
			}
			wantGood := name != "not a journal at all"
			if _, err := outbox.ReadJournal(dir); err == nil {
				t.Fatal("ReadJournal did not see the damage")
			}
			log := &syncLog{}
			next, err := outbox.Open(dir, client, zerolog.New(log))
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			got, err := next.Recover()
			if err != nil {
				t.Fatalf("recover: %v", err)
			}
			if wantGood && (len(got) != 1 || got[0].ID != "r-good") || !wantGood && len(got) != 0 {
				t.Fatalf("recovered %+v", got)
			}
			if err := next.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			expectSetAside(t, path, log.String())
			if _, acks := c.posted(); wantGood && len(acks) != 1 {
				t.Fatalf("acks %+v, want the good job's", acks)
			}
			// The journal is clean again.
			if got, err := outbox.ReadJournal(dir); err != nil || len(got) != 0 {
				t.Fatalf("journal after recovery: %+v %v", got, err)
			}
		})
	}
}

// expectSetAside checks that p was renamed to p.corrupt-<unix> and that
// log names both.
func expectSetAside(t *testing.T, p, log string) {
	t.Helper()
	if aside, _ := filepath.Glob(p + ".corrupt-*"); len(aside) != 1 {
		t.Errorf("%s not set aside (found %v)", p, aside)
	}
	if !strings.Contains(log, `"file":"`+p+`"`) || !strings.Contains(log, `"moved_to":"`+p+`.corrupt-`) {
		t.Errorf("%s not named in the log:\n%s", p, log)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Flush waits for what is pending, and says so when it cannot be posted
// in time.
func TestFlushWaitsForPendingPosts(t *testing.T) {
	c, client := newRecordingCP(t)
	c.setRefuse(true)
	o := open(t, t.TempDir(), client, zerolog.Nop())
	defer closeNow(o)
	if err := o.Flush(context.Background()); err != nil {
		t.Fatalf("flush of an empty outbox: %v", err)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := o.Flush(ctx); err == nil || !strings.Contains(err.Error(), "1 result(s) not posted yet") {
		t.Fatalf("flush while refused: %v", err)
	}
	c.setRefuse(false)
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if results, _ := c.posted(); len(results["e1"]) != 1 {
		t.Fatalf("posted %+v", results)
	}
	// Pending again after idle: a later flush waits for the new one.
	if err := o.ExecResult("e2", &messages.ExecResult{}); err != nil {
		t.Fatal(err)
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if results, _ := c.posted(); len(results["e2"]) != 1 {
		t.Fatalf("posted %+v", results)
	}
}

// BenchmarkJournalledJob is what the journal adds to each job: the entry
// written (fsynced) before the spawn and removed once the outcome is
// stored. Compare with BenchmarkUnjournalledJob, the outcome alone.
func BenchmarkJournalledJob(b *testing.B) { benchJob(b, true) }

// BenchmarkUnjournalledJob stores and posts an outcome with no journal
// entry.
func BenchmarkUnjournalledJob(b *testing.B) { benchJob(b, false) }

func benchJob(b *testing.B, journal bool) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	b.Cleanup(srv.Close)
	client, err := uplink.New(srv.URL)
	if err != nil {
		b.Fatal(err)
	}
	o, err := outbox.Open(b.TempDir(), client, zerolog.Nop())
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close(context.Background())
	res := &messages.ExecResult{Stdout: "ok\n"}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := "e" + strconv.Itoa(i)
		if journal {
			if err := o.Begin(outbox.JobExec, id, "c"); err != nil {
				b.Fatal(err)
			}
		}
		if err := o.ExecResult(id, res); err != nil {
			b.Fatal(err)
		}
	}
	if err := o.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// The log is emptied once no job is open and it has grown, never while a
// job is open.
func TestJournalIsEmptiedWhenIdle(t *testing.T) {
	_, client := newRecordingCP(t)
	dir := t.TempDir()
	o := open(t, dir, client, zerolog.Nop())
	defer closeNow(o)
	size := func() int64 {
		st, err := os.Stat(filepath.Join(dir, outbox.JournalFile))
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	if err := o.Begin(outbox.JobRun, "long", "c"); err != nil {
		t.Fatal(err)
	}
	for i := 0; size() < 80<<10; i++ {
		id := "e" + strconv.Itoa(i)
		if err := o.Begin(outbox.JobExec, id, "c"); err != nil {
			t.Fatal(err)
		}
		if err := o.ExecResult(id, &messages.ExecResult{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := openJobs(t, dir); strings.Join(got, " ") != "run:long" {
		t.Fatalf("journal holds %v, want the long run alone", got)
	}
	if err := o.Ack(&messages.Ack{InvocationID: "long", State: messages.StateSucceeded}); err != nil {
		t.Fatal(err)
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := size(); n != 0 {
		t.Fatalf("journal is %d bytes once idle, want emptied", n)
	}
	if err := o.Begin(outbox.JobExec, "next", "c"); err != nil {
		t.Fatal(err)
	}
	if got := openJobs(t, dir); strings.Join(got, " ") != "exec:next" {
		t.Fatalf("journal after emptying holds %v", got)
	}
}
