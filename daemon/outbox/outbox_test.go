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
