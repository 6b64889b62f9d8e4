package e2e

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" driver, to edit a control plane's file under it

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/realparts"
	"nymph/test/wait"
)

// The tests of a control plane facing the internet's slow and greedy
// clients, and of what no payload key may reach.

// openFDs counts the open descriptors of a process.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("fds of %d: %v", pid, err)
	}
	return len(ents)
}

// trickled is what became of one slow request.
type trickled struct {
	held   time.Duration // from its headers to the server's close
	status string        // the status line the server sent, if any
	open   bool          // still open when the client gave up
}

// trickle sends the head of a request announcing a large body, then one
// byte of it every 2 s, until the server closes the connection or giveUp
// passes. headersSent is told once the head is out.
func trickle(addr, head string, giveUp time.Duration, headersSent chan<- struct{}) trickled {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		headersSent <- struct{}{}
		return trickled{status: "dial: " + err.Error()}
	}
	defer c.Close()
	start := time.Now()
	_, err = io.WriteString(c, head)
	headersSent <- struct{}{}
	if err != nil {
		return trickled{status: "write: " + err.Error()}
	}
	closed := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(c)
		line, _, _ := strings.Cut(string(b), "\r\n")
		closed <- line
	}()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	stop := time.After(giveUp)
	for {
		select {
		case line := <-closed:
			return trickled{held: time.Since(start), status: line}
		case <-stop:
			return trickled{held: time.Since(start), open: true}
		case <-tick.C:
			_, _ = c.Write([]byte{0x81})
		}
	}
}

// Hole 9 of the internet-facing issue: 500 result posts trickling a byte
// every 2 s were all still open after 34 s. With a 2 s body grace they
// are all cut, each answered 408, and the exec they posted to is still
// running with nothing of theirs stored; its daemon's result is taken
// when it comes.
func TestEdgeSlowResultPostsAreCutOff(t *testing.T) {
	t.Parallel()
	const (
		posts = 500
		grace = 2 * time.Second
		// giveUp is how long a post waits for its cut before it counts as
		// held: ten times the grace, so only a missing deadline reaches it.
		giveUp = 10 * grace
	)
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{
		"--body-grace", grace.String(), "--max-conns-per-ip", strconv.Itoa(posts + 100),
	}})
	d := cp.StartDaemon(t, harness.DaemonOptions{})
	acc := startExec(t, cp, d.Label, "sleep 600")
	var ex operatorapi.Exec
	wait.For(t, 30*time.Second, "the exec to run on the daemon", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &ex) == nil && ex.State == operatorapi.ExecRunning
	})
	head := "POST /v1/daemon/exec/" + acc.ExecID + "/result HTTP/1.1\r\nHost: cp\r\n" +
		"Authorization: Bearer " + cp.DaemonToken + "\r\nContent-Type: " + messages.ContentType + "\r\n" +
		"Content-Length: 1000000\r\n\r\n"

	baseline := openFDs(t, cp.PID())
	sent := make(chan struct{}, posts)
	results := make(chan trickled, posts)
	for range posts {
		go func() { results <- trickle(cp.Addr, head, giveUp, sent) }()
	}
	for range posts {
		<-sent
	}
	peak := 0
	wait.For(t, giveUp, "the control plane to hold every slow post", func() bool {
		peak = max(peak, openFDs(t, cp.PID()))
		return peak >= baseline+posts
	})

	var held []time.Duration
	statuses := map[string]int{}
	for range posts {
		r := <-results
		if r.open {
			t.Errorf("a post was still open after %v", r.held.Round(time.Millisecond))
			continue
		}
		held = append(held, r.held)
		statuses[r.status]++
	}
	if statuses["HTTP/1.1 408 Request Timeout"] != posts {
		t.Fatalf("answers to the %d slow posts: %v", posts, statuses)
	}
	after := 0
	wait.For(t, 30*time.Second, "the control plane to let go of the slow posts' connections", func() bool {
		after = openFDs(t, cp.PID())
		return after < baseline+10
	})
	sort.Slice(held, func(i, j int) bool { return held[i] < held[j] })
	t.Logf("%d posts trickling a byte every 2s, body grace %v: held min %v, median %v, max %v; control plane fds %d before, %d holding them, %d after",
		posts, grace, held[0].Round(time.Millisecond), held[len(held)/2].Round(time.Millisecond), held[len(held)-1].Round(time.Millisecond),
		baseline, peak, after)

	if err := cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &ex); err != nil {
		t.Fatal(err)
	}
	if ex.State != operatorapi.ExecRunning || ex.Result != nil || len(ex.Output) != 0 {
		t.Fatalf("the exec after the slow posts: %+v", ex)
	}
	// Its real result, when the daemon ends it, is taken.
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+acc.WorkerID+"/cancel", operatorapi.CancelRequest{ExecID: acc.ExecID}, nil); err != nil {
		t.Fatalf("cancel the exec: %v", err)
	}
	wait.For(t, 30*time.Second, "the daemon's own result", func() bool {
		return cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &ex) == nil && ex.Result != nil
	})
}

// get sends GET path on c and returns the status, or 0 if the server
// closed the connection without an answer.
func getOn(t *testing.T, c net.Conn, br *bufio.Reader, path string) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: cp\r\n\r\n"); err != nil {
		return 0
	}
	r, err := http.ReadResponse(br, nil)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("GET %s: no answer and no close in 30s", path)
	case err != nil:
		return 0
	}
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	return r.StatusCode
}

func dialFrom(t *testing.T, local, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", local, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// With --max-conns-per-ip 3, a fourth connection from one address is
// closed unanswered while another address still connects, and a slot
// comes back when a connection closes.
func TestEdgeConnectionCapPerAddress(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--max-conns-per-ip", "3"}})
	// 127.0.0.3: the harness's own clients connect from 127.0.0.1.
	var held []net.Conn
	for i := range 3 {
		c, br := dialFrom(t, "127.0.0.3", cp.Addr)
		if code := getOn(t, c, br, "/healthz"); code != http.StatusOK {
			t.Fatalf("connection %d: %d", i+1, code)
		}
		held = append(held, c)
	}
	c, br := dialFrom(t, "127.0.0.3", cp.Addr)
	if code := getOn(t, c, br, "/healthz"); code != 0 {
		t.Fatalf("the fourth connection from 127.0.0.3 was answered %d", code)
	}
	c, br = dialFrom(t, "127.0.0.2", cp.Addr)
	if code := getOn(t, c, br, "/healthz"); code != http.StatusOK {
		t.Fatalf("a connection from 127.0.0.2: %d", code)
	}
	wait.For(t, 30*time.Second, "the refusal in the log", func() bool {
		return strings.Contains(cp.Log(), "connections refused") && strings.Contains(cp.Log(), "127.0.0.3")
	})
	held[0].Close()
	wait.For(t, 30*time.Second, "a slot for 127.0.0.3 again", func() bool {
		c, br := dialFrom(t, "127.0.0.3", cp.Addr)
		defer c.Close()
		return getOn(t, c, br, "/healthz") == http.StatusOK
	})
}

// presignAndPut stores data under key through the operator's presign and
// a PUT, as `lakeshore run` uploads large args.
func presignAndPut(t *testing.T, cp *harness.ControlPlane, key string, data []byte) {
	t.Helper()
	var ps messages.PresignResponse
	if err := cp.PostJSON("/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "key": key, "size": len(data)}, &ps); err != nil {
		t.Fatalf("presign put %s: %v", key, err)
	}
	req, _ := http.NewRequest(http.MethodPut, ps.URL, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/octet-stream")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	if b, _ := io.ReadAll(r.Body); r.StatusCode != http.StatusOK {
		t.Fatalf("put %s: %d %s", key, r.StatusCode, b)
	}
}

// download reads key back and returns its bytes and announced checksum.
func download(t *testing.T, cp *harness.ControlPlane, key string) ([]byte, string) {
	t.Helper()
	var ps messages.PresignResponse
	if err := cp.PostJSON("/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": key}, &ps); err != nil {
		t.Fatalf("presign get %s: %v", key, err)
	}
	r, err := http.Get(ps.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("get %s: %d %s", key, r.StatusCode, b)
	}
	return b, r.Header.Get("X-Checksum-Sha256")
}

// Hole 6: key "victim.meta.json" was the sidecar of key "victim". Stored
// now, with content that is metadata claiming other bytes, it changes
// nothing of victim's size or sha256.
func TestEdgePayloadKeyClash(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	victim := []byte("the victim's args")
	presignAndPut(t, cp, "victim", victim)
	forged := []byte(`{"size":6,"sha256":"` + sha([]byte("forged")) + `","content_type":"text/plain","created_at":"2020-01-01T00:00:00Z"}`)
	presignAndPut(t, cp, "victim.meta.json", forged)
	if b, sum := download(t, cp, "victim"); !bytes.Equal(b, victim) || sum != sha(victim) {
		t.Fatalf("victim after the clash: %q sha256 %s, want %q %s", b, sum, victim, sha(victim))
	}
	if b, sum := download(t, cp, "victim.meta.json"); !bytes.Equal(b, forged) || sum != sha(forged) {
		t.Fatalf("victim.meta.json: %q %s", b, sum)
	}
}

// A data dir written with metadata beside the blobs is moved to the new
// layout when `lakeshore serve` starts, a clash the old layout suffered
// included.
func TestEdgeLegacyPayloadDirMigrated(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	ns := filepath.Join(dataDir, "payloads", "default")
	if err := os.MkdirAll(ns, 0o700); err != nil {
		t.Fatal(err)
	}
	meta := func(b []byte) []byte {
		m, _ := json.Marshal(map[string]any{"size": len(b), "sha256": sha(b), "content_type": "text/plain", "created_at": time.Now().UTC()})
		return m
	}
	args := []byte("args stored before the upgrade")
	victim := []byte("args whose sidecar the clash overwrote")
	clash := []byte(`{"size":1,"sha256":"` + strings.Repeat("0", 64) + `"}`)
	for name, data := range map[string][]byte{
		"args": args, "args.meta.json": meta(args),
		"victim": victim, "victim.meta.json": clash, "victim.meta.json.meta.json": meta(clash),
	} {
		if err := os.WriteFile(filepath.Join(ns, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cp := harness.StartControlPlane(t, harness.CPOptions{DataDir: dataDir})
	for key, want := range map[string][]byte{"args": args, "victim": victim, "victim.meta.json": clash} {
		if b, sum := download(t, cp, key); !bytes.Equal(b, want) || sum != sha(want) {
			t.Fatalf("%s after the migration: %q %s", key, b, sum)
		}
	}
	for _, gone := range []string{"args.meta.json", "victim.meta.json.meta.json"} {
		if _, err := os.Stat(filepath.Join(ns, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the legacy sidecar %s is still there: %v", gone, err)
		}
	}
	if !strings.Contains(cp.Log(), "payload without matching metadata") || !strings.Contains(cp.Log(), `"key":"victim"`) {
		t.Fatalf("the clashed blob was not reported:\n%s", cp.Log())
	}
}

func probe(t *testing.T, cp *harness.ControlPlane, path string) (int, string) {
	t.Helper()
	r, err := http.Get(cp.URL + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// /healthz and /readyz need no credentials; /readyz is 503 naming the
// migration a file lacks, and then ready again once it is back.
func TestEdgeHealthAndReadiness(t *testing.T) {
	t.Parallel()
	cp := harness.StartControlPlane(t, harness.CPOptions{})
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := probe(t, cp, path); code != http.StatusOK || body != "ok\n" {
			t.Fatalf("%s: %d %q", path, code, body)
		}
	}
	db, err := sql.Open("sqlite", filepath.Join(cp.DataDir, "lakeshore.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	if err := db.QueryRow(`DELETE FROM schema_migrations WHERE version = (SELECT MAX(version) FROM schema_migrations) RETURNING version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(t, cp, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, fmt.Sprintf("%04d_", v)) {
		t.Fatalf("readyz with migration %d unrecorded: %d %q", v, code, body)
	}
	if code, _ := probe(t, cp, "/healthz"); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, v); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(t, cp, "/readyz"); code != http.StatusOK {
		t.Fatalf("readyz with the migration back: %d %q", code, body)
	}
}

// On PostgreSQL, a database that goes away makes /readyz 503 while
// /healthz still answers.
func TestEdgeNotReadyWithoutItsDatabase(t *testing.T) {
	t.Parallel()
	pg := realparts.StartPostgres(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--store", pg.DSN}})
	if code, body := probe(t, cp, "/readyz"); code != http.StatusOK {
		t.Fatalf("readyz: %d %q", code, body)
	}
	pidFile, err := os.ReadFile(filepath.Join(pg.DataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(pidFile), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("postmaster.pid: %q", pidFile)
	}
	// A fast shutdown: PostgreSQL ends every session and exits.
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "readyz to say the store is gone", func() bool {
		code, body := probe(t, cp, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "not answering")
	})
	if code, _ := probe(t, cp, "/healthz"); code != http.StatusOK {
		t.Fatalf("healthz without the database: %d", code)
	}
}
