package outbox_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
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

// cp is a tiny control plane that fails the first `fail` posts per path with
// `status`, then accepts, and reports each accepted body on a channel.
type cp struct {
	mu       sync.Mutex
	fail     map[string]int
	status   int
	accepted chan string
	attempts map[string]int
}

func newCP(t *testing.T, status int) (*cp, *uplink.Client) {
	c := &cp{fail: map[string]int{}, status: status, accepted: make(chan string, 100), attempts: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.attempts[r.URL.Path]++
		if c.fail[r.URL.Path] > 0 {
			c.fail[r.URL.Path]--
			c.mu.Unlock()
			w.WriteHeader(c.status)
			return
		}
		c.mu.Unlock()
		c.accepted <- r.URL.Path
	}))
	t.Cleanup(srv.Close)
	client, err := uplink.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, client
}

func waitAccepted(t *testing.T, c *cp, path string) {
	t.Helper()
	select {
	case got := <-c.accepted:
		if got != path {
			t.Fatalf("accepted %s, want %s", got, path)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never accepted", path)
	}
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*.msgpack"))
	return m
}

func waitNoFiles(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(files(t, dir)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("files left: %v", files(t, dir))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRetriesUntilAcceptedThenRemovesFile(t *testing.T) {
	c, client := newCP(t, http.StatusServiceUnavailable)
	c.fail["/v1/daemon/ack"] = 2
	dir := t.TempDir()
	o, err := outbox.Open(dir, client, zerolog.Nop(), outbox.WithBackoff(time.Millisecond, 4*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Ack(&messages.Ack{InvocationID: "inv-1", State: messages.StateSucceeded}); err != nil {
		t.Fatal(err)
	}
	waitAccepted(t, c, "/v1/daemon/ack")
	waitNoFiles(t, dir)
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.attempts["/v1/daemon/ack"] != 3 {
		t.Fatalf("attempts = %d", c.attempts["/v1/daemon/ack"])
	}
}

func TestDuplicateKeyPostedOnce(t *testing.T) {
	c, client := newCP(t, 500)
	o, err := outbox.Open(t.TempDir(), client, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	r := &messages.ExecResult{ExitCode: 0}
	_ = o.ExecResult("e1", r)
	_ = o.ExecResult("e1", r)
	waitAccepted(t, c, "/v1/daemon/exec/e1/result")
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-c.accepted:
		t.Fatalf("second post of %s", p)
	default:
	}
}

func TestFinalRefusalDropsTheResult(t *testing.T) {
	c, client := newCP(t, http.StatusNotFound)
	c.fail["/v1/daemon/exec/gone/result"] = 1
	dir := t.TempDir()
	o, _ := outbox.Open(dir, client, zerolog.Nop(), outbox.WithBackoff(time.Millisecond, time.Millisecond))
	_ = o.ExecResult("gone", &messages.ExecResult{})
	waitNoFiles(t, dir)
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.attempts["/v1/daemon/exec/gone/result"] != 1 {
		t.Fatalf("attempts = %d", c.attempts["/v1/daemon/exec/gone/result"])
	}
}

func TestLeftoversSurviveCloseAndArePostedOnReopen(t *testing.T) {
	c, client := newCP(t, http.StatusBadGateway)
	c.fail["/v1/daemon/exec/e9/result"] = 1 << 30
	dir := t.TempDir()
	o, _ := outbox.Open(dir, client, zerolog.Nop(), outbox.WithBackoff(time.Millisecond, 2*time.Millisecond))
	_ = o.ExecResult("e9", &messages.ExecResult{ExitCode: 7, Stdout: "out"})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := o.Close(ctx); err == nil || !strings.Contains(err.Error(), "left on disk") {
		t.Fatalf("close err = %v", err)
	}
	if len(files(t, dir)) != 1 {
		t.Fatalf("files = %v", files(t, dir))
	}
	if err := o.ExecResult("late", &messages.ExecResult{}); err == nil {
		t.Fatal("submit after close accepted")
	}

	c.mu.Lock()
	c.fail["/v1/daemon/exec/e9/result"] = 0
	c.mu.Unlock()
	// a torn temporary file from a crash is cleaned up, not posted
	_ = os.WriteFile(filepath.Join(dir, "x.msgpack.tmp"), []byte{1}, 0o600)
	_ = os.WriteFile(filepath.Join(dir, ".x.msgpack123"), []byte{1}, 0o600)
	o2, err := outbox.Open(dir, client, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	waitAccepted(t, c, "/v1/daemon/exec/e9/result")
	waitNoFiles(t, dir)
	if err := o2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"x.msgpack.tmp", ".x.msgpack123"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Fatalf("tmp file %s left", name)
		}
	}
}

// cancelledFirst fails the first post the way net/http does when another
// request cancelled on the same keep-alive connection takes this one down
// with it: a *url.Error wrapping context.Canceled, while the caller's own
// context is live. Every later post goes to the server.
type cancelledFirst struct {
	outbox.Poster
	failed bool
	mu     sync.Mutex
}

func (p *cancelledFirst) PostEncoded(ctx context.Context, path string, body []byte) error {
	p.mu.Lock()
	first := !p.failed
	p.failed = true
	p.mu.Unlock()
	if first {
		return fmt.Errorf("POST %s: %w", path, &url.Error{Op: "Post", URL: path, Err: context.Canceled})
	}
	return p.Poster.PostEncoded(ctx, path, body)
}

// A post that fails with a cancellation that is not the outbox's own is
// retried, not dropped as a refusal (it was, and the result was lost).
func TestCancelledPostThatIsNotOursIsRetried(t *testing.T) {
	c, client := newCP(t, http.StatusServiceUnavailable)
	dir := t.TempDir()
	o, err := outbox.Open(dir, &cancelledFirst{Poster: client}, zerolog.Nop(), outbox.WithBackoff(time.Millisecond, 4*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 0}); err != nil {
		t.Fatal(err)
	}
	waitAccepted(t, c, "/v1/daemon/exec/e1/result")
	waitNoFiles(t, dir)
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// heldCP holds every post until the test releases it, noting the stored
// result files it finds on disk while the post is held.
type heldCP struct {
	arrived chan struct{}
	release chan struct{}
}

func newHeldCP(t *testing.T) (*heldCP, *uplink.Client) {
	t.Helper()
	c := &heldCP{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.arrived <- struct{}{}
		select {
		case <-c.release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-c.release:
		default:
			close(c.release)
		}
	})
	client, err := uplink.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c, client
}

// A result the control plane accepts within the store grace is never
// written to disk: the post is all it costs.
func TestResultAcceptedAtOnceIsNeverStored(t *testing.T) {
	dir := t.TempDir()
	var onDisk []string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		onDisk = append(onDisk, files(t, dir)...)
	}))
	t.Cleanup(srv.Close)
	client, err := uplink.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	o, err := outbox.Open(dir, client, zerolog.Nop(), outbox.WithStoreAfter(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Begin(outbox.JobExec, "e1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(onDisk) != 0 || len(files(t, dir)) != 0 {
		t.Fatalf("stored while the post was on the way: %v; after: %v", onDisk, files(t, dir))
	}
	if got := openJobs(t, dir); len(got) != 0 {
		t.Fatalf("journal holds %v once the result was accepted", got)
	}
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A post still on the way after the grace has its result stored, and the
// job leaves the journal then; the file goes once the post is accepted.
func TestSlowPostIsStoredAfterTheGrace(t *testing.T) {
	c, client := newHeldCP(t)
	dir := t.TempDir()
	o, err := outbox.Open(dir, client, zerolog.Nop(), outbox.WithStoreAfter(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Begin(outbox.JobExec, "e1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	<-c.arrived
	wait.For(t, 10*time.Second, "the held result to be stored and its journal entry ended", func() bool {
		return len(files(t, dir)) == 1 && len(openJobs(t, dir)) == 0
	})
	close(c.release)
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("files left once accepted: %v", f)
	}
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A first post that fails is stored before it is retried, however long
// the grace: a control plane that is away costs no result.
func TestFailedFirstPostIsStoredAtOnce(t *testing.T) {
	c, client := newCP(t, http.StatusServiceUnavailable)
	c.fail["/v1/daemon/exec/e1/result"] = 1 << 30
	dir := t.TempDir()
	o, err := outbox.Open(dir, client, zerolog.Nop(), outbox.WithStoreAfter(time.Hour), outbox.WithBackoff(time.Millisecond, 2*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.ExecResult("e1", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the refused result to be stored", func() bool { return len(files(t, dir)) == 1 })
	c.mu.Lock()
	c.fail["/v1/daemon/exec/e1/result"] = 0
	c.mu.Unlock()
	waitAccepted(t, c, "/v1/daemon/exec/e1/result")
	if err := o.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := files(t, dir); len(f) != 0 {
		t.Fatalf("files left once accepted: %v", f)
	}
	if err := o.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A daemon that dies while a result is neither accepted nor stored loses
// nothing: the job is still in the journal, and the next start reports it
// interrupted. What such a death leaves is the directory as it is while
// the post is on the way, copied here.
func TestDeathBeforeTheResultIsStoredReportsTheJob(t *testing.T) {
	held, heldClient := newHeldCP(t)
	dir := t.TempDir()
	dying, err := outbox.Open(dir, heldClient, zerolog.Nop(), outbox.WithStoreAfter(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer closeNow(dying)
	if err := dying.Begin(outbox.JobExec, "e1", "c1"); err != nil {
		t.Fatal(err)
	}
	if err := dying.ExecResult("e1", &messages.ExecResult{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	<-held.arrived
	left := t.TempDir()
	if err := os.CopyFS(left, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}

	rec, client := newRecordingCP(t)
	next := open(t, left, client, zerolog.Nop())
	got, err := next.Recover()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "e1" {
		t.Fatalf("recovered %+v, want e1", got)
	}
	if err := next.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, _ := rec.posted(); len(r["e1"]) != 1 || r["e1"][0].ExitCode != messages.ExitFailed {
		t.Fatalf("e1 reported %+v", r["e1"])
	}
}
